"""Drive each active experiment's search method: events from the DB in, actions applied to the DB.

All of an experiment's searcher work happens in ONE short transaction: the events it consumes (validation
completions, closed trials), the trials and operations its actions create, and the new searcher snapshot. So
a master killed at any point either did all of it or none of it, and after a restart the same search goes on
from the stored snapshot (RNG included). No Slurm call and no HTTP request happens here.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, or_, select
from sqlalchemy.orm import Session

from hpc_master.db.models import ExperimentModel, SearcherOpCompletionModel, TrialModel, TrialRunModel
from hpc_master.expconf import parse_experiment_config
from hpc_master.lifecycle.configs import DerivedConfigs
from hpc_master.services import lifecycle as svc
from hpc_master.services.states import (
    LIVE_RUN_STATES,
    TERMINAL_TRIAL_STATES,
    ExperimentState,
    TerminationReason,
    TrialState,
)
from searcher import (
    Action,
    Create,
    ExitedReason,
    Pause,
    Resume,
    SearchMethod,
    Shutdown,
    Stop,
    ValidateAfter,
    make_search_method,
)

log = logging.getLogger(__name__)
SNAPSHOT_FORMAT = 1


@dataclass
class _Hosted:
    method: SearchMethod
    closed: set[int] = field(default_factory=set)
    shut_down: bool = False

    def snapshot(self) -> dict[str, Any]:
        return {
            "format": SNAPSHOT_FORMAT,
            "method": self.method.snapshot(),
            "closed": sorted(self.closed),
            "shutDown": self.shut_down,
        }


@dataclass(frozen=True)
class SearchInputs:
    """What a search method is made of: the parts of the config the searcher reads."""

    searcher: dict[str, Any] | None
    hyperparameters: dict[str, Any]
    seed: int | None


SEARCH_SECTIONS = ("searcher", "hyperparameters", "reproducibility")


def search_inputs(config: Mapping[str, Any]) -> SearchInputs:
    """Parse only the sections the search needs: a stored config that a later release validates more
    strictly elsewhere (an entrypoint, say) still runs its search, and its trials fail with the reason."""
    cfg = parse_experiment_config({k: config[k] for k in SEARCH_SECTIONS if k in config})
    seed = cfg.reproducibility.experiment_seed if cfg.reproducibility else None
    return SearchInputs(cfg.searcher_dict(), cfg.hyperparameters_dict(), seed)


def new_search_inputs_cache() -> DerivedConfigs[SearchInputs]:
    return DerivedConfigs(search_inputs)


def _new_method(experiment: ExperimentModel, inputs: DerivedConfigs[SearchInputs] | None) -> SearchMethod:
    got = inputs.get(experiment) if inputs is not None else search_inputs(experiment.config)
    if got.searcher is None:
        raise ValueError(f"experiment {experiment.id} has no searcher section")
    seed = got.seed if got.seed is not None else experiment.id
    # Copies: the cached inputs outlive this method, whatever it does with its arguments.
    return make_search_method(copy.deepcopy(got.searcher), copy.deepcopy(got.hyperparameters), seed=seed)


def _snapshot(experiment: ExperimentModel) -> dict[str, Any] | None:
    snap = experiment.searcher_snapshot
    return snap if snap and snap.get("format") == SNAPSHOT_FORMAT else None


def load(
    experiment: ExperimentModel, inputs: DerivedConfigs[SearchInputs] | None = None
) -> tuple[_Hosted, list[Action]]:
    """The experiment's search method, restored from its snapshot, or new with its initial actions.

    `inputs`: the loop's cache of parsed searcher sections (without it the config is decoded here)."""
    method = _new_method(experiment, inputs)
    snap = _snapshot(experiment)
    if snap is not None:
        method.restore(snap["method"])
        return _Hosted(method, set(snap.get("closed", [])), bool(snap.get("shutDown"))), []
    return _Hosted(method), list(method.initial_actions())


def _exited_reason(trial: TrialModel) -> ExitedReason | None:
    if trial.early_exit_reason == TerminationReason.EARLY_EXIT_INVALID_HP or (
        trial.early_exit_reason or ""
    ).endswith("INVALID_HP"):
        return ExitedReason.INVALID_HP
    if trial.state == TrialState.ERROR:
        return ExitedReason.ERRORED
    if trial.state == TrialState.CANCELED:
        return ExitedReason.USER_CANCELED
    return None


def drive(
    session: Session, experiment: ExperimentModel, inputs: DerivedConfigs[SearchInputs] | None = None
) -> int:
    """Feed the experiment's new events to its search method and apply the resulting actions.

    Returns the number of actions applied. The caller commits; on any exception it must roll back.

    With no event for it (the usual tick) the search method is not even built: the snapshot holds its whole
    state, so neither the config nor the method is needed to know that nothing changes. `inputs` is the
    loop's cache of parsed searcher sections; pass the experiment loaded with `LEAN_EXPERIMENT` so that its
    config is read only when the cache misses.
    """
    snap = _snapshot(experiment)
    if snap is not None and snap.get("shutDown"):
        return 0
    closed: set[int] = set(snap.get("closed", [])) if snap is not None else set()

    completions = svc.take_searcher_op_completions(session, experiment.id)
    trials = _load_trials(session, experiment.id, closed)
    _complete_stopped_paused(session, trials)
    exited = _newly_ended(trials, closed)
    validated = [c for c in completions if c.metric is not None]
    if snap is not None and not exited and not validated:
        return 0

    hosted, actions = load(experiment, inputs)
    actions += _feed_events(hosted, validated, exited)
    applied = _apply(session, experiment, hosted, actions, trials)
    _store_state(experiment, hosted)
    return applied


def _complete_stopped_paused(session: Session, trials: _Trials) -> None:
    """A trial the searcher stopped while it was paused (or whose paused job ended after the Stop) is done."""
    for trial in trials.values():
        if trial.searcher_done and trial.state == TrialState.PAUSED and trials.live_run(trial.id) is None:
            svc.set_trial_state(session, trial, TrialState.COMPLETED, "stopped by the searcher")


def _newly_ended(trials: _Trials, closed: set[int]) -> list[TrialModel]:
    """The ended trials the search method has not been told of, by id."""
    return [
        t
        for t in sorted(trials.values(), key=lambda t: t.id)
        if t.state in TERMINAL_TRIAL_STATES and t.id not in closed
    ]


def _feed_events(
    hosted: _Hosted, validated: list[SearcherOpCompletionModel], exited: list[TrialModel]
) -> list[Action]:
    """Tell the search method of the validations completed, then of the trials that exited (now closed);
    the actions it answers with."""
    actions: list[Action] = []
    for c in validated:
        assert c.metric is not None
        actions += hosted.method.on_validation_completed(c.trial_id, c.metric, int(c.length))
    for trial in exited:
        reason = _exited_reason(trial)
        if reason is not None:
            actions += hosted.method.on_trial_exited_early(trial.id, reason)
        actions += hosted.method.on_trial_closed(trial.id)
        hosted.closed.add(trial.id)
    return actions


def _store_state(experiment: ExperimentModel, hosted: _Hosted) -> None:
    """Write the search's progress and snapshot to the experiment row, each only when it changed."""
    progress = hosted.method.progress()
    if experiment.progress != progress:
        experiment.progress = progress
    snapshot = hosted.snapshot()
    if snapshot != experiment.searcher_snapshot:
        # The experiment row's version column guards this write: if another writer changed the experiment
        # since it was loaded, the flush raises StaleDataError and the caller rolls everything back.
        experiment.searcher_snapshot = snapshot


class _Trials(dict[int, TrialModel]):
    """The trials a pass needs, by id; any other one an action names is loaded when asked for. With the
    experiment's live runs, read once per pass (a pass submits and ends no job)."""

    def __init__(self, session: Session, rows: Iterable[TrialModel], live: Iterable[TrialRunModel]) -> None:
        super().__init__((t.id, t) for t in rows)
        self._session = session
        self._live = {run.trial_id: run for run in live}  # ordered by run number: the latest wins

    def live_run(self, trial_id: int) -> TrialRunModel | None:
        return self._live.get(trial_id)

    def __missing__(self, trial_id: int) -> TrialModel:
        trial = self._session.get(TrialModel, trial_id)
        if trial is None:
            raise KeyError(trial_id)
        self[trial_id] = trial
        return trial


def _load_trials(session: Session, experiment_id: int, closed: set[int]) -> _Trials:
    """Open trials, and ended ones the search method has not been told about: not the (many) closed ones.

    An experiment of thousands of short trials used to load every one of them on every pass, while the
    harnesses of the running ones waited for the database.
    """
    of_experiment = TrialModel.experiment_id == experiment_id
    ended = session.scalars(
        select(TrialModel.id).where(of_experiment, TrialModel.state.in_(TERMINAL_TRIAL_STATES))
    )
    unseen = [trial_id for trial_id in ended if trial_id not in closed]
    needed: ColumnElement[bool] = TrialModel.state.not_in(TERMINAL_TRIAL_STATES)
    if unseen:
        needed = or_(needed, TrialModel.id.in_(unseen))
    live = session.scalars(
        select(TrialRunModel)
        .join(TrialModel, TrialModel.id == TrialRunModel.trial_id)
        .where(of_experiment, TrialRunModel.state.in_(LIVE_RUN_STATES))
        .order_by(TrialRunModel.trial_id, TrialRunModel.run_number)
    )
    return _Trials(session, session.scalars(select(TrialModel).where(of_experiment, needed)), live)


def _apply(
    session: Session,
    experiment: ExperimentModel,
    hosted: _Hosted,
    actions: list[Action],
    trials: _Trials,
) -> int:
    queue = list(actions)
    applied = 0
    while queue:
        action = queue.pop(0)
        applied += 1
        if isinstance(action, Create):
            trial = svc.create_trial(
                session,
                experiment.id,
                action.request_id,
                dict(action.hparams),
                seed=action.trial_seed,
                proposal=action.proposal,
            )
            trials[trial.id] = trial
            queue += hosted.method.on_trial_created(action.request_id, trial.id)
        elif isinstance(action, ValidateAfter):
            svc.set_searcher_operation(session, action.trial_id, action.length)
        elif isinstance(action, Pause):
            _pause(session, trials[action.trial_id], trials.live_run(action.trial_id))
        elif isinstance(action, Resume):
            _resume(session, trials[action.trial_id], trials.live_run(action.trial_id))
        elif isinstance(action, Stop):
            _stop(session, trials[action.trial_id], trials.live_run(action.trial_id))
        elif isinstance(action, Shutdown):
            hosted.shut_down = True
            _shutdown(session, experiment, action)
    return applied


def _pause(session: Session, trial: TrialModel, run: TrialRunModel | None) -> None:
    """Checkpoint and free the slots; the trial stays open and may be resumed if later promoted."""
    if trial.state != TrialState.ACTIVE:
        return
    trial.pause_reason = TerminationReason.PAUSED_BY_SEARCHER
    if run is None:
        svc.set_trial_state(session, trial, TrialState.PAUSED, "paused by the searcher (not promoted yet)")
    else:
        run.preempt_requested = True  # PAUSED when the job has checkpointed and exited


def _resume(session: Session, trial: TrialModel, run: TrialRunModel | None) -> None:
    """Promoted: a paused trial runs again; a pause still pending (its job has not exited yet) is called off."""
    if trial.state == TrialState.PAUSED:
        svc.set_trial_state(session, trial, TrialState.ACTIVE, "resumed by the searcher (promoted)")
    elif trial.state == TrialState.ACTIVE and trial.pause_reason == TerminationReason.PAUSED_BY_SEARCHER:
        trial.pause_reason = None
        if run is not None:
            # If its job was already told to stop, it exits and is resubmitted at once (PAUSE_CALLED_OFF).
            svc.call_off_stop(session, run)


def _stop(session: Session, trial: TrialModel, run: TrialRunModel | None) -> None:
    svc.set_searcher_operation(session, trial.id, None, done=True)
    if trial.state in TERMINAL_TRIAL_STATES:
        return
    if trial.pause_reason == TerminationReason.PAUSED_BY_SEARCHER:
        trial.pause_reason = None  # a Stop overrides an earlier Pause
    if run is None:
        svc.set_trial_state(session, trial, TrialState.COMPLETED, "stopped by the searcher")
    else:
        run.preempt_requested = True  # Core API scripts learn it from should_preempt(); old ones from ops


def _shutdown(session: Session, experiment: ExperimentModel, action: Shutdown) -> None:
    if experiment.state != ExperimentState.ACTIVE:
        return
    if action.failure:
        target = ExperimentState.STOPPING_ERROR
    elif action.cancel:
        target = ExperimentState.STOPPING_CANCELED
    else:
        target = ExperimentState.STOPPING_COMPLETED
    svc.set_experiment_state(session, experiment, target, "the searcher is done")
    session.flush()
    svc.maybe_finish_experiment(session, experiment)
