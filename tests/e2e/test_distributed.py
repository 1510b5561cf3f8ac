"""Distributed training end to end on the real 2-node cluster, each test a real experiment through the master:
Determined's Core API tutorial script unmodified (with a pause in the middle), torch DDP over the platform's
torch_distributed launcher (2 nodes × 2 ranks), the Core API's collectives across nodes, mpi4py under the mpi
launcher, a failing rank stopping the whole trial, and a PyTorchTrial on 1 and 4 slots that is preempted and
resumes to the same number of batches as an uninterrupted run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.e2e.conftest import Master
from tests.slurm.fixtures import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CONTEXTS = Path(__file__).parent / "distributed_context"
TERMINAL = {"STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED"}


# -- helpers ------------------------------------------------------------------------------------------------
def _metrics(master: Master, headers: dict[str, str], trial_id: int, group: str) -> list[dict[str, Any]]:
    rows = master.api("GET", f"/trials/{trial_id}/metrics", headers, params={"group": group})
    return list(rows.get("metrics", rows.get("data", [])))


def _steps(master: Master, headers: dict[str, str], trial_id: int, group: str = "training") -> list[int]:
    return [int(m["stepsCompleted"]) for m in _metrics(master, headers, trial_id, group)]


def _run_logs(master: Master, exp: int, trial_id: int) -> list[str]:
    runs = sorted(
        (master.user_jobs / f"exp-{exp}" / f"trial-{trial_id}").glob("run-*/output.log"),
        key=lambda p: int(p.parent.name.split("-")[1]),
    )
    return [p.read_text() for p in runs]


def _only_trial(master: Master, headers: dict[str, str], exp: int) -> dict[str, Any]:
    (trial,) = master.trials(headers, exp)
    return trial


def _wait_trial(
    master: Master, headers: dict[str, str], exp: int, pred: Any, what: str, timeout_s: float = 120
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        trials = master.trials(headers, exp)
        if trials and pred(trials[0]):
            return trials[0]
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}\n{master.diagnose(exp)}")


def _results(log: str) -> dict[int, dict[str, Any]]:
    rows = {}
    for line in log.splitlines():
        m = re.match(r"^\[rank=(\d+)\] RESULT (.*)$", line)
        if m:
            rows[int(m.group(1))] = json.loads(m.group(2))
    return rows


def _four_rank_results(
    master: Master, headers: dict[str, str], config: str, context: str
) -> tuple[dict[str, Any], str, dict[int, dict[str, Any]]]:
    """Run a 4-slot experiment to completion: its trial, its one run's log, and every rank's RESULT row."""
    exp = master.create_experiment(headers, config, CONTEXTS / context)
    assert master.wait_state(headers, exp, TERMINAL, 180) == "STATE_COMPLETED", master.diagnose(exp)
    trial = _only_trial(master, headers, exp)
    (log,) = _run_logs(master, exp, trial["id"])
    rows = _results(log)
    assert sorted(rows) == [0, 1, 2, 3], log
    return trial, log, rows


def _flat(tensors: list[list[float]]) -> list[float]:
    return [x for t in tensors for x in t]


def _no_jobs_left(master: Master, exp: int) -> bool:
    return not master.jobs_of(exp)


def _wait_no_jobs(master: Master, exp: int, timeout_s: float = 20) -> None:
    """Slurm forgets a job a moment after it ends (COMPLETING): nothing of the experiment may stay longer."""
    deadline = time.monotonic() + timeout_s
    while not _no_jobs_left(master, exp):
        assert time.monotonic() < deadline, (
            f"experiment {exp} still has jobs in Slurm\n{master.diagnose(exp)}"
        )
        time.sleep(0.5)


# -- torch DDP + Core API collectives, 2 nodes × 2 ranks -----------------------------------------------------
DDP = """
name: e2e-ddp
entrypoint: python3 -m determined.launch.torch_distributed python3 ddp_check.py
hyperparameters: {sleep_s: 0.0}
resources: {slots_per_trial: 4}
searcher: {name: single, metric: loss, max_length: {batches: 5}}
max_restarts: 0
"""


def test_ddp_on_two_nodes_averages_gradients_and_core_allgather_sees_every_rank(
    master: Master, alice: dict[str, str]
) -> None:
    trial, log, rows = _four_rank_results(master, alice, DDP, "ddp")
    assert len({r["host"] for r in rows.values()}) == 2, log
    for prefix_rank, r in rows.items():
        assert r["rank"] == r["dist_rank"] == prefix_rank and r["size"] == r["dist_world"] == 4
        assert r["local_rank"] == prefix_rank % 2 and r["cross_rank"] == prefix_rank // 2
        assert [g["rank"] for g in r["gathered"]] == [0, 1, 2, 3]
        assert [g["host"] for g in r["gathered"]] == [rows[i]["host"] for i in range(4)]
    # DDP broadcast rank 0's weights, averaged the gradients, and every rank took the same step.
    for r in rows.values():
        assert r["initial"] == rows[0]["initial"]
        assert _flat(r["ddp_grad"]) == pytest.approx(_flat(rows[0]["ddp_grad"]), abs=1e-6)
        assert _flat(r["params"]) == pytest.approx(_flat(rows[0]["params"]), abs=1e-6)
    local = [_flat(rows[k]["local_grad"]) for k in range(4)]
    mean = [sum(col) / 4 for col in zip(*local, strict=True)]
    assert _flat(rows[0]["ddp_grad"]) == pytest.approx(mean, abs=1e-5)
    assert max(abs(a - b) for a, b in zip(local[0], local[3], strict=True)) > 1e-3  # the shards differ
    assert trial["state"] == "STATE_COMPLETED" and trial["stepsCompleted"] == 5
    assert _steps(master, alice, trial["id"]) == [2, 3, 4, 5]
    assert trial["latestCheckpointUuid"]


FAILING = (
    DDP.replace("name: e2e-ddp", "name: e2e-ddp-fail")
    .replace("{sleep_s: 0.0}", "{sleep_s: 0.05, fail_rank: 3}")
    .replace("{batches: 5}", "{batches: 100000}")
)


def test_a_failing_rank_stops_the_whole_trial_promptly(master: Master, alice: dict[str, str]) -> None:
    exp = master.create_experiment(alice, FAILING, CONTEXTS / "ddp")
    assert master.wait_state(alice, exp, TERMINAL, 180) == "STATE_ERROR", master.diagnose(exp)
    ended = time.time()
    trial = _only_trial(master, alice, exp)
    assert trial["state"] == "STATE_ERROR" and trial["restarts"] == 0
    (log,) = _run_logs(master, exp, trial["id"])
    m = re.search(r"^\[rank=3\] FAILING rank=3 at=([\d.]+)$", log, re.M)
    assert m, log
    assert "RuntimeError: rank 3 fails on purpose" in log
    assert ended - float(m.group(1)) < 30, f"the trial took {ended - float(m.group(1)):.0f} s to stop\n{log}"
    _wait_no_jobs(master, exp)


# -- mpi4py through the mpi launcher ----------------------------------------------------------------------------
MPI = """
name: e2e-mpi
entrypoint: python3 -m launchers.mpi python3 mpi_check.py
resources: {slots_per_trial: 4}
searcher: {name: single, metric: allreduce, max_length: {batches: 1}}
max_restarts: 0
"""


def test_mpi4py_allreduce_across_two_nodes_through_the_mpi_launcher(
    master: Master, alice: dict[str, str]
) -> None:
    trial, log, rows = _four_rank_results(master, alice, MPI, "mpi")
    hosts = [rows[i]["host"] for i in range(4)]
    assert len(set(hosts)) == 2 and hosts[0] == hosts[1] and hosts[2] == hosts[3], log
    for prefix_rank, r in rows.items():
        assert r["rank"] == r["core_rank"] == prefix_rank and r["size"] == 4
        assert r["allreduce"] == 1 + 2 + 3 + 4
        assert r["hosts"] == hosts
        assert r["gathered"] == [0, 1, 2, 3]
        assert r["local_rank"] == prefix_rank % 2 and r["cross_rank"] == prefix_rank // 2
    (val,) = _metrics(master, alice, trial["id"], "validation")
    assert val["metrics"]["avgMetrics"]["allreduce"] == 10


# -- Determined's Core API tutorial, unmodified, with a pause in the middle -----------------------------------
TUTORIAL = """
name: e2e-core-tutorial
entrypoint: python3 model_def.py --log-interval 1
hyperparameters:
  global_batch_size: 8
  learning_rate: 1.0
  n_hidden: 16
  dropout1: 0.25
  sleep_s: 0.25
records_per_epoch: 64
searcher: {name: single, metric: test_loss, smaller_is_better: true, max_length: {epochs: 6}}
max_restarts: 0
"""


def test_core_api_tutorial_runs_unmodified_through_a_pause_and_activate(
    master: Master, alice: dict[str, str]
) -> None:
    exp = master.create_experiment(alice, TUTORIAL, CONTEXTS / "core_tutorial")
    _wait_trial(master, alice, exp, lambda t: t["stepsCompleted"] >= 12, "training to start", 240)
    master.api("POST", f"/experiments/{exp}/pause", alice)
    paused = _wait_trial(master, alice, exp, lambda t: t["state"] == "STATE_PAUSED", "the pause")
    _wait_no_jobs(master, exp)  # the job checkpointed and exited, freeing the nodes
    paused = _only_trial(master, alice, exp)  # the trial reads PAUSED at once; its job stops a little later
    assert 16 <= paused["stepsCompleted"] < 48, "the pause did not land mid-training"
    master.api("POST", f"/experiments/{exp}/activate", alice)
    assert master.wait_state(alice, exp, TERMINAL, 240) == "STATE_COMPLETED", master.diagnose(exp)
    trial = _only_trial(master, alice, exp)
    first, second = _run_logs(master, exp, trial["id"])
    assert "preempted after epoch" in first and "Traceback" not in first
    assert "resumed from" in second and "Traceback" not in second
    steps = _steps(master, alice, trial["id"])
    assert steps == list(range(1, 49))  # every batch reported once: nothing lost, nothing repeated
    assert _steps(master, alice, trial["id"], "validation") == [8, 16, 24, 32, 40, 48]
    assert trial["stepsCompleted"] == 48
    ckpt = master.api("GET", f"/checkpoints/{trial['latestCheckpointUuid']}", alice)["checkpoint"]
    assert ckpt["metadata"]["steps_completed"] == 48


# -- a PyTorchTrial on 1 and 4 slots, preempted and resumed ---------------------------------------------------
TRIAL = """
name: e2e-trial-{slots}
entrypoint: model_def:MyTrial
reproducibility: {{experiment_seed: 11}}  # the twins compared below must share their trial seed
hyperparameters: {{global_batch_size: 8, lr: 0.02, sleep_s: {sleep_s}}}
resources: {{slots_per_trial: {slots}}}
searcher: {{name: single, metric: val_loss, smaller_is_better: true, max_length: {{batches: 60}}}}
min_validation_period: {{batches: 20}}
min_checkpoint_period: {{batches: 20}}
scheduling_unit: 5
max_restarts: 0
"""


def _trained_batches(master: Master, headers: dict[str, str], trial_id: int) -> int:
    """Batches actually trained, over every run: each training report carries one entry per batch."""
    return sum(
        len(m["metrics"].get("batchMetrics") or []) for m in _metrics(master, headers, trial_id, "training")
    )


def _assert_finished_like_uninterrupted(master: Master, headers: dict[str, str], exp: int) -> dict[str, Any]:
    assert master.wait_state(headers, exp, TERMINAL, 300) == "STATE_COMPLETED", master.diagnose(exp)
    trial = _only_trial(master, headers, exp)
    steps = _steps(master, headers, trial["id"])
    assert steps == sorted(set(steps)) and steps[-1] == 60, steps  # no step reported twice
    assert _trained_batches(master, headers, trial["id"]) == 60  # no batch trained twice or skipped
    assert _steps(master, headers, trial["id"], "validation") == [20, 40, 60]
    assert trial["stepsCompleted"] == 60
    ckpt = master.api("GET", f"/checkpoints/{trial['latestCheckpointUuid']}", headers)["checkpoint"]
    assert ckpt["metadata"]["steps_completed"] == 60
    return trial


def _final_val_loss(master: Master, headers: dict[str, str], trial_id: int) -> float:
    return float(_metrics(master, headers, trial_id, "validation")[-1]["metrics"]["avgMetrics"]["val_loss"])


def test_pytorch_trial_on_one_slot_paused_and_resumed_ends_like_an_uninterrupted_run(
    master: Master, alice: dict[str, str]
) -> None:
    config = TRIAL.format(slots=1, sleep_s=0.2)
    paused_exp = master.create_experiment(alice, config, CONTEXTS / "trial")
    straight_exp = master.create_experiment(
        alice, config.replace("e2e-trial-1", "e2e-trial-1-straight"), CONTEXTS / "trial"
    )
    _wait_trial(master, alice, paused_exp, lambda t: t["stepsCompleted"] >= 25, "25 batches", 240)
    master.api("POST", f"/experiments/{paused_exp}/pause", alice)
    paused = _wait_trial(master, alice, paused_exp, lambda t: t["state"] == "STATE_PAUSED", "the pause")
    # The trial shows PAUSED at once; activating before its job has checkpointed and exited would resume it
    # straight away (a plain preemption), so wait for the job to be gone first, as a user would see it.
    _wait_no_jobs(master, paused_exp, 60)
    paused = _only_trial(master, alice, paused_exp)
    assert 25 <= paused["stepsCompleted"] < 60
    master.api("POST", f"/experiments/{paused_exp}/activate", alice)
    trial = _assert_finished_like_uninterrupted(master, alice, paused_exp)
    straight = _assert_finished_like_uninterrupted(master, alice, straight_exp)
    logs = _run_logs(master, paused_exp, trial["id"])
    assert len(logs) == 2 and "resumed from" in logs[1], logs[-1][-3000:]
    assert len(_run_logs(master, straight_exp, straight["id"])) == 1
    # The resume restored model, optimizer, RNG and data position: the same batches, the same result.
    assert _final_val_loss(master, alice, trial["id"]) == pytest.approx(
        _final_val_loss(master, alice, straight["id"]), rel=1e-5
    )


def test_pytorch_trial_on_four_slots_survives_slurm_preemption_signals(
    master: Master, alice: dict[str, str]
) -> None:
    exp = master.create_experiment(alice, TRIAL.format(slots=4, sleep_s=0.3), CONTEXTS / "trial")
    _wait_trial(master, alice, exp, lambda t: t["stepsCompleted"] >= 25, "25 batches", 240)
    trial_id = _only_trial(master, alice, exp)["id"]
    job = master.jobs_of(exp, trial_id)
    assert len(job) == 1
    # What Slurm's preemption does first (slurmctld's job_signal(SIGTERM) without KILL_FULL_JOB): SIGTERM to
    # every process of the job's steps on both nodes; not to the batch step, where srun would turn it into
    # SIGKILL for every task.
    subprocess.run(["scancel", "--signal=TERM", job[0]], check=True)
    signalled = time.monotonic()
    exit_file = master.user_jobs / f"exp-{exp}" / f"trial-{trial_id}" / "run-1" / "exit.json"
    while not exit_file.exists():  # it must checkpoint and stop before the partition's GraceTime (10 s) ends
        assert time.monotonic() - signalled < 10, f"still running after 10 s\n{master.diagnose(exp)}"
        time.sleep(0.2)
    assert json.loads(exit_file.read_text())["preempted"] is True
    trial = _assert_finished_like_uninterrupted(master, alice, exp)
    assert trial["restarts"] == 0  # a preemption is not a failure
    logs = _run_logs(master, exp, trial["id"])
    assert len(logs) == 2 and "resumed from" in logs[1], logs[-1][-3000:]
    assert "preempted" in logs[0]
    ranks = {int(r) for r in re.findall(r"^\[rank=(\d)\]", logs[1], re.M)}
    assert ranks == {0, 1, 2, 3}


# -- Horovod, when its wheel was built (tests/e2e/distributed_context/horovod/build_wheel.sh, ~15 min) ---------
HOROVOD = """
name: e2e-horovod
entrypoint: python3 -m determined.launch.horovod python3 hvd_check.py
environment: {{environment_variables: ["PYTHONPATH={site}"]}}
resources: {{slots_per_trial: 4}}
searcher: {{name: single, metric: allreduce, max_length: {{batches: 1}}}}
max_restarts: 0
"""


def _horovod_site() -> Path:
    """The Horovod build's site directory. scripts/test.sh builds it while other tests run and names its log in
    DET_TEST_HOROVOD_LOG (``<log>.done`` holds the build's exit status): wait for it then."""
    log = os.environ.get("DET_TEST_HOROVOD_LOG")
    if log:
        done = Path(f"{log}.done")
        wait_for(done.exists, 1200, f"the Horovod build (log: {log})", interval_s=2)
        require(done.read_text().strip() == "0", f"a Horovod build (it failed; see {log})")
    sites = sorted(Path("/var/cache/hpc-det/site").glob("horovod-0.28.1_*/horovod"))
    require(bool(sites), "a Horovod build (tests/e2e/distributed_context/horovod/build_wheel.sh)")
    return sites[-1].parent


def test_horovod_allreduce_across_two_nodes_through_the_horovod_launcher(
    master: Master, alice: dict[str, str]
) -> None:
    config = HOROVOD.format(site=_horovod_site())
    _, log, rows = _four_rank_results(master, alice, config, "horovod")
    assert len({r["host"] for r in rows.values()}) == 2, log
    for prefix_rank, r in rows.items():
        assert r["rank"] == prefix_rank and r["size"] == 4
        assert r["allreduce"] == 1 + 2 + 3 + 4
        assert r["gathered"] == [0, 1, 2, 3]
        assert r["local_rank"] == prefix_rank % 2 and r["cross_rank"] == prefix_rank // 2
