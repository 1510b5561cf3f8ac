"""Slurm job states and pending reasons → the few trial-run outcomes the master acts on.

Explicit tables, no string heuristics beyond the documented `*PerJob*`-limit family. Every state listed in
`squeue(1)`'s JOB STATE CODES for Slurm 22.05 is in `STATE_OUTCOMES`; an unknown state maps to `Outcome.UNKNOWN`
(non-terminal: the master keeps watching rather than resubmitting a job that may still run) with a warning.
"""

from __future__ import annotations

import enum
import logging
import re
from dataclasses import dataclass
from datetime import datetime

log = logging.getLogger(__name__)


class Outcome(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"
    TIMED_OUT = "TIMED_OUT"
    NODE_FAILED = "NODE_FAILED"
    OOM = "OOM"
    CANCELLED = "CANCELLED"
    UNSCHEDULABLE = "UNSCHEDULABLE"  # pending for a reason that never resolves on its own
    UNKNOWN = "UNKNOWN"  # a state this table does not know, or a job briefly missing from squeue
    LOST = "LOST"  # missing from squeue for longer than the poller's grace period, with no record of its end

    @property
    def is_terminal(self) -> bool:
        return self not in _NON_TERMINAL


_NON_TERMINAL = frozenset({Outcome.PENDING, Outcome.RUNNING, Outcome.UNKNOWN})

# Slurm 22.05 job states (squeue(1) "JOB STATE CODES"; sacct(1) prints the same names).
STATE_OUTCOMES: dict[str, Outcome] = {
    "PENDING": Outcome.PENDING,
    "REQUEUED": Outcome.PENDING,  # only after an admin `scontrol requeue`: we submit with --no-requeue
    "REQUEUE_FED": Outcome.PENDING,
    "REQUEUE_HOLD": Outcome.PENDING,  # held after a requeue; an admin may release it
    "RESV_DEL_HOLD": Outcome.PENDING,
    "CONFIGURING": Outcome.RUNNING,  # nodes allocated, booting
    "RUNNING": Outcome.RUNNING,
    "COMPLETING": Outcome.RUNNING,  # processes ended, epilog running; the final state follows
    "SIGNALING": Outcome.RUNNING,
    "STAGE_OUT": Outcome.RUNNING,
    "RESIZING": Outcome.RUNNING,
    "SUSPENDED": Outcome.RUNNING,  # gang-scheduled or admin-suspended; resumes in place
    "STOPPED": Outcome.RUNNING,  # SIGSTOPped; resources kept
    "COMPLETED": Outcome.SUCCEEDED,
    "FAILED": Outcome.FAILED,
    "SPECIAL_EXIT": Outcome.FAILED,
    "DEADLINE": Outcome.FAILED,  # only with a user --deadline; resubmitting would hit it again
    "TIMEOUT": Outcome.TIMED_OUT,
    "PREEMPTED": Outcome.PREEMPTED,
    "NODE_FAIL": Outcome.NODE_FAILED,
    "BOOT_FAIL": Outcome.NODE_FAILED,
    "OUT_OF_MEMORY": Outcome.OOM,
    "CANCELLED": Outcome.CANCELLED,
    "REVOKED": Outcome.CANCELLED,  # federation: a sibling cluster ran the job
}

# Pending reasons that no amount of waiting fixes: the request exceeds a hard limit or names something that
# does not exist. Seen on the local cluster: PartitionTimeLimit (--time above MaxTime), PartitionNodeLimit
# (-N above the partition's nodes). Deliberately absent: Resources, Priority, ReqNodeNotAvail (nodes may come
# back), PartitionDown/Inactive (an admin may bring it up), *MaxJobs*/*Grp* limits (free up when other jobs end),
# JobHeldAdmin/JobHeldUser (may be released).
NEVER_RUNS_REASONS: frozenset[str] = frozenset(
    {
        "BadConstraints",
        "DependencyNeverSatisfied",
        "InvalidAccount",
        "InvalidQOS",
        "PartitionConfig",
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "AssociationTimeLimit",
        "QOSTimeLimit",
    }
)
# Per-job QOS/association maxima and minima (QOSMaxGRESPerJob, AssocMaxWallDurationPerJobLimit,
# QOSMinCpuNotSatisfied, ...): the job itself asks for more (or less) than allowed, so it never starts.
_PER_JOB_LIMIT = re.compile(r"^(QOS|Assoc)(Max\w*PerJob\w*|Min\w*)$")


def reason_never_resolves(reason: str | None) -> bool:
    head = _reason_head(reason)
    return head in NEVER_RUNS_REASONS or bool(_PER_JOB_LIMIT.match(head))


def _reason_head(reason: str | None) -> str:
    # "ReqNodeNotAvail, UnavailableNodes:node3" (squeue) / "ReqNodeNotAvail,_UnavailableNodes:..." (scontrol)
    return (reason or "").split(",", 1)[0].strip()


def base_state(state: str) -> str:
    """`CANCELLED by 1000` (sacct) → `CANCELLED`; `RUNNING+` style flags are not printed by 22.05."""
    return state.strip().split(" ", 1)[0].rstrip("+")


def outcome_for(state: str, reason: str | None = None) -> Outcome:
    """The outcome of a job in Slurm `state` (any spelling squeue/sacct/scontrol print) with `reason`."""
    base = base_state(state)
    outcome = STATE_OUTCOMES.get(base)
    if outcome is None:
        log.warning(
            "unknown Slurm job state %r (reason %r): treating it as %s", state, reason, Outcome.UNKNOWN
        )
        return Outcome.UNKNOWN
    if outcome is Outcome.PENDING and reason_never_resolves(reason):
        return Outcome.UNSCHEDULABLE
    return outcome


@dataclass(frozen=True)
class JobStatus:
    """What the master needs to know about one Slurm job, whichever command reported it."""

    job_id: str
    outcome: Outcome
    slurm_state: str  # Slurm's own word, e.g. "CANCELLED" (the "by UID" suffix dropped)
    reason: str | None = None  # Slurm's reason (pending reason, or why it ended), None when "None"
    exit_code: int | None = None  # None until known (squeue does not report it)
    exit_signal: int | None = None  # the signal that ended the batch script, if any
    node_list: str = ""
    start_time: datetime | None = None
    end_time: datetime | None = None
    source: str = ""  # "squeue", "sacct" or "scontrol"
    jobs_ahead: int | None = (
        None  # pending jobs Slurm considers first (the poller's, now and then; None: unknown)
    )

    @property
    def is_terminal(self) -> bool:
        return self.outcome.is_terminal

    @property
    def message(self) -> str:
        """A one-line explanation for users: `FAILED (exit 3)`, `UNSCHEDULABLE: PartitionTimeLimit`."""
        text = self.outcome.value
        if self.exit_code:
            text += f" (exit {self.exit_code})"
        if self.exit_signal:
            text += f" (signal {self.exit_signal})"
        if self.reason and self.outcome is not Outcome.SUCCEEDED:
            text += f": {self.reason}"
        return text
