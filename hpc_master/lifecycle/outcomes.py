"""How a job ended, read once for trials and tasks alike: Slurm's view and the job entry's `exit.json`.

`JobEnd.of(status, exit_info)` is the one reading of a finished job, through the job side's own contract
(`harness.exec.job_contract.ExitRecord`: the file is the job owner's, so any key may be missing or of the wrong
type, and none of it is trusted beyond its shape). Trials then ask
`classify()`, which weighs it against what the master had asked for and returns a `TerminationReason` (the
termination table in `hpc_master.services.states` turns that into run and trial states, a retry policy and a
message); tasks ask `task_end()` for an exit code and words. Pure: plain values in, plain values out.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

from harness.exec.job_contract import ExitRecord
from hpc_master.services.states import TerminationReason, TrialState
from slurm_backend import JobStatus, Outcome

R = TerminationReason


@dataclass(frozen=True)
class JobEnd:
    """A finished (or unschedulable, or lost) job: Slurm's status and what its ``exit.json`` says."""

    status: JobStatus
    exit_code: int | None
    """The job entry's exit code, else Slurm's."""
    preempted: bool
    """The job checkpointed and exited because it was asked to (a signal, a pause)."""
    signal: str | None
    """The signal that asked it to, as ``SIGUSR1``."""
    reason: str | None
    """The job entry's words on why it ended."""
    stage: str | None
    """Where the job entry was when it failed (``entrypoint`` once the user's code ran)."""

    @classmethod
    def of(cls, status: JobStatus, exit_info: object) -> JobEnd:
        """`exit_info`: the job's ``exit.json`` as read (None when there is none), through the job side's own
        contract (``harness.exec.job_contract.ExitRecord``), which trusts nothing in it but its shape."""
        record = ExitRecord.from_json(exit_info)
        return cls(
            status=status,
            exit_code=record.exit_code if record.exit_code is not None else status.exit_code,
            preempted=record.preempted is True,
            signal=_signal_name(record.signal),
            reason=record.reason or None,
            stage=record.stage,
        )

    @property
    def out_of_memory(self) -> bool:
        return self.status.outcome is Outcome.OOM or "exceeded memory limit" in (self.reason or "").lower()


@dataclass(frozen=True)
class RunContext:
    """What the master knew about the trial when its job ended."""

    trial_state: TrialState
    pause_reason: str | None
    preempt_requested: bool
    searcher_done: bool
    preempt_signal: str = "SIGUSR1"


def _signal_name(value: Any) -> str | None:
    if isinstance(value, str) and value:
        return value if value.startswith("SIG") else f"SIG{value}"
    if isinstance(value, int) and value > 0:
        try:
            return signal.Signals(value).name
        except ValueError:
            return None
    return None


def _asked_to_stop(ctx: RunContext) -> TerminationReason | None:
    """The reason the master itself gave when it asked this job to checkpoint and exit, if it did."""
    if ctx.trial_state == TrialState.STOPPING_KILLED:
        return R.KILLED_BY_USER
    if ctx.trial_state == TrialState.STOPPING_CANCELED:
        return R.CANCELED_BY_USER
    if not ctx.preempt_requested:
        return None
    if ctx.searcher_done:  # a Stop after an earlier Pause: the searcher is done with this trial for good
        return R.SEARCHER_DONE
    if ctx.pause_reason == R.PAUSED_BY_SEARCHER:
        return R.PAUSED_BY_SEARCHER
    if ctx.trial_state == TrialState.PAUSED:
        return R.PAUSED_BY_USER
    if ctx.trial_state == TrialState.ACTIVE:
        # Paused, then resumed (promoted, or the experiment activated) after the job had been told to stop:
        # its script ends without finishing its work, so it must run again at once.
        return R.PAUSE_CALLED_OFF
    return None


def classify(end: JobEnd, ctx: RunContext) -> TerminationReason:
    """The reason a trial's finished (or unschedulable, or lost) job ended."""
    outcome = end.status.outcome
    asked = _asked_to_stop(ctx)
    if outcome is Outcome.SUCCEEDED:
        return _succeeded(end, ctx, asked)
    if outcome is Outcome.CANCELLED:
        # scancel by us (kill, a pause of a job that had not started yet) or by someone outside the platform.
        return asked if asked is not None else R.JOB_LOST
    if outcome is Outcome.PREEMPTED:
        return R.SLURM_PREEMPTED
    if outcome is Outcome.TIMED_OUT:
        return R.TIME_LIMIT_CHECKPOINTED if end.preempted else R.TIME_LIMIT
    if outcome is Outcome.NODE_FAILED:
        return R.NODE_FAIL
    return _failed(end, asked)


def _succeeded(end: JobEnd, ctx: RunContext, asked: TerminationReason | None) -> TerminationReason:
    """A job that exited 0: as the master asked, checkpointed on a signal, or done with its work."""
    if asked is not None:
        return asked
    if end.preempted:
        if end.signal == ctx.preempt_signal:
            return R.TIME_LIMIT_CHECKPOINTED
        return R.SLURM_PREEMPTED
    return R.SEARCHER_DONE


def _failed(end: JobEnd, asked: TerminationReason | None) -> TerminationReason:
    """A job that neither succeeded, nor was cancelled, preempted, timed out or lost its node."""
    outcome = end.status.outcome
    if end.out_of_memory:
        return R.OUT_OF_MEMORY
    if outcome is Outcome.UNSCHEDULABLE:
        return R.SUBMIT_FAILED
    if outcome is Outcome.FAILED:
        if asked in (R.KILLED_BY_USER, R.CANCELED_BY_USER):
            return asked
        return R.NONZERO_EXIT
    return R.JOB_LOST


def describe(end: JobEnd) -> str:
    """The detail shown after the table's message: Slurm's words and the job entry's reason."""
    parts = [f"Slurm job {end.status.job_id} {end.status.message}"]
    if end.reason:
        parts.append(end.reason)
    return "; ".join(parts)


def task_end(end: JobEnd, *, killed: bool, why: str | None = None) -> tuple[int | None, str]:
    """A task's (exit code, why it ended in words); `why`: the reason the master killed it, when not the user."""
    status = end.status
    slurm = f"Slurm job {status.job_id} {status.message}"
    if killed:
        return end.exit_code, f"{why or 'killed by the user'} ({slurm})"
    if status.outcome is Outcome.UNSCHEDULABLE:
        return None, f"it can never start here: {status.reason or status.message} ({slurm})"
    if end.reason:
        reason = end.reason
        if end.stage not in (None, "entrypoint") and end.exit_code:
            reason = f"setup failed ({end.stage}): {reason}"
        return end.exit_code, reason if status.outcome is Outcome.SUCCEEDED else f"{reason} ({slurm})"
    if status.outcome is Outcome.TIMED_OUT:
        return end.exit_code, f"reached its time limit ({slurm})"
    return end.exit_code, slurm
