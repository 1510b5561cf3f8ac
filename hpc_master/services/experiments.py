"""Experiments: create (validate config and context), list, and the user actions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from hpc_master.admission import load_experiment_config
from hpc_master.db.models import (
    CheckpointModel,
    EventModel,
    ExperimentModel,
    TrialModel,
    TrialRunModel,
    UserModel,
)
from hpc_master.errors import ClientError
from hpc_master.expconf import ExperimentConfig
from hpc_master.masterconf import MasterConfig
from hpc_master.services import access
from hpc_master.services import context as ctx
from hpc_master.services.access import Action, Principal
from hpc_master.services.common import InvalidTransitionError, get_or_404, record_event
from hpc_master.services.lifecycle import (
    call_off_stop,
    live_run_of,
    maybe_finish_experiment,
    set_experiment_state,
    set_trial_state,
)
from hpc_master.services.states import (
    TERMINAL_EXPERIMENT_STATES,
    TERMINAL_TRIAL_STATES,
    ExperimentState,
    TerminationReason,
    TrialState,
)


@dataclass(frozen=True)
class ParsedConfig:
    typed: ExperimentConfig  # the completed config
    config: dict[str, Any]  # as stored: its ``to_dict()``
    warnings: list[str] = field(default_factory=list)


def parse_config(text: str, master: MasterConfig | None = None) -> ParsedConfig:
    """The config as it will be stored: through the one pipeline (`admission.load_experiment_config`):
    strict YAML, the typed model, `master`'s defaults merged and the experiment seed fixed (so the stored config
    alone reproduces the search), and a dry run of the first trial's job against the target pool.

    `master` None (tests, tools): the built-in master defaults and a stand-in pool."""
    checked = load_experiment_config(text, master)
    return ParsedConfig(
        typed=checked.config, config=checked.config.to_dict(), warnings=list(checked.warnings)
    )


def searcher_metric(config: ExperimentConfig | None) -> tuple[str | None, bool]:
    """The searcher's metric (None when the config has no searcher or names none) and whether smaller is
    better (Determined's default, True, when it does not say)."""
    searcher = config.searcher if config is not None else None
    if searcher is None:
        return None, True
    return searcher.metric, searcher.smaller_is_better


def create_experiment(
    session: Session,
    principal: Principal,
    *,
    config_text: str,
    model_definition: list[dict[str, Any]],
    activate: bool,
    parent_id: int | None = None,
    validate_only: bool = False,
    master: MasterConfig | None = None,
) -> tuple[ExperimentModel | None, ParsedConfig]:
    """`master`: the master's config, whose defaults and pools the config is completed and dry-run against
    (see `parse_config`)."""
    principal.require_user()
    parsed = parse_config(config_text, master)
    files = ctx.parse_model_definition(model_definition)
    archive = ctx.pack_context(files)
    if parent_id is not None:
        get_or_404(session, ExperimentModel, parent_id, "experiment")
    if validate_only:
        return None, parsed
    typed = parsed.typed
    pool = typed.resources.resource_pool
    experiment = ExperimentModel(
        owner_id=principal.user_id,
        name=typed.name or "",
        description=typed.description or "",
        state=ExperimentState.ACTIVE if activate else ExperimentState.PAUSED,
        config_text=config_text,
        config=parsed.config,
        context_archive=archive,
        parent_id=parent_id,
        resource_pool=str(pool) if pool else "default",
    )
    session.add(experiment)
    session.flush()
    record_event(
        session, "experiment", experiment.id, None, experiment.state, f"created by {principal.username}"
    )
    return experiment, parsed


def normalise_states(states: Sequence[str]) -> list[str]:
    out = []
    for s in states:
        bare = s.removeprefix("STATE_").upper()
        if bare not in ExperimentState.__members__:
            raise ClientError(f"unknown experiment state {s!r}", field="states")
        out.append(bare)
    return out


def get_experiment(session: Session, experiment_id: int) -> tuple[ExperimentModel, str]:
    experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
    owner = get_or_404(session, UserModel, experiment.owner_id, "user")
    return experiment, owner.username


def owner_id_of(session: Session, experiment_id: int) -> int:
    """The experiment's owner: whose secrets its config and its trials' hyperparameters hold (``redact.shown``)."""
    return get_or_404(session, ExperimentModel, experiment_id, "experiment").owner_id


def trial_counts(session: Session, experiment_id: int) -> dict[str, int]:
    rows = session.execute(
        select(TrialModel.state, func.count())
        .where(TrialModel.experiment_id == experiment_id)
        .group_by(TrialModel.state)
    ).all()
    return {state: count for state, count in rows}


# ---------------------------------------------------------------- user actions


def pause_experiment(session: Session, principal: Principal, experiment_id: int) -> ExperimentModel:
    experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
    access.experiment(principal, experiment, Action.CHANGE)
    set_experiment_state(session, experiment, ExperimentState.PAUSED, f"paused by {principal.username}")
    for trial in _trials(session, experiment_id, {TrialState.ACTIVE}):
        trial.pause_reason = TerminationReason.PAUSED_BY_USER
        set_trial_state(session, trial, TrialState.PAUSED, f"experiment paused by {principal.username}")
        run = live_run_of(session, trial.id)
        if run is not None:
            run.preempt_requested = True
    return experiment


def activate_experiment(session: Session, principal: Principal, experiment_id: int) -> ExperimentModel:
    experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
    access.experiment(principal, experiment, Action.CHANGE)
    set_experiment_state(session, experiment, ExperimentState.ACTIVE, f"activated by {principal.username}")
    for trial in _trials(session, experiment_id, {TrialState.PAUSED}):
        if trial.pause_reason in (None, TerminationReason.PAUSED_BY_USER):
            trial.pause_reason = None
            set_trial_state(
                session, trial, TrialState.ACTIVE, f"experiment activated by {principal.username}"
            )
            run = live_run_of(session, trial.id)
            if run is not None:  # still stopping for the pause: go on in place if its job was not told yet
                call_off_stop(session, run)
    return experiment


def _stop_experiment(
    session: Session, principal: Principal, experiment_id: int, *, kill: bool
) -> ExperimentModel:
    experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
    access.experiment(principal, experiment, Action.CHANGE)
    if experiment.state in TERMINAL_EXPERIMENT_STATES:
        return experiment
    exp_state = ExperimentState.STOPPING_KILLED if kill else ExperimentState.STOPPING_CANCELED
    verb = "killed" if kill else "canceled"
    set_experiment_state(session, experiment, exp_state, f"{verb} by {principal.username}")
    for trial in _trials(session, experiment_id, None):
        stop_trial(session, trial, kill=kill, reason=f"experiment {verb} by {principal.username}")
    session.flush()
    maybe_finish_experiment(session, experiment)
    return experiment


def stop_trial(session: Session, trial: TrialModel, *, kill: bool, reason: str) -> None:
    """Cancel (checkpoint and exit) or kill (scancel) a trial; a trial with no live job ends at once."""
    if trial.state in TERMINAL_TRIAL_STATES:
        return
    run = live_run_of(session, trial.id)
    if run is None:
        set_trial_state(session, trial, TrialState.CANCELED, reason)
        return
    target = TrialState.STOPPING_KILLED if kill else TrialState.STOPPING_CANCELED
    if trial.state == TrialState.STOPPING_KILLED:
        return
    set_trial_state(session, trial, target, reason)
    run.preempt_requested = True


def cancel_experiment(session: Session, principal: Principal, experiment_id: int) -> ExperimentModel:
    return _stop_experiment(session, principal, experiment_id, kill=False)


def kill_experiment(session: Session, principal: Principal, experiment_id: int) -> ExperimentModel:
    return _stop_experiment(session, principal, experiment_id, kill=True)


def kill_trial(session: Session, principal: Principal, trial_id: int) -> TrialModel:
    trial = get_or_404(session, TrialModel, trial_id, "trial")
    experiment = get_or_404(session, ExperimentModel, trial.experiment_id, "experiment")
    access.experiment(principal, experiment, Action.CHANGE)
    stop_trial(session, trial, kill=True, reason=f"killed by {principal.username}")
    return trial


def set_archived(
    session: Session, principal: Principal, experiment_id: int, archived: bool
) -> ExperimentModel:
    experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
    access.experiment(principal, experiment, Action.CHANGE)
    if archived and experiment.state not in TERMINAL_EXPERIMENT_STATES:
        raise InvalidTransitionError(
            f"experiment {experiment_id} is {experiment.state}; only finished ones archive"
        )
    experiment.archived = archived
    return experiment


def begin_delete(session: Session, principal: Principal, experiment_id: int) -> list[str]:
    """Mark a finished experiment DELETING; returns its checkpoint uuids (the caller removes the files)."""
    experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
    access.experiment(principal, experiment, Action.CHANGE)
    set_experiment_state(session, experiment, ExperimentState.DELETING, f"deleted by {principal.username}")
    return list(
        session.scalars(
            select(CheckpointModel.uuid)
            .join(TrialModel, TrialModel.id == CheckpointModel.trial_id)
            .where(TrialModel.experiment_id == experiment_id)
        )
    )


def finish_delete(session: Session, experiment_id: int) -> None:
    trial_ids = select(TrialModel.id).where(TrialModel.experiment_id == experiment_id)
    run_ids = select(TrialRunModel.id).where(TrialRunModel.trial_id.in_(trial_ids))
    session.execute(
        delete(EventModel).where(EventModel.entity == "trial_run", EventModel.entity_id.in_(run_ids))
    )
    session.execute(
        delete(EventModel).where(EventModel.entity == "trial", EventModel.entity_id.in_(trial_ids))
    )
    session.execute(
        delete(EventModel).where(EventModel.entity == "experiment", EventModel.entity_id == experiment_id)
    )
    session.execute(
        update(ExperimentModel).where(ExperimentModel.parent_id == experiment_id).values(parent_id=None)
    )
    experiment = session.get(ExperimentModel, experiment_id)
    if experiment is not None:
        session.delete(experiment)


def _trials(session: Session, experiment_id: int, states: set[TrialState] | None) -> list[TrialModel]:
    stmt = select(TrialModel).where(TrialModel.experiment_id == experiment_id)
    if states is not None:
        stmt = stmt.where(TrialModel.state.in_(states))
    return list(session.scalars(stmt.order_by(TrialModel.id)))
