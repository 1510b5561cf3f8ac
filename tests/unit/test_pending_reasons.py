"""Pending reasons in classes, and which mean stuck: on the reasons the local cluster printed
(``captured/squeue_pending_reasons.txt``, parsed by the real parser) and Slurm's documented names."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_backend.parse import parse_squeue
from slurm_backend.pending import classify, is_stuck, jobs_ahead, parse_queue

CAPTURED = Path(__file__).parent / "captured" / "squeue_pending_reasons.txt"


def test_the_reasons_a_real_slurm_printed() -> None:
    lines = [line for line in CAPTURED.read_text().splitlines() if line and not line.startswith("#")]
    statuses = [status for line in lines for status in parse_squeue(line).values()]  # job 9 twice
    pending = [s for s in statuses if s.slurm_state == "PENDING"]
    seen = {(s.reason or ""): (classify(s.reason), is_stuck(s.reason)) for s in pending}
    assert seen == {
        "AssocMaxJobsLimit": ("limit", False),
        "QOSMaxWallDurationPerJobLimit": ("limit", True),  # the job asks for more than the QOS allows
        "QOSMaxJobsPerUserLimit": ("limit", False),
        "Resources": ("resources", False),
        "Priority": ("priority", False),
        "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions": (
            "resources",
            False,
        ),
        "ReqNodeNotAvail, UnavailableNodes:node2": ("resources", False),
    }, seen


@pytest.mark.parametrize(
    ("reason", "klass", "stuck"),
    [
        ("JobHeldAdmin", "held", True),
        ("JobHeldUser", "held", True),
        ("launch failed requeued held", "held", True),
        ("Dependency", "dependency", False),
        ("DependencyNeverSatisfied", "dependency", True),
        ("PartitionDown", "other", True),
        ("PartitionInactive", "other", True),
        ("BadConstraints", "other", True),
        ("PartitionTimeLimit", "limit", True),
        ("AssocGrpGRES", "limit", False),
        ("QOSGrpCpuLimit", "limit", False),
        ("AssocMaxSubmitJobLimit", "limit", False),  # the master's own, before sbatch
        ("SlurmControllerUnavailable", "other", False),
        ("BeginTime", "other", False),
        (None, None, False),
        ("None", None, False),
    ],
)
def test_documented_reasons(reason: str | None, klass: str | None, stuck: bool) -> None:
    assert (classify(reason), is_stuck(reason)) == (klass, stuck)


def test_jobs_ahead_in_a_shared_queue() -> None:
    """Every user's pending jobs as ``squeue --states=PENDING --format=%i|%P|%Q`` prints them: ahead of a job
    are those in one of its partitions with a higher priority, or the same one and an earlier id."""
    queue = parse_queue(
        "10|batch|1000\n11|batch,short|2000\n12|batch|1000\n13|short|5000\n14_[1-3]|batch|1500\nbroken line\n"
    )
    assert [q[0] for q in queue] == ["10", "11", "12", "13", "14_[1-3]"]
    assert jobs_ahead(["10", "12", "13", "99"], queue) == {"10": 2, "12": 3, "13": 0}
