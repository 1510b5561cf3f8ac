"""Parsers against REAL output captured from the local Slurm 22.05 cluster (tests/unit/captured/, edge cases
noted in each file's comments)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from hpc_master.errors import SlurmError
from slurm_backend.parse import (
    parse_exit_code,
    parse_sacct,
    parse_sbatch_parsable,
    parse_scontrol_fields,
    parse_scontrol_job,
    parse_squeue,
)
from slurm_backend.states import Outcome

CAPTURED = Path(__file__).parent / "captured"


def captured(name: str) -> str:
    return "".join(
        line for line in (CAPTURED / name).read_text().splitlines(True) if not line.startswith("#")
    )


def test_sbatch_parsable() -> None:
    assert parse_sbatch_parsable(captured("sbatch_parsable.txt")) == "1"
    assert parse_sbatch_parsable("123;cluster\n") == "123"
    with pytest.raises(SlurmError, match="not a job id"):
        parse_sbatch_parsable("Submitted batch job 5\n")
    with pytest.raises(SlurmError, match="no job id"):
        parse_sbatch_parsable("")


def test_squeue() -> None:
    jobs = parse_squeue(captured("squeue.txt"))
    assert {j: s.outcome for j, s in jobs.items()} == {
        "1": Outcome.SUCCEEDED,
        "2": Outcome.FAILED,
        "3": Outcome.CANCELLED,
        "4": Outcome.FAILED,
        "5": Outcome.UNSCHEDULABLE,
        "6": Outcome.PREEMPTED,
        "7": Outcome.PREEMPTED,
        "8": Outcome.SUCCEEDED,
        "9": Outcome.RUNNING,
        "10": Outcome.RUNNING,
        "30": Outcome.UNSCHEDULABLE,
    }
    assert jobs["5"].reason == "PartitionTimeLimit"
    assert jobs["5"].start_time is None and jobs["5"].node_list == ""
    assert jobs["2"].reason == "NonZeroExitCode" and jobs["2"].exit_code is None  # squeue has no exit code
    assert jobs["1"].reason is None
    assert jobs["10"].node_list == "node[1-2]"
    assert jobs["9"].start_time == datetime(2026, 11, 22, 18, 1, 59)
    assert all(s.source == "squeue" for s in jobs.values())


def test_squeue_rejects_a_line_in_another_format() -> None:
    with pytest.raises(SlurmError, match="unexpected squeue line"):
        parse_squeue("             JOBID PARTITION     NAME\n")


def test_sacct_folds_steps_into_jobs() -> None:
    jobs = parse_sacct(captured("sacct.txt"))
    assert set(jobs) == {*(str(i) for i in range(1, 9)), "31", "55"}
    assert (jobs["31"].outcome, jobs["31"].node_list) == (
        Outcome.SUCCEEDED,
        "node[1-2]",
    )  # the job line, not a step
    assert (jobs["55"].outcome, jobs["55"].exit_code, jobs["55"].exit_signal) == (Outcome.TIMED_OUT, 0, None)
    assert (jobs["1"].outcome, jobs["1"].exit_code) == (Outcome.SUCCEEDED, 0)
    assert (jobs["2"].outcome, jobs["2"].exit_code) == (Outcome.FAILED, 3)
    assert (jobs["3"].outcome, jobs["3"].slurm_state) == (
        Outcome.CANCELLED,
        "CANCELLED",
    )  # "CANCELLED by 1001"
    assert (jobs["4"].outcome, jobs["4"].exit_code, jobs["4"].exit_signal) == (Outcome.FAILED, 0, 9)
    assert jobs["4"].message == "FAILED (signal 9)"
    # sacct's pending reason differs from squeue's (PartitionConfig vs PartitionTimeLimit); both never resolve.
    assert (jobs["5"].outcome, jobs["5"].reason, jobs["5"].node_list) == (
        Outcome.UNSCHEDULABLE,
        "PartitionConfig",
        "",
    )
    assert jobs["5"].start_time is None
    assert jobs["7"].outcome is Outcome.PREEMPTED and jobs["7"].node_list == "node2"


def test_sacct_step_out_of_memory_marks_the_job_oom() -> None:
    # Not seen on this cluster (no cgroup plugin: OverMemoryKill gives FAILED 0:9); the cgroup form, per sacct(1).
    text = "12|FAILED|0:125|0:0|None|node1|2026-11-22T18:01:19|2026-11-22T18:01:24\n"
    text += "12.batch|OUT_OF_MEMORY|0:125|||node1|2026-11-22T18:01:19|2026-11-22T18:01:24\n"
    assert parse_sacct(text)["12"].outcome is Outcome.OOM


def test_sacct_derived_exit_code_when_a_step_failed() -> None:
    text = "13|COMPLETED|0:0|2:0|None|node1|2026-11-22T18:01:19|2026-11-22T18:01:24\n"
    assert parse_sacct(text)["13"].exit_code == 2


def test_scontrol() -> None:
    lines = [line for line in captured("scontrol.txt").splitlines() if line]
    jobs = {s.job_id: s for s in map(parse_scontrol_job, lines)}
    assert (jobs["2"].outcome, jobs["2"].exit_code, jobs["2"].reason) == (
        Outcome.FAILED,
        3,
        "NonZeroExitCode",
    )
    assert (jobs["3"].outcome, jobs["3"].exit_signal) == (Outcome.CANCELLED, 15)
    assert (jobs["5"].outcome, jobs["5"].reason, jobs["5"].exit_code) == (
        Outcome.UNSCHEDULABLE,
        "PartitionTimeLimit",
        None,
    )
    assert jobs["7"].outcome is Outcome.PREEMPTED
    fields = parse_scontrol_fields(lines[0])
    assert fields["Command"] == "/var/tmp/hpc-det-tests/cap/a.sh 1 3"  # a value with spaces
    assert fields["AllocNode:Sid"] == "localhost:23145"
    assert fields["Power"] == ""


def test_scontrol_comment_with_equals_signs() -> None:
    fields = parse_scontrol_fields("JobId=5 JobName=x Comment=hpc-det:exp=3,trial=7,run=2 JobState=RUNNING")
    assert fields["Comment"] == "hpc-det:exp=3,trial=7,run=2"
    assert fields["JobState"] == "RUNNING"


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("3:0", (3, None)), ("0:15", (0, 15)), ("0:0", (0, None)), ("", (None, None)), ("x", (None, None))],
)
def test_exit_codes(text: str, parsed: tuple[int | None, int | None]) -> None:
    assert parse_exit_code(text) == parsed
