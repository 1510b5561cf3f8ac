"""The scripted cluster (`slurm_backend.fake`) says what Slurm says: its texts are the recorded ones, its
outputs go through the real parsers, and `SlurmCli` reads its failures as it reads the real cluster's:
wait (controller down, a submit limit) or no (a refusal)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_master.errors import SlurmError
from slurm_backend import fake
from slurm_backend.cli import (
    CommandResult,
    SlurmCli,
    SlurmUnavailableError,
    SubmitLimitError,
    SubmitRefusedError,
    classify_policy_refusal,
)
from slurm_backend.fake import FakeCluster
from slurm_backend.parse import parse_sacct, parse_scontrol_job, parse_squeue
from slurm_backend.poller import Poller
from slurm_backend.states import Outcome

CAPTURED = Path(__file__).parent / "captured"
SCRIPT = """#!/bin/bash
#SBATCH --job-name=det-exp1-trial1
#SBATCH --comment=hpc-det:abc:exp=1,trial=1,run=1
#SBATCH --output=/tmp/x/%j.log
#SBATCH --qos=limqos
#SBATCH --no-requeue

set -eu
exec true
"""


def captured_lines(name: str) -> set[str]:
    return {line.rstrip("\n") for line in (CAPTURED / name).read_text().splitlines()}


def make(**kwargs: object) -> tuple[FakeCluster, SlurmCli]:
    cluster = FakeCluster(sleep=lambda _s: None, **kwargs)  # type: ignore[arg-type]
    return cluster, SlurmCli(runner=cluster, sleep=lambda _s: None)


@pytest.mark.parametrize(
    ("text", "captured"),
    [
        (fake.SBATCH_UNREACHABLE, "controller_down.txt"),
        (fake.LOAD_JOBS_UNREACHABLE, "controller_down.txt"),
        (fake.SCANCEL_UNREACHABLE.format(job_id=12), "controller_down.txt"),
        (fake.SCANCEL_INVALID.format(job_id=99999), "controller_down.txt"),
        (fake.SBATCH_LIMIT.format(limit="AssocMaxSubmitJobLimit"), "sbatch_refusals.txt"),
        (fake.SBATCH_LIMIT.format(limit="QOSMaxSubmitJobPerUserLimit"), "sbatch_refusals.txt"),
        (fake.SBATCH_BAD_ACCOUNT, "sbatch_refusals.txt"),
        (fake.INVALID_JOB_ID, "squeue_unknown_job.stderr.txt"),
    ],
)
def test_the_fakes_words_are_the_recorded_ones(text: str, captured: str) -> None:
    assert set(text.rstrip("\n").splitlines()) <= captured_lines(captured)


def test_recorded_refusals_mean_wait_or_no() -> None:
    blocks = (CAPTURED / "sbatch_refusals.txt").read_text().split("## ")[1:]
    stderrs = ["\n".join(b.splitlines()[1:]) for b in blocks]
    policy = [s for s in stderrs if "accounting/QOS policy" in s]
    assert [classify_policy_refusal(s) for s in policy] == [
        "AssocMaxSubmitJobLimit",
        "QOSMaxSubmitJobPerUserLimit",
        None,  # QOSMaxWallDurationPerJobLimit with DenyOnLimit: the same policy line, but never frees up
    ]


@pytest.mark.parametrize(
    ("stderr", "error", "words"),
    [
        (
            fake.SBATCH_LIMIT.format(limit="AssocMaxSubmitJobLimit"),
            SubmitLimitError,
            "AssocMaxSubmitJobLimit",
        ),
        (
            fake.SBATCH_LIMIT.format(limit="QOSMaxWallDurationPerJobLimit"),
            SubmitRefusedError,
            "DurationPerJob",
        ),
        (fake.SBATCH_BAD_ACCOUNT, SubmitRefusedError, "Invalid account"),
        (fake.SBATCH_UNREACHABLE, SlurmUnavailableError, "Unable to contact"),
        (fake.SBATCH_TIMED_OUT, SlurmUnavailableError, "Socket timed out"),
    ],
)
def test_sbatch_failures_are_classified(stderr: str, error: type[Exception], words: str) -> None:
    calls: list[str] = []

    def runner(argv: object, stdin: object, timeout_s: object, env: object) -> CommandResult:
        calls.append(stderr)
        return CommandResult(1, "", stderr)

    with pytest.raises(error, match=words) as e:
        SlurmCli(runner=runner, sleep=lambda _s: None).submit(SCRIPT)
    if isinstance(e.value, SlurmUnavailableError):
        assert e.value.ambiguous == ("timed out" in stderr)
        assert len(calls) == (1 if e.value.ambiguous else 5)  # an unsent submission is retried
    else:
        assert len(calls) == 1


def test_jobs_go_through_the_real_parsers() -> None:
    cluster, cli = make()
    job_id = cli.submit(SCRIPT)
    job = cluster.job(job_id)
    assert (job.comment, job.qos, job.name) == (
        "hpc-det:abc:exp=1,trial=1,run=1",
        "limqos",
        "det-exp1-trial1",
    )
    assert cli.squeue([job_id])[job_id].outcome is Outcome.PENDING
    cluster.start(job_id, "node2")
    cluster.advance(5)
    assert cli.squeue([job_id])[job_id].node_list == "node2"
    cluster.fail(job_id, 3)
    acct = cli.sacct([job_id])
    assert acct is not None and (acct[job_id].outcome, acct[job_id].exit_code) == (Outcome.FAILED, 3)
    shown = cli.show_job(job_id)
    assert shown is not None and (shown.outcome, shown.exit_code) == (Outcome.FAILED, 3)
    assert cli.find_by_comment("hpc-det:abc:exp=1,trial=1,run=1") == [job_id]
    for runner_out, parser in (
        (cluster(["squeue", "--noheader", "--states=all", f"--jobs={job_id}"], None, 1, {}), parse_squeue),
        (cluster(["sacct", f"--jobs={job_id}"], None, 1, {}), parse_sacct),
        (cluster(["scontrol", "-o", "show", "job", job_id], None, 1, {}), parse_scontrol_job),
    ):
        assert parser(runner_out.stdout)


def test_ended_states_as_captured() -> None:
    cluster, cli = make()
    ids = [cli.submit(SCRIPT) for _ in range(5)]
    for job_id in ids:
        cluster.start(job_id)
    cluster.preempt(ids[0])
    cluster.time_out(ids[1])
    cluster.node_fail(ids[2])
    cluster.oom(ids[3])
    cli.cancel(ids[4])
    acct = cli.sacct(ids)
    assert acct is not None
    assert [acct[j].outcome for j in ids] == [
        Outcome.PREEMPTED, Outcome.TIMED_OUT, Outcome.NODE_FAILED, Outcome.OOM, Outcome.CANCELLED
    ]  # fmt: skip
    lines = cluster(["sacct", f"--jobs={ids[4]}"], None, 1, {}).stdout
    assert f"{ids[4]}|CANCELLED by 0|" in lines  # as sacct names who cancelled


def test_limits_refuse_and_keep_pending_with_slurms_reasons() -> None:
    cluster, cli = make(slots=1)
    cluster.max_submit_jobs["root"] = 2
    a, b = cli.submit(SCRIPT), cli.submit(SCRIPT)
    with pytest.raises(SubmitLimitError) as e:
        cli.submit(SCRIPT)
    assert e.value.reason == "AssocMaxSubmitJobLimit"
    cluster.schedule()
    assert {j: s.reason for j, s in cli.squeue([a, b]).items()} == {a: None, b: "Resources"}
    cluster.complete(a)
    assert cli.submit(SCRIPT)  # a place freed up
    del cluster.max_submit_jobs["root"]
    cluster.qos_max_submit_per_user["limqos"] = 2
    with pytest.raises(SubmitLimitError, match="QOSMaxSubmitJobPerUserLimit"):
        cli.submit(SCRIPT)


def test_controller_down_and_back() -> None:
    cluster, cli = make()
    job_id = cli.submit(SCRIPT)
    cluster.start(job_id)
    cluster.kill_controller()
    for call in (lambda: cli.squeue([job_id]), lambda: cli.submit(SCRIPT), lambda: cli.cancel(job_id)):
        with pytest.raises(SlurmUnavailableError):
            call()
    assert cli.sacct([job_id]) is not None  # slurmdbd still answers
    cluster.restart_controller(forget_recent_s=10)  # started a moment ago: its start was never saved
    assert cli.squeue([job_id])[job_id].outcome is Outcome.PENDING
    cluster.schedule()
    assert cluster.job(job_id).starts == 2


def test_missing_once_then_back_and_min_job_age() -> None:
    cluster, cli = make(min_job_age_s=300)
    job_id = cli.submit(SCRIPT)
    cluster.hide_from_squeue_once(job_id)
    assert cli.squeue([job_id, "999"]) == {}
    assert job_id in cli.squeue([job_id, "999"])
    cluster.complete(job_id)
    cluster.advance(301)
    assert cli.squeue([job_id]) == {}  # slurmctld forgot it; sacct did not
    acct = cli.sacct([job_id])
    assert acct is not None and acct[job_id].outcome is Outcome.SUCCEEDED


def test_latency_is_spent_outside_the_lock() -> None:
    slept: list[float] = []
    cluster = FakeCluster(sleep=slept.append)
    cluster.latency_s = 2.5
    SlurmCli(runner=cluster).squeue(["1"])
    assert slept == [2.5]


def test_poller_declares_a_job_lost_only_after_its_grace_period() -> None:
    cluster, cli = make()
    job_id = cli.submit(SCRIPT)
    cluster.start(job_id)
    poller = Poller(cli, interval_s=10, lost_after_s=120, clock=cluster.monotonic)
    poller.watch(job_id)
    assert poller.poll()[job_id].outcome is Outcome.RUNNING
    cluster.forget(job_id, accounting=True)  # sacct still says RUNNING: stale, not an end
    for _ in range(12):
        cluster.advance(10)
        assert poller.poll()[job_id].outcome is Outcome.UNKNOWN
    cluster.kill_controller()  # an outage restarts the count: nothing is lost while Slurm cannot answer
    cluster.advance(10)
    poller.poll()
    cluster.restart_controller()
    for _ in range(12):
        cluster.advance(60)
        status = poller.poll(force=True)[job_id]
        if status.outcome is Outcome.LOST:
            break
    assert status.outcome is Outcome.LOST and "missing from squeue for 120 s" in str(status.reason)
    assert cluster.monotonic() >= 10 * 13 + 120


def test_unknown_commands_are_not_found() -> None:
    cluster, cli = make()
    with pytest.raises(SlurmError, match="not found"):
        cli.run(["sinfo"])
    assert cluster.count("sinfo") == 0
