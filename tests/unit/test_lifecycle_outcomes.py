"""How a finished Slurm job becomes a termination reason (and so a trial state and retry policy)."""

from __future__ import annotations

import pytest

from hpc_master.lifecycle.outcomes import JobEnd, RunContext, classify, describe, task_end
from hpc_master.services.states import TERMINATION_TABLE, Retry, TerminationReason, TrialState
from slurm_backend import JobStatus, Outcome

R = TerminationReason
ACTIVE = RunContext(TrialState.ACTIVE, None, preempt_requested=False, searcher_done=False)


def status(outcome: Outcome, exit_code: int | None = 0) -> JobStatus:
    return JobStatus(job_id="42", outcome=outcome, slurm_state=outcome.value, exit_code=exit_code)


@pytest.mark.parametrize(
    ("outcome", "exit_info", "ctx", "expected"),
    [
        # The trial's code finished its work.
        (Outcome.SUCCEEDED, {"exitCode": 0, "preempted": False}, ACTIVE, R.SEARCHER_DONE),
        # Checkpointed on the pre-time-limit signal: resubmitted at once (a chain of jobs).
        (Outcome.SUCCEEDED, {"preempted": True, "signal": "SIGUSR1"}, ACTIVE, R.TIME_LIMIT_CHECKPOINTED),
        (Outcome.SUCCEEDED, {"preempted": True, "signal": 10}, ACTIVE, R.TIME_LIMIT_CHECKPOINTED),
        # Checkpointed on Slurm's preemption SIGTERM within the grace time.
        (Outcome.SUCCEEDED, {"preempted": True, "signal": "SIGTERM"}, ACTIVE, R.SLURM_PREEMPTED),
        (Outcome.PREEMPTED, None, ACTIVE, R.SLURM_PREEMPTED),
        (Outcome.TIMED_OUT, {"preempted": False}, ACTIVE, R.TIME_LIMIT),
        (Outcome.TIMED_OUT, {"preempted": True}, ACTIVE, R.TIME_LIMIT_CHECKPOINTED),
        (Outcome.FAILED, {"exitCode": 3}, ACTIVE, R.NONZERO_EXIT),
        (Outcome.NODE_FAILED, None, ACTIVE, R.NODE_FAIL),
        (Outcome.OOM, None, ACTIVE, R.OUT_OF_MEMORY),
        (Outcome.FAILED, {"reason": "StepId=1.batch exceeded memory limit"}, ACTIVE, R.OUT_OF_MEMORY),
        (Outcome.UNSCHEDULABLE, None, ACTIVE, R.SUBMIT_FAILED),
        (Outcome.CANCELLED, None, ACTIVE, R.JOB_LOST),  # scancel'd outside the platform
        (Outcome.UNKNOWN, None, ACTIVE, R.JOB_LOST),
        # What the master asked for wins over how the job happened to end.
        (
            Outcome.SUCCEEDED,
            {"preempted": True, "signal": "SIGTERM"},
            RunContext(TrialState.ACTIVE, R.PAUSED_BY_SEARCHER, preempt_requested=True, searcher_done=False),
            R.PAUSED_BY_SEARCHER,
        ),
        (
            Outcome.SUCCEEDED,
            {"preempted": True},
            RunContext(TrialState.PAUSED, R.PAUSED_BY_USER, preempt_requested=True, searcher_done=False),
            R.PAUSED_BY_USER,
        ),
        (
            Outcome.SUCCEEDED,
            {"preempted": True},
            RunContext(TrialState.ACTIVE, None, preempt_requested=True, searcher_done=True),
            R.SEARCHER_DONE,
        ),
        # Paused by the searcher, then stopped for good before the job had exited: the Stop wins.
        (
            Outcome.SUCCEEDED,
            {"preempted": True},
            RunContext(TrialState.ACTIVE, R.PAUSED_BY_SEARCHER, preempt_requested=True, searcher_done=True),
            R.SEARCHER_DONE,
        ),
        # Paused, then resumed (promoted, or activated) after the job was told: it exits and runs again.
        (
            Outcome.SUCCEEDED,
            {"exitCode": 0, "preempted": False},
            RunContext(TrialState.ACTIVE, None, preempt_requested=True, searcher_done=False),
            R.PAUSE_CALLED_OFF,
        ),
        (
            Outcome.FAILED,
            {"exitCode": 1},
            RunContext(TrialState.ACTIVE, None, preempt_requested=True, searcher_done=False),
            R.NONZERO_EXIT,
        ),
        (
            Outcome.CANCELLED,
            None,
            RunContext(TrialState.STOPPING_KILLED, None, preempt_requested=True, searcher_done=False),
            R.KILLED_BY_USER,
        ),
        (
            Outcome.SUCCEEDED,
            {"preempted": True},
            RunContext(TrialState.STOPPING_CANCELED, None, preempt_requested=True, searcher_done=False),
            R.CANCELED_BY_USER,
        ),
    ],
)
def test_classify(
    outcome: Outcome, exit_info: dict[str, object] | None, ctx: RunContext, expected: R
) -> None:
    assert classify(JobEnd.of(status(outcome), exit_info), ctx) == expected


def test_every_reason_classify_can_return_has_a_policy() -> None:
    # Preemption and checkpointed time limits resubmit without using up restarts; crashes count.
    assert TERMINATION_TABLE[R.SLURM_PREEMPTED].retry == Retry.RESUBMIT
    assert TERMINATION_TABLE[R.TIME_LIMIT_CHECKPOINTED].retry == Retry.RESUBMIT
    assert TERMINATION_TABLE[R.PAUSE_CALLED_OFF].retry == Retry.RESUBMIT
    assert TERMINATION_TABLE[R.NONZERO_EXIT].retry == Retry.RESTART
    assert TERMINATION_TABLE[R.NODE_FAIL].retry == Retry.RESTART


@pytest.mark.parametrize(
    "exit_info",
    [
        None,
        [],
        "exit",
        {"exitCode": "0", "preempted": "yes", "signal": [], "reason": 7, "stage": {}},
        {"exitCode": True, "signal": -3, "reason": "", "stage": None},
    ],
)
def test_an_exit_record_of_any_shape_is_read_without_trusting_it(exit_info: object) -> None:
    """exit.json is the job owner's file: whatever it holds, the reading falls back on Slurm's word."""
    end = JobEnd.of(status(Outcome.FAILED, exit_code=9), exit_info)  # type: ignore[arg-type]
    assert end.exit_code == 9 and end.preempted is False and end.signal is None and end.stage is None
    assert classify(end, ACTIVE) is R.NONZERO_EXIT


def test_trials_and_tasks_read_the_same_end() -> None:
    """One reading: the exit code, the stage and the reason a trial's message shows are a task's too."""
    end = JobEnd.of(status(Outcome.FAILED, 1), {"exitCode": 3, "reason": "no such file", "stage": "unpack"})
    assert classify(end, ACTIVE) is R.NONZERO_EXIT
    slurm = f"Slurm job 42 {end.status.message}"
    assert describe(end) == f"{slurm}; no such file"
    assert task_end(end, killed=False) == (3, f"setup failed (unpack): no such file ({slurm})")
    assert task_end(end, killed=True, why="idle for 60 s") == (3, f"idle for 60 s ({slurm})")
    timed_out = JobEnd.of(status(Outcome.TIMED_OUT, None), None)
    assert task_end(timed_out, killed=False) == (
        None, f"reached its time limit (Slurm job 42 {timed_out.status.message})"
    )  # fmt: skip
