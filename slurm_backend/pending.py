"""Why a job waits, in the few classes users act on, and whether it is stuck (it will not start until someone
acts: an admin releases it, brings a partition up, or the job is cancelled).

Slurm's pending reasons ("Job Reason Codes" in squeue(1)) are many and change between releases; the classes
are: ``limit`` (a limit or quota of the user's account, QOS or partition: it starts when other jobs of theirs
end, or never when the job itself asks for more than allowed), ``resources`` (nodes, GPUs, CPUs, memory,
licenses or a reservation are busy or unavailable), ``priority`` (other jobs come first), ``held``,
``dependency``, and ``other``. The master's own reasons for a run it has not submitted yet (a submit limit, an
unreachable controller) are classed the same way.

A stuck job is shown as such (``det e describe``, the web UI), not failed: an admin may release it. Jobs whose
reason never resolves (``states.reason_never_resolves``: the job asks for more than any limit allows) are
stuck too; the master cancels those and fails the trial with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from slurm_backend.states import reason_never_resolves

PendingClass = Literal["limit", "resources", "priority", "held", "dependency", "other"]

_EXACT: dict[str, PendingClass] = {
    "Priority": "priority",
    "Resources": "resources",
    "ReqNodeNotAvail": "resources",
    "Reservation": "resources",
    "Licenses": "resources",
    "BurstBufferResources": "resources",
    "NodeDown": "resources",
    "Dependency": "dependency",
    "DependencyNeverSatisfied": "dependency",
    "JobHeldUser": "held",
    "JobHeldAdmin": "held",
    "launch failed requeued held": "held",
    "BeginTime": "other",
}
_LIMIT = re.compile(r"^(Assoc|QOS|Partition|Max|JobArrayTask|Association|AccountingPolicy)\w*$|Limit$|Submit")

STUCK_REASONS: frozenset[str] = frozenset(
    {
        "JobHeldAdmin",  # an admin's hold: released by an admin only
        "JobHeldUser",  # a hold by the job's owner (`scontrol hold`): released by them
        "launch failed requeued held",  # Slurm held it after a failed launch
        "PartitionDown",  # the partition takes no new work until an admin brings it up
        "PartitionInactive",
        "DependencyNeverSatisfied",  # what it waits for failed or was cancelled
        "BadConstraints",
        "InvalidAccount",
        "InvalidQOS",
    }
)


def head(reason: str | None) -> str:
    """The reason's name, without the nodes some carry (``ReqNodeNotAvail, UnavailableNodes:node3``)."""
    text = (reason or "").strip()
    return text if text == "launch failed requeued held" else text.split(",", 1)[0].strip()


def classify(reason: str | None) -> PendingClass | None:
    """The class of a pending reason; None while there is none (the scheduler has not looked yet)."""
    name = head(reason)
    if not name or name == "None":
        return None
    if name in _EXACT:
        return _EXACT[name]
    # Free text, with spaces: "Nodes required for job are DOWN, DRAINED or reserved for jobs in ...".
    if name.replace("_", " ").startswith("Nodes required for job"):
        return "resources"
    if name in ("PartitionDown", "PartitionInactive", "BadConstraints", "InvalidAccount", "InvalidQOS"):
        return "other"
    return "limit" if _LIMIT.search(name) else "other"


def is_stuck(reason: str | None) -> bool:
    """The job will not start until someone acts (see the module's docstring)."""
    name = head(reason)
    return name in STUCK_REASONS or (bool(name) and reason_never_resolves(name))


# The queue of every user's pending jobs (``squeue --states=PENDING``): job id, partitions, priority.
QUEUE_FORMAT = "%i|%P|%Q"
Queued = tuple[str, frozenset[str], int]


def parse_queue(stdout: str) -> list[Queued]:
    """Lines of ``squeue --noheader --states=PENDING --format=QUEUE_FORMAT``; lines it cannot read are skipped
    (an array's ``123_[1-5]`` is one entry, as Slurm schedules it)."""
    out = []
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3 or not parts[2].strip().isdigit():
            continue
        job_id, partitions, priority = (p.strip() for p in parts)
        out.append((job_id, frozenset(partitions.split(",")), int(priority)))
    return out


def jobs_ahead(mine: Iterable[str], queue: list[Queued]) -> dict[str, int]:
    """For each of ``mine`` in ``queue``: the pending jobs that Slurm considers first in one of its partitions
    (a higher priority, or the same and submitted before: a lower job id)."""
    by_id = {job_id: (partitions, priority) for job_id, partitions, priority in queue}
    out = {}
    for job_id in mine:
        if job_id not in by_id:
            continue
        partitions, priority = by_id[job_id]
        own = (priority, -_number(job_id))
        out[job_id] = sum(
            1
            for other, other_partitions, other_priority in queue
            if other != job_id and other_partitions & partitions and (other_priority, -_number(other)) > own
        )
    return out


def _number(job_id: str) -> int:
    digits = job_id.split("_", 1)[0]
    return int(digits) if digits.isdigit() else 0
