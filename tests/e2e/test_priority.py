"""Determined's ``resources.priority`` and ``max_slots`` on the real cluster (docs/priority.md).

- Two experiments of three 1-GPU trials compete for the cluster's four GPUs while a blocker holds them: when
  it ends, the higher-priority one's jobs (``--nice`` from the priority) all start, though submitted after
  the other's, and two of the other's wait; ``PATCH`` of the priority (``det e set priority``) re-nices the
  pending jobs in Slurm.
- A job at the default priority competes as a plain ``sbatch`` does: it starts in its place in the queue,
  before another account's jobs submitted after it.
- ``max_slots: 1`` runs a 3-trial grid one job at a time: Slurm's own start and end times never overlap.
"""

from __future__ import annotations

import datetime as dt
import itertools
import subprocess

import pytest

from tests.e2e.conftest import Master
from tests.slurm.fixtures import Researcher, wait_for

# exclusive: measures the order in which jobs start, which other jobs would change
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.exclusive]
DONE = {"STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED"}
PAIR = """
name: e2e-priority-NAME
entrypoint: python3 train.py
hyperparameters:
  increment_by: {type: categorical, vals: [1, 2, 3]}
  sleep_s: 0.3
searcher: {name: grid, metric: validation_loss, max_length: {batches: 10}}
resources: {slots_per_trial: 1, priority: PRIORITY}
max_restarts: 0
"""
CAPPED = """
name: e2e-max-slots
entrypoint: python3 train.py
hyperparameters:
  increment_by: {type: categorical, vals: [1, 2, 3]}
  sleep_s: 0.05
searcher: {name: grid, metric: validation_loss, max_length: {batches: 10}}
resources: {slots_per_trial: 1, max_slots: 1}
max_restarts: 0
"""


def _squeue(job_ids: list[str]) -> dict[str, tuple[str, int]]:
    """Slurm's (state, nice) of each job."""
    out = subprocess.run(
        ["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i %T %y"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {i: (state, int(nice)) for i, state, nice in (line.split() for line in out.splitlines())}


def _jobs(master: Master, headers: dict[str, str], exp: int) -> list[str]:
    jobs = []
    for t in master.trials(headers, exp):
        trial = master.api("GET", f"/trials/{t['id']}", headers)["trial"]
        jobs += [r["slurmJobId"] for r in trial.get("runs", []) if r.get("slurmJobId")]
    return jobs


def test_the_higher_priority_experiment_starts_first_and_set_priority_renices(
    master: Master, alice: dict[str, str]
) -> None:
    # Every GPU of both nodes, held by another job of the researcher's.
    argv = ["sbatch", "--parsable", "-N", "2", "--gres=gpu:2", "-p", "batch", "-o", "/dev/null",
            "--wrap", "sleep 300"]  # fmt: skip
    blocker = master.researcher.run(argv).stdout.strip().split(";")[0]
    try:
        wait_for(lambda: _squeue([blocker])[blocker][0] == "RUNNING", 60, "the blocker to run")
        low = master.create_experiment(alice, PAIR.replace("NAME", "low").replace("PRIORITY", "60"))
        low_jobs = wait_for(lambda: (j := _jobs(master, alice, low)) and len(j) == 3 and j, 90, "low's jobs")
        high = master.create_experiment(alice, PAIR.replace("NAME", "high").replace("PRIORITY", "5"))
        high_jobs = wait_for(
            lambda: (j := _jobs(master, alice, high)) and len(j) == 3 and j, 90, "high's jobs"
        )
        seen = _squeue(low_jobs + high_jobs)
        assert {j: n for j, (_, n) in seen.items()} == {
            **dict.fromkeys(low_jobs, 180),  # (60 - 42) x 10
            **dict.fromkeys(high_jobs, 0),  # above the default: as a plain sbatch
        }
        assert max(map(int, low_jobs)) < min(map(int, high_jobs))  # low's were submitted first

        master.api("PATCH", f"/experiments/{low}", alice, json={"resources": {"priority": 70}})
        wait_for(
            lambda: all(n == 280 for _, n in _squeue(low_jobs).values()), 30, "low's pending jobs re-niced"
        )
        config = master.experiment(alice, low)["config"]
        assert config["resources"]["priority"] == 70
    finally:
        subprocess.run(["scancel", blocker], check=False)

    # Four GPUs free: high's three jobs start, and one of low's; low's other two wait for a GPU.
    def four_running() -> dict[str, str] | None:
        states = {j: st for j, (st, _) in _squeue(low_jobs + high_jobs).items()}
        return states if sum(st == "RUNNING" for st in states.values()) >= 4 else None

    states = wait_for(four_running, 60, "four jobs running")
    assert all(states[j] == "RUNNING" for j in high_jobs), (states, master.diagnose(high))
    assert sum(states[j] == "PENDING" for j in low_jobs) == 2, states
    for exp in (high, low):
        assert master.wait_state(alice, exp, DONE, 180) == "STATE_COMPLETED", master.diagnose(exp)
    starts = _sacct_times(low_jobs + high_jobs)
    assert max(starts[j][0] for j in high_jobs) <= sorted(starts[j][0] for j in low_jobs)[1]
    print(f"priority 5 vs 60: {len(high_jobs)} of {len(high_jobs)} started first; low re-niced 180 -> 280")


SINGLE = """
name: e2e-priority-default
entrypoint: python3 train.py
hyperparameters: {increment_by: 1, sleep_s: 0.3}
searcher: {name: single, metric: validation_loss, max_length: {batches: 20}}
resources: {slots_per_trial: 1}
max_restarts: 0
"""


def test_a_job_at_the_default_priority_competes_like_a_plain_sbatch(
    master: Master, alice: dict[str, str], other_researcher: Researcher
) -> None:
    """Another account queues 1-GPU jobs before and after our trial's job while a blocker holds every GPU:
    when the GPUs free up, the four jobs first in the queue start, ours among them (nice 0), before the other
    account's jobs submitted after it. (At nice 410, the former default, ours started last.)"""
    argv = ["sbatch", "--parsable", "-N", "2", "--gres=gpu:2", "-p", "batch", "-o", "/dev/null",
            "--wrap", "sleep 300"]  # fmt: skip
    blocker = master.researcher.run(argv).stdout.strip().split(";")[0]
    plain = ["sbatch", "--parsable", "--gres=gpu:1", "-p", "batch", "-t", "2", "-o", "/dev/null",
             "--wrap", "sleep 20"]  # fmt: skip
    try:
        wait_for(lambda: _squeue([blocker])[blocker][0] == "RUNNING", 60, "the blocker to run")
        before = other_researcher.run(plain).stdout.strip().split(";")[0]
        exp = master.create_experiment(alice, SINGLE)
        (ours,) = wait_for(lambda: _jobs(master, alice, exp), 90, "our trial's job")
        after = [other_researcher.run(plain).stdout.strip().split(";")[0] for _ in range(4)]
        queued = _squeue([before, ours, *after])
        assert queued[ours] == ("PENDING", 0), queued  # as a plain sbatch of its user
    finally:
        subprocess.run(["scancel", blocker], check=False)

    def four_running() -> dict[str, str] | None:
        states = {j: st for j, (st, _) in _squeue([before, ours, *after]).items()}
        return states if sum(st == "RUNNING" for st in states.values()) >= 4 else None

    states = wait_for(four_running, 60, "four jobs running")
    assert states[before] == "RUNNING" and states[ours] == "RUNNING", states
    assert [states[j] for j in after] == ["RUNNING", "RUNNING", "PENDING", "PENDING"], states
    assert master.wait_state(alice, exp, DONE, 180) == "STATE_COMPLETED", master.diagnose(exp)
    subprocess.run(["scancel", *after], check=False)
    print(f"default priority: our job {ours} started in its place, before {after[2:]} submitted after it")


def _sacct_times(job_ids: list[str]) -> dict[str, tuple[dt.datetime, dt.datetime]]:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", ",".join(job_ids), "-o", "JobID,Start,End"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    times: dict[str, tuple[dt.datetime, dt.datetime]] = {}
    for line in out.splitlines():
        job, start, end = line.split("|")
        times[job] = (dt.datetime.fromisoformat(start), dt.datetime.fromisoformat(end))
    return times


def test_max_slots_runs_one_job_at_a_time(master: Master, alice: dict[str, str]) -> None:
    exp = master.create_experiment(alice, CAPPED)
    most_live = 0

    def done() -> bool:
        nonlocal most_live
        most_live = max(most_live, len(master.live_job_ids()))
        return master.experiment(alice, exp)["state"] in DONE

    wait_for(done, 240, "the capped grid to finish", interval_s=0.2)
    assert master.experiment(alice, exp)["state"] == "STATE_COMPLETED", master.diagnose(exp)
    jobs = _jobs(master, alice, exp)
    assert len(jobs) == 3 and most_live == 1
    spans = sorted(_sacct_times(jobs).values())
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans  # never two at once
    print(f"max_slots 1: {len(jobs)} jobs, most live at once {most_live}")
