"""Time limits, node failures and impossible requests, on the real cluster.

- A trial longer than its partition's time limit completes as a chain of jobs: `--signal=B:USR1@lead`
  makes it checkpoint and exit before the limit, and the master resubmits it from that checkpoint.
- A node that dies mid-trial (its slurmd and processes killed) ends the job with NODE_FAIL; the trial
  restarts from its latest checkpoint, and with no restarts left it ends in ERROR with the reason.
- A job that can never start (time limit above the partition's MaxTime) fails the trial with Slurm's
  reason instead of pending forever.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from local_cluster.cluster import fail_node, start_node
from tests.e2e.conftest import Master
from tests.slurm.fixtures import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
DONE = {"STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED"}


def _training_steps(master: Master, headers: dict[str, str], trial_id: int) -> list[int]:
    rows = master.api("GET", f"/trials/{trial_id}/metrics", headers, params={"group": "training"})
    return [int(m["stepsCompleted"]) for m in rows.get("metrics", [])]


def _exits(master: Master, exp: int, trial_id: int) -> list[dict[str, object]]:
    runs = sorted((master.user_jobs / f"exp-{exp}" / f"trial-{trial_id}").glob("run-*/exit.json"))
    return [json.loads(p.read_text()) for p in runs]


def test_a_trial_longer_than_the_time_limit_completes_as_a_chain_of_jobs(
    master: Master, alice: dict[str, str]
) -> None:
    # ~75 s of work on a partition whose jobs get 1 minute, with the checkpoint signal 30 s before the end.
    config = """
name: e2e-chain
entrypoint: python3 train.py
hyperparameters: {increment_by: 1, sleep_s: 0.5}
searcher: {name: single, metric: validation_loss, max_length: {batches: 150}}
slurm: {partition: short, time_limit: 1}
max_restarts: 0
"""
    exp = master.create_experiment(alice, config)
    assert master.wait_state(alice, exp, DONE, 420) == "STATE_COMPLETED", master.diagnose(exp)
    (trial,) = master.trials(alice, exp)
    exits = _exits(master, exp, trial["id"])
    assert len(exits) >= 3, exits  # at least two time-limit checkpoints, then the finish
    assert all(e["preempted"] and e["signal"] in ("SIGUSR1", 10) for e in exits[:-1]), exits
    assert exits[-1]["preempted"] is False and exits[-1]["exitCode"] == 0
    assert trial["restarts"] == 0  # checkpointed time limits are not failures
    steps = _training_steps(master, alice, trial["id"])
    assert steps == list(range(1, 151))  # strictly increasing across the chain, nothing twice


def _job_node(job_name: str) -> str:
    out = subprocess.run(
        ["squeue", "-h", "-n", job_name, "-o", "%N"], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def _node_healthy(node: str) -> bool:
    """Registered and schedulable again (idle, or already running someone's job): not down, drained or `*`."""
    out = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%t"], capture_output=True, text=True, check=False)
    state = out.stdout.strip()
    return bool(state) and not state.endswith("*") and state.split("+")[0] in {"idle", "mix", "alloc", "comp"}


@pytest.mark.exclusive  # kills a node's slurmd and every process on it
def test_a_node_failure_restarts_the_trial_from_its_checkpoint(master: Master, alice: dict[str, str]) -> None:
    config = """
name: e2e-nodefail
entrypoint: python3 train.py
hyperparameters: {increment_by: 1, sleep_s: 0.3}
searcher: {name: single, metric: validation_loss, max_length: {batches: 60}}
max_restarts: 1
"""
    exp = master.create_experiment(alice, config)
    wait_for(lambda: master.trials(alice, exp) and master.trials(alice, exp)[0]["stepsCompleted"] >= 12, 90,
             "training to pass a checkpoint")  # fmt: skip
    trial_id = master.trials(alice, exp)[0]["id"]
    node = wait_for(lambda: _job_node(f"det-e{exp}-t{trial_id}"), 10, "the job's node")
    fail_node(node)
    try:
        assert master.wait_state(alice, exp, DONE, 240) == "STATE_COMPLETED", master.diagnose(exp)
    finally:
        start_node(node)
        wait_for(lambda: _node_healthy(node), 120, f"{node} to come back")
    (trial,) = master.trials(alice, exp)
    assert trial["restarts"] == 1
    logs = sorted((master.user_jobs / f"exp-{exp}" / f"trial-{trial_id}").glob("run-*/output.log"))
    assert len(logs) == 2 and "resumed from" in logs[1].read_text()
    assert _training_steps(master, alice, trial_id) == list(range(1, 61))  # rolled back, then redone once


def test_a_job_that_can_never_start_fails_the_trial_with_slurms_reason(
    master: Master, alice: dict[str, str]
) -> None:
    config = """
name: e2e-never
entrypoint: python3 train.py
hyperparameters: {increment_by: 1}
searcher: {name: single, metric: validation_loss, max_length: {batches: 10}}
slurm: {partition: short, time_limit: 30}
"""
    started = time.monotonic()
    exp = master.create_experiment(alice, config)
    assert master.wait_state(alice, exp, DONE, 90) == "STATE_ERROR", master.diagnose(exp)
    (trial,) = master.trials(alice, exp)
    # Slurm's own reason, as squeue showed it (it first says PartitionTimeLimit, later PartitionConfig).
    assert "UNSCHEDULABLE" in trial["exitMessage"]
    assert any(r in trial["exitMessage"] for r in ("PartitionTimeLimit", "PartitionConfig")), trial[
        "exitMessage"
    ]
    assert time.monotonic() - started < 90
