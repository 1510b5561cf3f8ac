"""Why a trial run ended: Slurm's view, the job entry's `exit.json`, and what the master had asked for.

Pure: `classify()` takes plain values and returns a `TerminationReason` (which the termination table in
`hpc_master.services.states` turns into run and trial states, a retry policy and a message).
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpc_master.services.states import TerminationReason, TrialState
from slurm_backend import JobStatus, Outcome

R = TerminationReason


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


def classify(status: JobStatus, exit_info: Mapping[str, Any] | None, ctx: RunContext) -> TerminationReason:
    """The reason a finished (or unschedulable, or lost) job ended."""
    outcome = status.outcome
    info = exit_info or {}
    asked = _asked_to_stop(ctx)
    if outcome is Outcome.SUCCEEDED:
        if asked is not None:
            return asked
        if info.get("preempted"):
            sig = _signal_name(info.get("signal"))
            if sig == ctx.preempt_signal:
                return R.TIME_LIMIT_CHECKPOINTED
            return R.SLURM_PREEMPTED
        return R.SEARCHER_DONE
    if outcome is Outcome.CANCELLED:
        # scancel by us (kill, a pause of a job that had not started yet) or by someone outside the platform.
        return asked if asked is not None else R.JOB_LOST
    if outcome is Outcome.PREEMPTED:
        return R.SLURM_PREEMPTED
    if outcome is Outcome.TIMED_OUT:
        return R.TIME_LIMIT_CHECKPOINTED if info.get("preempted") else R.TIME_LIMIT
    if outcome is Outcome.NODE_FAILED:
        return R.NODE_FAIL
    if outcome is Outcome.OOM or "exceeded memory limit" in str(info.get("reason", "")).lower():
        return R.OUT_OF_MEMORY
    if outcome is Outcome.UNSCHEDULABLE:
        return R.SUBMIT_FAILED
    if outcome is Outcome.FAILED:
        if asked in (R.KILLED_BY_USER, R.CANCELED_BY_USER):
            return asked
        return R.NONZERO_EXIT
    return R.JOB_LOST


def describe(status: JobStatus, exit_info: Mapping[str, Any] | None) -> str:
    """The detail shown after the table's message: Slurm's words and the job entry's reason."""
    parts = [f"Slurm job {status.job_id} {status.message}"]
    if exit_info and exit_info.get("reason"):
        parts.append(str(exit_info["reason"]))
    return "; ".join(parts)
