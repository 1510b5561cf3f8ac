"""The Slurm state table: complete, explicit, and safe for states it does not know."""

from __future__ import annotations

import logging

import pytest

from slurm_backend.states import STATE_OUTCOMES, JobStatus, Outcome, outcome_for, reason_never_resolves

# squeue(1) "JOB STATE CODES", Slurm 22.05.
SLURM_22_05_STATES = [
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "CONFIGURING",
    "COMPLETING",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PENDING",
    "PREEMPTED",
    "RUNNING",
    "RESV_DEL_HOLD",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "REQUEUED",
    "RESIZING",
    "REVOKED",
    "SIGNALING",
    "SPECIAL_EXIT",
    "STAGE_OUT",
    "STOPPED",
    "SUSPENDED",
    "TIMEOUT",
]


def test_every_slurm_state_is_in_the_table() -> None:
    assert sorted(STATE_OUTCOMES) == sorted(SLURM_22_05_STATES)


@pytest.mark.parametrize(
    ("state", "outcome"),
    [
        ("PENDING", Outcome.PENDING),
        ("CONFIGURING", Outcome.RUNNING),
        ("RUNNING", Outcome.RUNNING),
        ("COMPLETING", Outcome.RUNNING),
        ("COMPLETED", Outcome.SUCCEEDED),
        ("FAILED", Outcome.FAILED),
        ("TIMEOUT", Outcome.TIMED_OUT),
        ("PREEMPTED", Outcome.PREEMPTED),
        ("NODE_FAIL", Outcome.NODE_FAILED),
        ("BOOT_FAIL", Outcome.NODE_FAILED),
        ("OUT_OF_MEMORY", Outcome.OOM),
        ("CANCELLED", Outcome.CANCELLED),
        ("CANCELLED by 1001", Outcome.CANCELLED),
        ("CANCELLED by 0", Outcome.CANCELLED),
        ("REQUEUED", Outcome.PENDING),
        ("DEADLINE", Outcome.FAILED),
        ("SUSPENDED", Outcome.RUNNING),
        ("REVOKED", Outcome.CANCELLED),
    ],
)
def test_state_outcomes(state: str, outcome: Outcome) -> None:
    assert outcome_for(state) is outcome


def test_unknown_state_is_non_terminal_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        outcome = outcome_for("FROBNICATED", "Whatever")
    assert outcome is Outcome.UNKNOWN and not outcome.is_terminal
    assert "unknown Slurm job state 'FROBNICATED'" in caplog.text


@pytest.mark.parametrize(
    "reason",
    [
        "PartitionTimeLimit",  # provoked: -p short --time=5 (MaxTime 2)
        "PartitionNodeLimit",  # provoked: -N 5 on a 3-node partition
        "PartitionConfig",  # sacct's reason for the PartitionTimeLimit job
        "BadConstraints",
        "InvalidAccount",
        "InvalidQOS",
        "DependencyNeverSatisfied",
        "QOSMaxWallDurationPerJobLimit",
        "QOSMaxGRESPerJob",
        "AssocMaxCpuPerJobLimit",
        "QOSMinGRES",
    ],
)
def test_pending_reasons_that_never_resolve(reason: str) -> None:
    assert reason_never_resolves(reason)
    assert outcome_for("PENDING", reason) is Outcome.UNSCHEDULABLE
    assert Outcome.UNSCHEDULABLE.is_terminal


@pytest.mark.parametrize(
    "reason",
    [
        None,
        "None",
        "Resources",
        "Priority",
        "BeginTime",
        "Dependency",
        "ReqNodeNotAvail, UnavailableNodes:node3",
        "PartitionDown",
        "JobHeldUser",
        "JobHeldAdmin",
        "AssocMaxJobsLimit",
        "QOSMaxJobsPerUserLimit",
        "AssocGrpGRES",
    ],
)
def test_pending_reasons_that_may_resolve(reason: str | None) -> None:
    assert outcome_for("PENDING", reason) is Outcome.PENDING


def test_reason_only_matters_while_pending() -> None:
    assert outcome_for("CANCELLED", "PartitionTimeLimit") is Outcome.CANCELLED


def test_terminal_set() -> None:
    assert {o for o in Outcome if not o.is_terminal} == {Outcome.PENDING, Outcome.RUNNING, Outcome.UNKNOWN}


def test_status_message() -> None:
    s = JobStatus("1", Outcome.UNSCHEDULABLE, "PENDING", reason="PartitionTimeLimit")
    assert s.message == "UNSCHEDULABLE: PartitionTimeLimit"
    assert JobStatus("2", Outcome.FAILED, "FAILED", reason="NonZeroExitCode", exit_code=3).message == (
        "FAILED (exit 3): NonZeroExitCode"
    )
