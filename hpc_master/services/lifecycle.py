"""The seam for the lifecycle loop: every state change goes through these functions.

The loop (searcher actions → Slurm → job states) follows load → act → apply: read what it needs in one short
session, call Slurm with no session open, then apply the result in a second short session with one of these
functions. ORM updates of experiments, trials and runs are guarded by their ``version`` column
(SQLAlchemy raises ``StaleDataError`` when a concurrent writer got there first); functions taking an
``expected_version`` return False instead.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, event, func, inspect, or_, select
from sqlalchemy.orm import Session, UOWTransaction

from hpc_master.db.models import (
    CheckpointGCRequestModel,
    CheckpointModel,
    ExperimentModel,
    LogFileModel,
    MetricModel,
    SearcherOpCompletionModel,
    TrialModel,
    TrialRunModel,
    UserModel,
    utcnow,
)
from hpc_master.services import notify
from hpc_master.services.common import InvalidTransitionError, get_or_404, guarded_update, record_event
from hpc_master.services.states import (
    EARLY_EXIT_REASONS,
    EXPERIMENT_STOPPING_TRIAL_END,
    LIVE_RUN_STATES,
    RUN_TRANSITIONS,
    STOPPING_EXPERIMENT_END,
    STOPPING_TRIAL_END,
    TERMINAL_EXPERIMENT_STATES,
    TERMINAL_TRIAL_STATES,
    TERMINATION_TABLE,
    ExperimentState,
    Next,
    RunState,
    TerminationReason,
    TrialState,
    can_transition_experiment,
    can_transition_trial,
    next_step,
)
from hpc_master.services.stored_config import StoredConfigError, experiment_config

# ---------------------------------------------------------------- the two choke points


def set_experiment_state(
    session: Session, experiment: ExperimentModel, new_state: ExperimentState, reason: str
) -> bool:
    """Move an experiment to `new_state` (validated against the table) and record an event.

    Returns False when it is already there; raises InvalidTransitionError when the table forbids the move.
    """
    old = ExperimentState(experiment.state)
    if old == new_state:
        return False
    if not can_transition_experiment(old, new_state):
        raise InvalidTransitionError(f"experiment {experiment.id} cannot go from {old} to {new_state}")
    experiment.state = new_state
    if new_state in TERMINAL_EXPERIMENT_STATES:
        experiment.end_time = utcnow()
        request_checkpoint_gc(session, experiment.id)
    record_event(session, "experiment", experiment.id, old, new_state, reason)
    return True


def set_trial_state(session: Session, trial: TrialModel, new_state: TrialState, reason: str) -> bool:
    """Move a trial to `new_state` (validated against the table) and record an event."""
    old = TrialState(trial.state)
    if old == new_state:
        return False
    if not can_transition_trial(old, new_state):
        raise InvalidTransitionError(f"trial {trial.id} cannot go from {old} to {new_state}")
    trial.state = new_state
    if new_state != TrialState.PAUSED:
        trial.pause_reason = None
    if new_state in TERMINAL_TRIAL_STATES:
        trial.end_time = utcnow()
        trial.searcher_op_length = None
    if new_state in GC_TRIAL_STATES:
        request_checkpoint_gc(session, trial.experiment_id)
    record_event(session, "trial", trial.id, old, new_state, reason)
    return True


def set_run_state(session: Session, run: TrialRunModel, new_state: RunState, reason: str) -> bool:
    old = RunState(run.state)
    if old == new_state:
        return False
    if new_state not in RUN_TRANSITIONS[old]:
        raise InvalidTransitionError(f"trial run {run.id} cannot go from {old} to {new_state}")
    run.state = new_state
    if new_state == RunState.RUNNING:
        run.start_time = utcnow()
    if new_state not in LIVE_RUN_STATES:
        run.end_time = utcnow()
        trial = session.get(TrialModel, run.trial_id)
        if trial is not None and trial.state in GC_TRIAL_STATES:  # a paused trial's last job ended
            request_checkpoint_gc(session, trial.experiment_id)
    record_event(session, "trial_run", run.id, old, new_state, reason)
    return True


GC_TRIAL_STATES = frozenset({TrialState.PAUSED, *TERMINAL_TRIAL_STATES})
"""Trial states in which its checkpoints may be collected, once no job of it runs."""


def request_checkpoint_gc(session: Session, experiment_id: int) -> None:
    """Ask the lifecycle loop's checkpoint collector (``services.checkpoints.gc``) to apply the experiment's
    GC policy again: a trial paused or ended, a job of a paused trial ended, the experiment ended, or its
    policy changed. Requests are coalesced by experiment."""
    session.add(CheckpointGCRequestModel(experiment_id=experiment_id))


# ---------------------------------------------------------------- trials and runs


def create_trial(
    session: Session,
    experiment_id: int,
    request_id: str,
    hparams: dict[str, Any],
    seed: int = 0,
    proposal: str | None = None,
) -> TrialModel:
    """Create a trial for a searcher ``Create`` action; idempotent on (experiment, request_id)."""
    existing = session.scalar(
        select(TrialModel).where(
            TrialModel.experiment_id == experiment_id, TrialModel.request_id == request_id
        )
    )
    if existing is not None:
        return existing
    experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
    if experiment.state in TERMINAL_EXPERIMENT_STATES:
        raise InvalidTransitionError(f"experiment {experiment_id} is {experiment.state}")
    trial = TrialModel(
        experiment_id=experiment_id,
        request_id=request_id,
        hparams=hparams,
        proposal=proposal,
        seed=seed,
        state=TrialState.ACTIVE,
    )
    session.add(trial)
    session.flush()
    record_event(session, "trial", trial.id, None, TrialState.ACTIVE, f"created by searcher ({request_id})")
    return trial


def allocate_trial_run(session: Session, trial_id: int, log_path: str | None = None) -> TrialRunModel:
    """Reserve the next run number before submitting (the job script needs ``DET_TRIAL_RUN_ID``).

    The run starts PENDING with no Slurm job id; call :func:`start_trial_run` once ``sbatch`` answered, or
    :func:`finish_trial_run` with ``SUBMIT_FAILED`` if it did not.
    """
    trial = get_or_404(session, TrialModel, trial_id, "trial")
    if trial.state != TrialState.ACTIVE:
        raise InvalidTransitionError(f"trial {trial_id} is {trial.state}; only ACTIVE trials get a new run")
    live = session.scalar(
        select(func.count()).where(
            TrialRunModel.trial_id == trial_id, TrialRunModel.state.in_(LIVE_RUN_STATES)
        )
    )
    if live:
        raise InvalidTransitionError(f"trial {trial_id} already has a live run")
    trial.run_id += 1
    if trial.run_id > 1:
        rollback_to_checkpoint(session, trial)
    run = TrialRunModel(trial_id=trial_id, run_number=trial.run_id, state=RunState.PENDING)
    session.add(run)
    session.flush()
    if log_path:
        session.add(LogFileModel(trial_run_id=run.id, path=log_path))
    record_event(session, "trial_run", run.id, None, RunState.PENDING, "allocated")
    return run


def rollback_to_checkpoint(session: Session, trial: TrialModel) -> int:
    """Forget metrics reported after the checkpoint a new run resumes from (a failed run may have got past
    it); the new run reports those steps again. Returns how many metric reports were removed."""
    steps = 0
    if trial.latest_checkpoint:
        checkpoint = session.get(CheckpointModel, trial.latest_checkpoint)
        steps = int(checkpoint.steps_completed) if checkpoint is not None else 0
    result: Any = session.execute(
        delete(MetricModel).where(MetricModel.trial_id == trial.id, MetricModel.steps_completed > steps)
    )
    removed = int(result.rowcount or 0)
    if removed:
        record_event(
            session, "trial", trial.id, trial.state, trial.state,
            f"rolled back {removed} metric reports after step {steps}: resuming from the latest checkpoint",
        )  # fmt: skip
    trial.steps_completed = steps
    return removed


def start_trial_run(
    session: Session, run_id: int, slurm_job_id: str, *, log_path: str | None = None
) -> TrialRunModel:
    """Record the Slurm job id of a freshly submitted run (still PENDING until Slurm starts it)."""
    run = get_or_404(session, TrialRunModel, run_id, "trial run")
    run.slurm_job_id = slurm_job_id
    if log_path:
        session.add(LogFileModel(trial_run_id=run.id, path=log_path))
    return run


def mark_run_running(session: Session, run_id: int, node_list: str | None = None) -> bool:
    run = get_or_404(session, TrialRunModel, run_id, "trial run")
    if node_list:
        run.node_list = node_list
    if run.state == RunState.PENDING:
        return set_run_state(session, run, RunState.RUNNING, "Slurm started the job")
    return False


def add_log_file(session: Session, run_id: int, path: str, stream: str = "stdout") -> None:
    session.add(LogFileModel(trial_run_id=run_id, path=path, stream=stream))


@dataclass(frozen=True)
class RunOutcome:
    trial_state: TrialState
    resubmit: bool
    """True: the loop should allocate and submit a new run (from ``latest_checkpoint``) now."""
    message: str


def _max_restarts(experiment: ExperimentModel) -> int:
    try:
        return experiment_config(experiment).max_restarts
    except StoredConfigError:  # a config this master refuses cannot run again: its trials get no restarts
        return 0


def finish_trial_run(
    session: Session, run_id: int, reason: TerminationReason, message: str | None = None
) -> RunOutcome:
    """Apply the end of a trial run: run state, trial state (by the termination table), restarts, events.

    Idempotent: finishing an already finished run changes nothing and returns resubmit=False.
    """
    run = get_or_404(session, TrialRunModel, run_id, "trial run")
    trial = get_or_404(session, TrialModel, run.trial_id, "trial")
    if run.state not in LIVE_RUN_STATES:
        return RunOutcome(TrialState(trial.state), False, run.exit_message or "")
    if trial.early_exit_reason and reason in (
        TerminationReason.SEARCHER_DONE,
        TerminationReason.NONZERO_EXIT,
    ):
        reason = EARLY_EXIT_REASONS.get(trial.early_exit_reason, reason)
    term = TERMINATION_TABLE[reason]
    experiment = get_or_404(session, ExperimentModel, trial.experiment_id, "experiment")
    step = next_step(
        reason,
        TrialState(trial.state),
        ExperimentState(experiment.state),
        searcher_done=trial.searcher_done,
        pause_reason=trial.pause_reason,
        restarts=trial.restarts,
        max_restarts=_max_restarts(experiment),
    )
    text = term.message + (f"; {step.note}" if step.note else "") + (f": {message}" if message else "")
    run.exit_reason = reason
    run.exit_message = text
    set_run_state(session, run, term.run_state, text)

    if step.counts_restart:
        trial.restarts += 1
    if step.next == Next.WAIT:
        trial.pause_reason = step.pause_reason
    if step.trial_state != trial.state:
        trial.exit_message = text
        set_trial_state(session, trial, step.trial_state, text)
    resubmit = step.next == Next.RESUBMIT
    session.flush()
    maybe_finish_experiment(session, experiment)
    return RunOutcome(TrialState(trial.state), resubmit, text)


def maybe_finish_experiment(session: Session, experiment: ExperimentModel) -> bool:
    """A stopping experiment whose trials are all terminal becomes terminal."""
    state = ExperimentState(experiment.state)
    if state not in STOPPING_EXPERIMENT_END:
        return False
    live = session.scalar(
        select(func.count()).where(
            TrialModel.experiment_id == experiment.id, TrialModel.state.not_in(TERMINAL_TRIAL_STATES)
        )
    )
    if live:
        return False
    return set_experiment_state(session, experiment, STOPPING_EXPERIMENT_END[state], "all trials finished")


# ---------------------------------------------------------------- searcher


def record_searcher_snapshot(
    session: Session, experiment_id: int, snapshot: dict[str, Any], expected_version: int
) -> bool:
    """Store the searcher's JSON snapshot if the experiment is still at `expected_version` (else False)."""
    return guarded_update(
        session, ExperimentModel, experiment_id, expected_version, searcher_snapshot=snapshot
    )


def set_searcher_operation(
    session: Session, trial_id: int, length: int | None, *, done: bool = False
) -> None:
    """Tell a trial how far to train (``validateAfter.length``) or that the searcher is done with it."""
    trial = get_or_404(session, TrialModel, trial_id, "trial")
    trial.searcher_op_length = length
    trial.searcher_done = done


def take_searcher_op_completions(
    session: Session, experiment_id: int | None = None, limit: int | None = None
) -> list[SearcherOpCompletionModel]:
    """Consume the validations reported by harnesses since the last call (oldest first), for one experiment
    or all. Consumed in the caller's transaction: rolled back together with what the searcher did with them."""
    stmt = select(SearcherOpCompletionModel).where(SearcherOpCompletionModel.consumed.is_(False))
    if experiment_id is not None:
        stmt = stmt.join(TrialModel, TrialModel.id == SearcherOpCompletionModel.trial_id).where(
            TrialModel.experiment_id == experiment_id
        )
    rows = list(session.scalars(stmt.order_by(SearcherOpCompletionModel.id).limit(limit)))
    for row in rows:
        row.consumed = True
    return rows


# ---------------------------------------------------------------- preemption


def _note_stop_request(session: Session, _flush: UOWTransaction, _instances: object) -> None:
    for obj in session.dirty:
        if (
            isinstance(obj, TrialRunModel)
            and obj.preempt_requested
            and inspect(obj).attrs.preempt_requested.history.added
        ):
            session.info.setdefault("stop_requested", set()).add((obj.trial_id, obj.run_number))


def _wake_stop_waiters(session: Session) -> None:
    runs = session.info.pop("stop_requested", None)
    if runs:
        notify.stops_requested(runs)


def _forget_stop_request(session: Session) -> None:
    session.info.pop("stop_requested", None)


def watch_stop_requests() -> None:
    """Wake the preemption long polls of the runs a committed transaction set ``preempt_requested`` on,
    wherever it was set (a user's pause or kill, a searcher's pause or stop), so they need not poll the
    database; the other runs' polls sleep on. Idempotent."""
    for name, listener in (
        ("before_flush", _note_stop_request),
        ("after_commit", _wake_stop_waiters),
        ("after_rollback", _forget_stop_request),
    ):
        if not event.contains(Session, name, listener):
            event.listen(Session, name, listener)


def request_preemption(session: Session, run_id: int) -> None:
    """Ask a live run to checkpoint and exit (``should_preempt()`` becomes true on every rank)."""
    run = get_or_404(session, TrialRunModel, run_id, "trial run")
    if run.state in LIVE_RUN_STATES:
        run.preempt_requested = True


def mark_stop_delivered(session: Session, run: TrialRunModel) -> bool:
    """Whether the run is asked to stop; if so, record that its job is being told (it will exit).

    Called by the harness routes that tell a job to stop (the preemption long poll answering ``preempt``,
    the searcher operation answering "no operation"). The row lock makes this and `call_off_stop` one
    handshake on PostgreSQL (SQLite's ``BEGIN IMMEDIATE`` serializes them anyway): a stop is either called
    off before the job hears of it, or the job hears of it and its exit is known to have been asked for.
    """
    if not run.preempt_requested:
        return False
    session.refresh(run, with_for_update=True)
    if run.preempt_requested and not run.preempt_acked:
        run.preempt_acked = True
    return run.preempt_requested


def call_off_stop(session: Session, run: TrialRunModel) -> bool:
    """Withdraw a pause request from a live run; False if its job was already told (it exits regardless).

    A job told to stop is left to exit; `classify` sees the request with the trial active again and
    resubmits the trial at once (``PAUSE_CALLED_OFF``).
    """
    session.refresh(run, with_for_update=True)
    if run.preempt_acked:
        return False
    run.preempt_requested = False
    return True


def live_run_of(session: Session, trial_id: int) -> TrialRunModel | None:
    return session.scalar(
        select(TrialRunModel)
        .where(TrialRunModel.trial_id == trial_id, TrialRunModel.state.in_(LIVE_RUN_STATES))
        .order_by(TrialRunModel.run_number.desc())
        .limit(1)
    )


# ---------------------------------------------------------------- reconciliation


@dataclass(frozen=True)
class LiveRun:
    run_id: int
    run_number: int
    trial_id: int
    experiment_id: int
    slurm_job_id: str | None
    state: RunState
    trial_state: TrialState
    preempt_requested: bool
    version: int
    owner_unix: str | None = None
    """The experiment's owner's Unix account (the run's files are theirs)."""


def list_active_experiments(session: Session) -> list[ExperimentModel]:
    """Experiments the loop must drive (anything not terminal, not being deleted)."""
    done = {*TERMINAL_EXPERIMENT_STATES, ExperimentState.DELETING, ExperimentState.DELETE_FAILED}
    return list(session.scalars(select(ExperimentModel).where(ExperimentModel.state.not_in(done))))


def list_active_trials(session: Session, experiment_id: int | None = None) -> list[TrialModel]:
    stmt = select(TrialModel).where(TrialModel.state.not_in(TERMINAL_TRIAL_STATES))
    if experiment_id is not None:
        stmt = stmt.where(TrialModel.experiment_id == experiment_id)
    return list(session.scalars(stmt.order_by(TrialModel.id)))


def list_trials_to_submit(session: Session) -> list[TrialModel]:
    """ACTIVE trials of ACTIVE experiments with no live run and work left: the loop submits these."""
    live = select(TrialRunModel.trial_id).where(TrialRunModel.state.in_(LIVE_RUN_STATES))
    stmt = (
        select(TrialModel)
        .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
        .where(
            TrialModel.state == TrialState.ACTIVE,
            ExperimentModel.state == ExperimentState.ACTIVE,
            TrialModel.searcher_done.is_(False),
            TrialModel.id.not_in(live),
        )
        .order_by(TrialModel.id)
    )
    return list(session.scalars(stmt))


@dataclass(frozen=True)
class Repair:
    """A trial found breaking the invariant "a non-terminal trial has a live run, is queued to submit, or
    waits paused", and what was done about it."""

    trial_id: int
    experiment_id: int
    old_state: TrialState
    new_state: TrialState
    why: str


def repair_stranded_trials(session: Session) -> list[Repair]:
    """Close the trials that nothing would ever move again. One query finds them (none, normally):

    - ACTIVE trials of ACTIVE experiments with no live run that the searcher is done with: not in the submit
      queue (`list_trials_to_submit`), and no job will ever end for them. Completed: the searcher's work is
      done (it learns of the closed trial on its next pass).
    - trials stopping (canceled, killed, ...) with no live run: no job end will finish the stop. They end
      as the stop asked.
    - ACTIVE or PAUSED trials of stopping experiments with no live run: they end as the experiment will.

    Every other ACTIVE trial of an ACTIVE experiment with no live run is in the submit queue by definition.
    """
    live = select(TrialRunModel.trial_id).where(TrialRunModel.state.in_(LIVE_RUN_STATES))
    stopping_trials = list(STOPPING_TRIAL_END)
    stopping_experiments = list(EXPERIMENT_STOPPING_TRIAL_END)
    rows = session.execute(
        select(TrialModel, ExperimentModel.state)
        .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
        .where(
            TrialModel.state.not_in(TERMINAL_TRIAL_STATES),
            TrialModel.id.not_in(live),
            or_(
                and_(
                    TrialModel.state == TrialState.ACTIVE,
                    ExperimentModel.state == ExperimentState.ACTIVE,
                    TrialModel.searcher_done.is_(True),
                ),
                TrialModel.state.in_(stopping_trials),
                ExperimentModel.state.in_(stopping_experiments),
            ),
        )
        .order_by(TrialModel.id)
    ).all()
    repairs: list[Repair] = []
    for trial, exp_state in rows:
        old = TrialState(trial.state)
        if old in STOPPING_TRIAL_END:
            new, why = STOPPING_TRIAL_END[old], f"it was {old} with no live run"
        elif exp_state in EXPERIMENT_STOPPING_TRIAL_END:
            new = EXPERIMENT_STOPPING_TRIAL_END[ExperimentState(exp_state)]
            why = f"it was {old} with no live run in a {exp_state} experiment"
        else:
            new = TrialState.COMPLETED
            why = "it was ACTIVE with no live run and nothing queued to submit: the searcher was done with it"
        trial.exit_message = f"closed by the lifecycle loop: {why}"
        set_trial_state(session, trial, new, f"repaired by the lifecycle loop: {why}")
        repairs.append(Repair(trial.id, trial.experiment_id, old, new, why))
    if repairs:
        session.flush()
        for exp_id in sorted({r.experiment_id for r in repairs}):
            maybe_finish_experiment(session, get_or_404(session, ExperimentModel, exp_id, "experiment"))
    return repairs


def list_live_runs(session: Session) -> list[LiveRun]:
    """Every PENDING/RUNNING run with its Slurm job id, to reconcile with Slurm after a restart.

    A run with ``slurm_job_id`` None was allocated but the master stopped before ``sbatch`` answered.
    """
    rows = session.execute(
        select(TrialRunModel, TrialModel.experiment_id, TrialModel.state, UserModel.unix_username)
        .join(TrialModel, TrialModel.id == TrialRunModel.trial_id)
        .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
        .outerjoin(UserModel, UserModel.id == ExperimentModel.owner_id)
        .where(TrialRunModel.state.in_(LIVE_RUN_STATES))
        .order_by(TrialRunModel.id)
    ).all()
    return [
        LiveRun(
            run_id=run.id,
            run_number=run.run_number,
            trial_id=run.trial_id,
            experiment_id=exp_id,
            slurm_job_id=run.slurm_job_id,
            state=RunState(run.state),
            trial_state=TrialState(trial_state),
            preempt_requested=run.preempt_requested,
            version=run.version,
            owner_unix=unix,
        )
        for run, exp_id, trial_state, unix in rows
    ]


def list_runs_to_kill(session: Session) -> list[LiveRun]:
    """Live runs whose trial is STOPPING_KILLED: the loop ``scancel``s these."""
    return [r for r in list_live_runs(session) if r.trial_state == TrialState.STOPPING_KILLED]


def mint_trial_token(session: Session, trial_id: int, ttl: dt.timedelta | None = None) -> str:
    """A bearer token for the harness of `trial_id` that can call only that trial's routes."""
    from hpc_master.services.users import mint_trial_token as _mint

    return _mint(session, trial_id, ttl)
