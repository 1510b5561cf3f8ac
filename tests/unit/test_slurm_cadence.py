"""The poller's cadence under slurmctld's per-user RPC rate limit (Slurm ≥ 23.02, `rl_enable`).

The local cluster runs Slurm 22.05, which has no rate limit: the poller here runs against `FakeCluster` with
`RpcRateLimit`, a model of slurmctld's token buckets and of its client's sleep-and-ask-again, on a fake clock.
What `squeue -v` prints was recorded on the local cluster (captured/squeue_verbose*.txt)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_backend.cadence import PollCadence, backoffs
from slurm_backend.cli import SlurmCli, without_verbose
from slurm_backend.fake import FakeCluster
from slurm_backend.fake_ratelimit import RpcRateLimit, backoff_line
from slurm_backend.parse import parse_squeue
from slurm_backend.poller import AHEAD_EVERY_S, Poller
from slurm_backend.states import Outcome

CAPTURED = Path(__file__).parent / "captured"
SERVICE_UID = 998
SCRIPT = "#!/bin/bash\n#SBATCH --job-name=det-exp1-trial1\n#SBATCH --output=/tmp/x/%j.log\nsleep 1\n"


def _submit_as(cluster: FakeCluster, user: str) -> str:
    """A job of `user`'s, submitted by her own sbatch (her RPC, her bucket)."""
    argv = ["runuser", "-u", user, "--", "sbatch", "--parsable"]
    return cluster(argv, SCRIPT, 30.0, {}).stdout.strip()


def test_squeue_v_stdout_is_its_answer_once_what_v_adds_is_gone() -> None:
    recorded = (CAPTURED / "squeue_verbose.txt").read_text()
    with pytest.raises(Exception, match="unexpected squeue line"):
        parse_squeue(recorded)
    jobs = parse_squeue(without_verbose(recorded))
    assert list(jobs) == ["1"] and jobs["1"].outcome is Outcome.PENDING


def test_backoffs_are_counted_from_the_client_s_lines_and_nothing_else() -> None:
    plugins = (CAPTURED / "squeue_verbose.stderr.txt").read_text()
    assert backoffs(plugins) == 0
    assert backoffs(plugins + backoff_line("squeue", 1) + backoff_line("squeue", 2)) == 2


def test_the_cadence_doubles_when_told_to_back_off_and_eases_back_5_percent_per_clean_answer() -> None:
    c = PollCadence(5.0, 60.0)
    assert [c.answered(1) for _ in range(5)] == [10, 20, 40, 60, 60]
    assert c.stretched
    assert c.answered(0) == pytest.approx(57) and c.answered(0) == pytest.approx(54.15)
    clean = 2
    while c.stretched:
        c.answered(0)
        clean += 1
    assert clean == 49 and c.current_s == 5  # back in 49 answers without backoff, never below the interval
    assert c.failed(1) == 10 and c.failed(5) == 60


def _service_cluster(limit: RpcRateLimit) -> FakeCluster:
    uids = {"root": 0, "hpc-det": SERVICE_UID}
    cluster = FakeCluster(master_user="hpc-det", uid=lambda u: uids.get(u, 1001))
    cluster.sleep = cluster.advance  # the client's sleeps between backoffs pass on the fake clock
    cluster.rate_limit = limit
    return cluster


def _run_the_loop(poller: Poller, cluster: FakeCluster, ids: list[str], minutes: float) -> None:
    """The master's loop: every 2 s it asks the poller for all live jobs (which asks Slurm when due)."""
    end = cluster.monotonic() + minutes * 60
    while cluster.monotonic() < end:
        poller.watch_all(ids)
        poller.poll()
        cluster.advance(2)


def _an_hour_under(limit: RpcRateLimit, *, adapts: bool) -> tuple[int, int, Poller]:
    """(RPCs told to back off, RPCs served) in an hour of polling 8 jobs, after 10 minutes to empty the bucket."""
    cluster = _service_cluster(limit)
    cli = SlurmCli(runner=cluster, sleep=cluster.advance)
    ids = [_submit_as(cluster, "alice") for _ in range(8)]
    poller = Poller(cli, 5.0, max_backoff_s=60.0 if adapts else 5.0, clock=cluster.monotonic)
    _run_the_loop(poller, cluster, ids, minutes=10)
    told, served = limit.told_to_back_off, limit.served
    _run_the_loop(poller, cluster, ids, minutes=60)
    return limit.told_to_back_off - told, limit.served - served, poller


def test_a_rate_limited_master_polls_slower_and_is_seldom_told_to_back_off() -> None:
    """One site's limit (40 tokens, refilled by 4 a minute) against the default 5 s poll: 12 squeues a minute
    cannot fit. Both pollers get the refill's 4 answers a minute (squeue waits for its token); the adaptive one
    asks at about that rate, one that keeps its cadence (max = interval) is told to back off ~10× as often."""
    site = {"bucket_size": 40, "refill_rate": 4, "refill_period_s": 60}
    told, served, poller = _an_hour_under(RpcRateLimit(**site), adapts=True)  # type: ignore[arg-type]
    fixed_told, fixed_served, _ = _an_hour_under(RpcRateLimit(**site), adapts=False)  # type: ignore[arg-type]
    assert served <= 4 * 60 + 1 and fixed_served <= 4 * 60 + 1  # nobody gets past the refill
    assert told * 3 <= served, (told, served)
    assert told * 5 <= fixed_told, (told, fixed_told)
    assert poller.cadence.stretched

    # Slurm's defaults with rl_enable (30 tokens, 2 a second): never told to back off, the master polls at
    # every tick of its loop (watching its live jobs asks for a poll while Slurm answers at once), and counts
    # the jobs ahead of its pending ones every AHEAD_EVERY_S (one squeue of the pending queue).
    told, served, poller = _an_hour_under(RpcRateLimit(), adapts=True)
    ahead = _pending_queue_asked(poller)  # over the 70 minutes
    assert 0 < ahead <= 70 * 60 / AHEAD_EVERY_S + 1
    assert (
        told == 0 and 60 * 30 < served <= 60 * 30 + 3600 / AHEAD_EVERY_S + 1 and not poller.cadence.stretched
    )


def test_a_new_job_does_not_jump_a_stretched_cadence_and_root_is_never_limited() -> None:
    limit = RpcRateLimit(bucket_size=2, refill_rate=1, refill_period_s=30)
    cluster = _service_cluster(limit)
    cli = SlurmCli(runner=cluster, sleep=cluster.advance)
    poller = Poller(cli, 5.0, clock=cluster.monotonic)
    first = _submit_as(cluster, "alice")
    while not poller.cadence.stretched:
        cluster.advance(5)
        poller.watch(first)
        poller.poll()
    squeues = cluster.count("squeue")
    poller.watch(_submit_as(cluster, "alice"))
    poller.poll()
    assert cluster.count("squeue") == squeues  # asked at its stretched time, not at once

    root = FakeCluster()
    root.rate_limit = RpcRateLimit(bucket_size=1, refill_rate=1, refill_period_s=3600)
    root_cli = SlurmCli(runner=root)
    for _ in range(5):
        root_cli.squeue([root_cli.submit(SCRIPT)])
    assert root.rate_limit.told_to_back_off == 0


def test_the_fake_squeue_v_prints_what_the_real_one_does_around_its_answer() -> None:
    recorded = (CAPTURED / "squeue_verbose.txt").read_text().splitlines()
    cluster = FakeCluster()
    job = SlurmCli(runner=cluster).submit(SCRIPT)
    out = cluster(["squeue", "-v", "--noheader", f"--jobs={job}"], None, 30.0, {}).stdout.splitlines()
    assert (
        out[0] == recorded[0]
        and out[-2].startswith("last_update_time=")
        and recorded[-2].startswith("last_update_time=")
    )
    assert list(parse_squeue(without_verbose("\n".join(out) + "\n"))) == [job]


def _pending_queue_asked(poller: Poller) -> int:
    cluster = poller.cli.runner
    return sum(1 for c in cluster.calls if "squeue" in c.argv[:5] and "--states=PENDING" in c.argv)  # type: ignore[attr-defined]
