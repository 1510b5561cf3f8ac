"""What the in-job harness reports besides metrics and checkpoints (see docs/harness-api.md)."""

from __future__ import annotations

import enum

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hpc_master.db.models import ExperimentModel, SearcherOpCompletionModel, TrialModel, TrialRunModel
from hpc_master.errors import ClientError, NotFoundError
from hpc_master.services.common import get_or_404
from hpc_master.services.experiments import searcher_metric
from hpc_master.services.lifecycle import live_run_of, mark_stop_delivered
from hpc_master.services.metrics import MetricReport, metric_value
from hpc_master.services.searcher_units import searcher_max_length, searcher_units
from hpc_master.services.states import EARLY_EXIT_REASONS
from hpc_master.services.stored_config import experiment_config


def parse_allocation_id(allocation_id: str) -> tuple[int, int]:
    """``"{trialId}.{trialRunId}"`` → (trial_id, run_number)."""
    try:
        trial_part, run_part = allocation_id.split(".", 1)
        return int(trial_part), int(run_part)
    except ValueError:
        raise ClientError(
            f"allocation id {allocation_id!r} is not '<trialId>.<trialRunId>'", field="allocationId"
        ) from None


def run_by_number(session: Session, trial_id: int, run_number: int) -> TrialRunModel:
    run = session.scalar(
        select(TrialRunModel).where(
            TrialRunModel.trial_id == trial_id, TrialRunModel.run_number == run_number
        )
    )
    if run is None:
        raise NotFoundError(f"allocation {trial_id}.{run_number} not found")
    return run


def set_progress(session: Session, trial_id: int, progress: float) -> None:
    if not 0.0 <= progress <= 1.0:
        raise ClientError("progress must be between 0 and 1", field="progress")
    trial = get_or_404(session, TrialModel, trial_id, "trial")
    trial.progress = progress


def set_runner_state(session: Session, trial_id: int, state: str) -> None:
    trial = get_or_404(session, TrialModel, trial_id, "trial")
    run = session.scalar(
        select(TrialRunModel).where(
            TrialRunModel.trial_id == trial_id, TrialRunModel.run_number == trial.run_id
        )
    )
    if run is not None:
        run.runner_state = state[:128]


def report_early_exit(session: Session, trial_id: int, reason: str) -> None:
    if reason not in EARLY_EXIT_REASONS:
        raise ClientError(
            f"unknown early exit reason {reason!r}; expected one of {sorted(EARLY_EXIT_REASONS)}",
            field="earlyExit.reason",
        )
    trial = get_or_404(session, TrialModel, trial_id, "trial")
    trial.early_exit_reason = reason


def preemption_state(session: Session, trial_id: int, run_number: int, *, deliver: bool) -> bool:
    """Whether the job should checkpoint and exit. With `deliver` (the caller is the trial's own harness) a
    ``True`` answer is recorded as delivered; anyone else only reads."""
    run = run_by_number(session, trial_id, run_number)
    return mark_stop_delivered(session, run) if deliver else run.preempt_requested


def ack_preemption(session: Session, trial_id: int, run_number: int) -> None:
    run_by_number(session, trial_id, run_number).preempt_acked = True


class OpState(enum.Enum):
    READY = "ready"  # an operation the harness has not completed yet
    DONE = "done"  # the searcher is done with the trial
    WAITING = "waiting"  # completed; the searcher has not decided what comes next yet
    HELD = "held"  # completed, and the trial's run was asked to stop (a pause): no operation comes now
    NONE = "none"  # no operation was ever given


def searcher_operation(session: Session, trial_id: int, *, deliver: bool) -> tuple[int | None, OpState]:
    """The trial's current operation and what the harness should do with it.

    The harness asks for the next operation right after completing one, usually before the lifecycle
    loop has shown the completion to the searcher: the old operation must then not be handed out again
    (the script would train and validate the same length twice). Until the searcher gives a longer one or
    is done, the harness waits (ASHA may promote the trial once more results reach the rung) unless the
    run is asked to stop (the searcher, or the user, pauses it): then the script's operations end. A completed
    operation of the searcher's ``max_length`` is the trial's last: the answer is "done" at once. Only with
    `deliver` (the caller is the trial's own harness) is a stop recorded as told to the job."""
    trial = get_or_404(session, TrialModel, trial_id, "trial")
    length = trial.searcher_op_length
    if trial.searcher_done:
        return length, OpState.DONE
    if length is None:
        return None, OpState.NONE
    completed = session.scalar(
        select(SearcherOpCompletionModel.id)
        .where(SearcherOpCompletionModel.trial_id == trial_id, SearcherOpCompletionModel.length >= length)
        .limit(1)
    )
    if completed is None:
        return length, OpState.READY
    experiment = get_or_404(session, ExperimentModel, trial.experiment_id, "experiment")
    max_length = searcher_max_length(experiment_config(experiment))
    if max_length is not None and length >= max_length:
        # No search method asks a trial to train past max_length: the script may end now, without waiting
        # for the lifecycle loop to show the searcher this completion (it closes the trial then).
        return length, OpState.DONE
    run = live_run_of(session, trial_id)
    if run is None:
        stopping = False
    else:
        stopping = mark_stop_delivered(session, run) if deliver else run.preempt_requested
    return length, OpState.HELD if stopping else OpState.WAITING


def complete_searcher_operation(session: Session, trial_id: int, length: int, metric: float | None) -> None:
    trial = get_or_404(session, TrialModel, trial_id, "trial")
    if length < 0:
        raise ClientError("length must be >= 0", field="op.validateAfter.length")
    already = session.scalar(
        select(SearcherOpCompletionModel.id).where(
            SearcherOpCompletionModel.trial_id == trial_id, SearcherOpCompletionModel.length == length
        )
    )
    if already is not None:
        return
    session.add(SearcherOpCompletionModel(trial_id=trial_id, length=length, metric=metric))
    if metric is not None:
        trial.searcher_metric = metric
        experiment = get_or_404(session, ExperimentModel, trial.experiment_id, "experiment")
        _, smaller = searcher_metric(experiment_config(experiment))
        best = trial.best_validation
        if best is None or (metric < best if smaller else metric > best):
            trial.best_validation = metric


def record_validations_for_searcher(session: Session, trial_id: int, reports: list[MetricReport]) -> None:
    """Validation reports feed the searcher (Determined ≥ 0.38: no searcher operations needed).

    Each validation carrying the searcher metric becomes a completion at the trial's trained length in the
    searcher's unit; duplicates (retries, or an old script also calling completed_operation) are ignored.
    """
    validations = [r for r in reports if r.group == "validation"]
    if not validations:
        return
    trial = get_or_404(session, TrialModel, trial_id, "trial")
    experiment = get_or_404(session, ExperimentModel, trial.experiment_id, "experiment")
    config = experiment_config(experiment)
    name, _ = searcher_metric(config)
    if name is None:
        return
    for report in validations:
        value = metric_value(report.metrics, name)
        if value is None:
            continue
        units = searcher_units(config, report.steps_completed, report.metrics)
        complete_searcher_operation(session, trial_id, units, value)


def best_searcher_validation(session: Session, experiment_id: int) -> float | None:
    experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
    _, smaller = searcher_metric(experiment_config(experiment))
    agg = func.min if smaller else func.max
    value = session.scalar(
        select(agg(SearcherOpCompletionModel.metric))
        .join(TrialModel, TrialModel.id == SearcherOpCompletionModel.trial_id)
        .where(TrialModel.experiment_id == experiment_id)
    )
    return float(value) if value is not None else None
