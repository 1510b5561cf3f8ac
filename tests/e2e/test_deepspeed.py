"""DeepSpeed end to end on the real 2-node cluster: real DeepSpeed (ZeRO stage 1, gloo on the CPU) under
``python3 -m determined.launch.deepspeed``, 2 nodes × 2 ranks, no SSH. A run paused mid-training checkpoints
through DeepSpeed's own ``save_checkpoint`` into a sharded Core API checkpoint, resumes from it with
``load_checkpoint`` and ends with the same weights as an uninterrupted run; a failing rank fails the trial with
its exit code and stops the other node."""

from __future__ import annotations

import importlib.util
import json
import re
import time
from typing import Any

import pytest

from tests.e2e.conftest import Master
from tests.e2e.test_distributed import (
    CONTEXTS,
    TERMINAL,
    _only_trial,
    _run_logs,
    _steps,
    _wait_no_jobs,
    _wait_trial,
)

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed"),
]

DS = """
name: e2e-deepspeed{suffix}
entrypoint: python3 -m determined.launch.deepspeed python3 ds_train.py
hyperparameters: {{sleep_s: {sleep_s}{extra}}}
resources: {{slots_per_trial: 4}}
slurm: {{sbatch_args: ["--mem=3G"]}}  # per node: two DeepSpeed ranks take ~0.9 GB each (the default is 1G)
searcher: {{name: single, metric: loss, max_length: {{batches: {batches}}}}}
max_restarts: 0
"""


def _tagged(log: str, tag: str) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    for m in re.finditer(rf"^\[rank=(\d+)\] {tag} (.*)$", log, re.M):
        rows[int(m.group(1))] = json.loads(m.group(2))
    return rows


def _check_started(log: str, steps: int) -> dict[int, dict[str, Any]]:
    rows = _tagged(log, "RESULT")
    assert sorted(rows) == [0, 1, 2, 3], log[-4000:]
    assert len({r["host"] for r in rows.values()}) == 2, log[-4000:]
    for rank, r in rows.items():
        assert r["rank"] == r["env_rank"] == rank and r["size"] == r["ds_world"] == 4
        assert r["local_rank"] == rank % 2 and r["cross_rank"] == rank // 2
        assert r["zero_stage"] == 1 and r["steps"] == steps
    if steps == 0:  # DeepSpeed broadcast rank 0's weights over each rank's own random ones
        assert all(r["engine_weights"] == rows[0]["own_initial"] for r in rows.values())
        assert rows[3]["own_initial"] != rows[0]["own_initial"]
    return rows


def _final_weights(log: str) -> list[float]:
    rows = _tagged(log, "FINAL")
    assert sorted(rows) == [0, 1, 2, 3], log[-4000:]
    assert all(r["weights"] == rows[0]["weights"] for r in rows.values())  # ZeRO-1 kept the ranks in step
    return list(rows[0]["weights"])


def test_deepspeed_zero1_on_two_nodes_pauses_and_resumes_like_an_uninterrupted_run(
    master: Master, alice: dict[str, str]
) -> None:
    straight_exp = master.create_experiment(
        alice, DS.format(suffix="-straight", sleep_s=0.0, extra="", batches=30), CONTEXTS / "deepspeed"
    )
    assert master.wait_state(alice, straight_exp, TERMINAL, 300) == "STATE_COMPLETED", master.diagnose(
        straight_exp
    )
    straight = _only_trial(master, alice, straight_exp)
    (straight_log,) = _run_logs(master, straight_exp, straight["id"])
    _check_started(straight_log, 0)

    exp = master.create_experiment(
        alice, DS.format(suffix="", sleep_s=0.3, extra="", batches=30), CONTEXTS / "deepspeed"
    )
    _wait_trial(master, alice, exp, lambda t: t["stepsCompleted"] >= 6, "6 steps", 300)
    master.api("POST", f"/experiments/{exp}/pause", alice)
    _wait_trial(master, alice, exp, lambda t: t["state"] == "STATE_PAUSED", "the pause")
    _wait_no_jobs(master, exp, 90)
    paused = _only_trial(master, alice, exp)
    assert 6 <= paused["stepsCompleted"] < 30, paused
    ckpt = master.api("GET", f"/checkpoints/{paused['latestCheckpointUuid']}", alice)["checkpoint"]
    files = set(ckpt["resources"])
    # DeepSpeed's own layout, written by all four ranks into one checkpoint: rank 0's model states and
    # `latest`, and each data-parallel rank's ZeRO optimizer shard.
    assert {"latest", "ds/mp_rank_00_model_states.pt"} <= files, sorted(files)
    assert {f"ds/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(4)} <= files, sorted(files)
    master.api("POST", f"/experiments/{exp}/activate", alice)
    assert master.wait_state(alice, exp, TERMINAL, 300) == "STATE_COMPLETED", master.diagnose(exp)

    trial = _only_trial(master, alice, exp)
    first, second = _run_logs(master, exp, trial["id"])
    _check_started(first, 0)
    refused = re.findall(r"^\[rank=\d\] ASYNC REFUSED .*shard=True.*DeepSpeed.*async_save", first, re.M)
    assert len(refused) == 4, first[
        -4000:
    ]  # save_state(asynchronous=True) refuses sharded state on every rank
    stopped = {int(s) for s in re.findall(r"^\[rank=\d\] preempted at step (\d+)", first, re.M)}
    assert len(stopped) == 1 and "Traceback" not in first, first[-4000:]
    (at,) = stopped
    assert re.search(
        rf"^\[rank=0\] resumed from {ckpt['uuid']} at step {at} global_steps={at}$", second, re.M
    )
    _check_started(second, at)
    assert _steps(master, alice, trial["id"]) == list(range(1, 31))  # every step reported once
    assert trial["stepsCompleted"] == 30
    # Model, ZeRO optimizer shards and step restored: the same weights as the run never paused.
    assert _final_weights(second) == pytest.approx(_final_weights(straight_log), abs=1e-6)


def test_a_failing_deepspeed_rank_fails_the_trial_with_its_exit_code(
    master: Master, alice: dict[str, str]
) -> None:
    config = DS.format(suffix="-fail", sleep_s=0.05, extra=", fail_rank: 3", batches=100000)
    exp = master.create_experiment(alice, config, CONTEXTS / "deepspeed")
    assert master.wait_state(alice, exp, TERMINAL, 300) == "STATE_ERROR", master.diagnose(exp)
    ended = time.time()
    trial = _only_trial(master, alice, exp)
    (log,) = _run_logs(master, exp, trial["id"])
    m = re.search(r"^\[rank=3\] FAILING rank=3 at=([\d.]+)$", log, re.M)
    assert m, log[-4000:]
    assert ended - float(m.group(1)) < 60, f"the trial took {ended - float(m.group(1)):.0f} s to stop\n{log}"
    run_dir = master.user_jobs / f"exp-{exp}" / f"trial-{trial['id']}" / "run-1"
    assert json.loads((run_dir / "exit.json").read_text())["exitCode"] == 3
    _wait_no_jobs(master, exp)


PYTORCH_TRIAL = """
name: e2e-deepspeed-pytorchtrial
entrypoint: python3 -m determined.launch.deepspeed --trial model_def:MyTrial
hyperparameters: {global_batch_size: 8, lr: 0.02, sleep_s: 0.0}
resources: {slots_per_trial: 4}
searcher: {name: single, metric: val_loss, smaller_is_better: true, max_length: {batches: 20}}
min_validation_period: {batches: 10}
max_restarts: 0
"""


def test_a_pytorch_trial_runs_on_four_ranks_under_the_deepspeed_launcher(
    master: Master, alice: dict[str, str]
) -> None:
    exp = master.create_experiment(alice, PYTORCH_TRIAL, CONTEXTS / "trial")
    assert master.wait_state(alice, exp, TERMINAL, 300) == "STATE_COMPLETED", master.diagnose(exp)
    trial = _only_trial(master, alice, exp)
    (log,) = _run_logs(master, exp, trial["id"])
    assert {int(r) for r in re.findall(r"^\[rank=(\d)\]", log, re.M)} == {0, 1, 2, 3}, log[-4000:]
    assert "deepspeed.launcher.launch" in log or "launch.py" in log  # DeepSpeed's own per-node launcher ran
    assert _steps(master, alice, trial["id"], "validation") == [10, 20]
    assert trial["stepsCompleted"] == 20
