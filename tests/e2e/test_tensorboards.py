"""TensorBoard on the local cluster over a finished experiment, through the master's proxy: the trials' runs
and their scalar tags (the harness's `Determined/<metric>` and the trial's own), and an idle TensorBoard
ended by its timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Master
from tests.slurm.fixtures import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
CONTEXT = Path(__file__).parent / "tensorboard_context"
CONFIG = """
name: e2e-tensorboard
entrypoint: python3 train.py
searcher: {name: single, metric: validation_loss, max_length: {batches: 12}}
resources: {slots_per_trial: 0}
max_restarts: 0
"""


def test_tensorboard_shows_the_trials_scalars_and_ends_when_idle(
    master: Master, alice: dict[str, str]
) -> None:
    exp = master.create_experiment(alice, CONFIG, context=CONTEXT)
    assert master.wait_state(alice, exp, {"STATE_COMPLETED", "STATE_ERROR"}, 180) == "STATE_COMPLETED", \
        master.diagnose(exp)  # fmt: skip
    (trial,) = master.trials(alice, exp)
    env = dict(os.environ, DET_MASTER=master.url, DET_USER="alice", DET_PASS="alice-pw")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_master.cli.main", "tensorboard", "start", str(exp), "--no-browser",
         "--config", "idle_timeout=20"],
        capture_output=True, text=True, env=env, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    url = proc.stdout.strip().splitlines()[-1]
    print(f"TensorBoard answered {time.monotonic() - started:.1f} s after `det tensorboard start`")
    task_id = url.rstrip("/").rsplit("/", 1)[-1]
    http = httpx.Client(timeout=30, headers=alice)
    run = f"exp-{exp}/trial-{trial['id']}"
    tags = wait_for(
        lambda: (t := http.get(f"{url}data/plugin/scalars/tags").json()) and any(r.startswith(run) for r in t) and t,
        timeout_s=60, what="TensorBoard to load the trial's events",
    )  # fmt: skip
    found = {tag for r, by_tag in tags.items() if r.startswith(run) for tag in by_tag}
    assert {"Determined/loss", "Determined/validation_loss", "custom/accuracy"} <= found, tags
    run_name = next(r for r, by_tag in tags.items() if r.startswith(run) and "Determined/loss" in by_tag)
    points = http.get(f"{url}data/plugin/scalars/scalars", params={"run": run_name, "tag": "Determined/loss"})
    assert [p[1] for p in points.json()] == list(range(1, 13))  # (wall time, step, value) per report
    assert httpx.get(f"{url}data/runs").status_code == 401  # no session: no way in
    # Idle: no request for 20 s ends it, freeing its node.
    ended = wait_for(
        lambda: ((t := http.get(f"{master.url}/api/v1/tensorboards/{task_id}").json()["tensorboard"])
                 ["state"] == "STATE_TERMINATED" and t) or None,
        timeout_s=90, what="the idle TensorBoard to end", interval_s=5,
    )  # fmt: skip
    assert ended["exitStatus"].startswith("idle for"), ended["exitStatus"]
