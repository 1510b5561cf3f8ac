"""Every run ends somewhere (issue 26, item 1), on the real local cluster.

- A one-trial experiment is paused and activated; its second job reaches ``max_length`` (the searcher says
  Stop) and, while the script is still writing its final checkpoint, Slurm preempts the job for one in the
  `urgent` partition. The master used to log "SLURM_PREEMPTED → trial ACTIVE, resubmitting", submit nothing
  and leave the experiment ACTIVE at 100 % forever; now the trial and the experiment complete.
- Determined 0.38's ``searcher: {name: single, metric: ...}`` with no length: the trial used to be created and
  never submitted (ACTIVE, no run, nothing logged); now it runs until its script ends, and the experiment
  completes.
"""

from __future__ import annotations

import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Master
from tests.slurm.fixtures import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
DONE = {"STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED"}

PAUSABLE = '''\
"""Trains a counter to each operation's length (checkpoint every 5 steps, stops when asked), then takes its
time over a final save: the window in which Slurm preempts the job."""
import json
import time

import determined as det


def main(core):
    info = det.get_cluster_info()
    hp = info.trial.hparams
    steps = 0
    if info.latest_checkpoint:
        with core.checkpoint.restore_path(info.latest_checkpoint) as path:
            steps = json.loads((path / "state.json").read_text())["steps"]
        print(f"resumed at step {steps}", flush=True)
    for op in core.searcher.operations():
        while steps < op.length:
            time.sleep(hp["sleep_s"])
            steps += 1
            core.train.report_training_metrics(steps_completed=steps, metrics={"x": steps})
            if steps % 5 == 0:
                with core.checkpoint.store_path({"steps_completed": steps}) as (path, _):
                    (path / "state.json").write_text(json.dumps({"steps": steps}))
                if core.preempt.should_preempt():
                    print(f"preempted at step {steps}", flush=True)
                    return
        loss = 1.0 / steps
        core.train.report_validation_metrics(steps_completed=steps, metrics={"validation_loss": loss})
        op.report_completed(loss)
    print("writing the final checkpoint", flush=True)
    time.sleep(hp["final_save_s"])
    print("done", flush=True)


if __name__ == "__main__":
    with det.core.init() as core_context:
        main(core_context)
'''

CORE_038 = '''\
"""Determined 0.38's Core API form: the script decides how long to train, reports, and exits."""
import determined as det

with det.core.init() as core:
    for step in range(1, 11):
        core.train.report_training_metrics(steps_completed=step, metrics={"loss": 1.0 / step})
    core.train.report_validation_metrics(steps_completed=10, metrics={"validation_loss": 0.25})
    print("trained 10 steps, as the script decided", flush=True)
'''


def _context(tmp_path: Path, script: str) -> Path:
    ctx = tmp_path / "context"
    ctx.mkdir()
    (ctx / "train.py").write_text(script)
    return ctx


def _rows(master: Master, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(master.root / "master.db") as db:
        return list(db.execute(sql, args).fetchall())


def _output(master: Master, exp: int, trial_id: int, run: int) -> str:
    path = master.user_jobs / f"exp-{exp}" / f"trial-{trial_id}" / f"run-{run}" / "output.log"
    return path.read_text() if path.exists() else ""


def _trial(master: Master, headers: dict[str, str], exp: int) -> dict[str, Any]:
    trials = master.trials(headers, exp)
    return trials[0] if trials else {}


def _job_node(job_id: str) -> str:
    out = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip()


@pytest.mark.exclusive  # an urgent job preempts every batch job on the cluster
def test_a_job_preempted_as_its_trial_reaches_max_length_after_pause_and_activate_completes(
    master: Master, alice: dict[str, str], tmp_path: Path
) -> None:
    config = """
name: e2e-preempted-at-the-end
entrypoint: python3 train.py
hyperparameters: {sleep_s: 0.2, final_save_s: 300}
searcher: {name: single, metric: validation_loss, max_length: {batches: 20}}
max_restarts: 0
"""
    exp = master.create_experiment(alice, config, _context(tmp_path, PAUSABLE))
    wait_for(lambda: _trial(master, alice, exp).get("stepsCompleted", 0) >= 3, 60, "training to start")
    trial_id = _trial(master, alice, exp)["id"]
    master.api("POST", f"/experiments/{exp}/pause", alice)
    wait_for(lambda: _trial(master, alice, exp)["state"] == "STATE_PAUSED", 60, "the pause")
    wait_for(lambda: not master.live_job_ids(), 60, "the paused job to checkpoint and exit")
    master.api("POST", f"/experiments/{exp}/activate", alice)

    # The second run resumes, reaches max_length and reports it; the searcher says Stop.
    wait_for(lambda: "writing the final checkpoint" in _output(master, exp, trial_id, 2), 60, "max_length")
    wait_for(lambda: _rows(master, "SELECT searcher_done FROM trials WHERE id = ?", trial_id) == [(1,)], 10,
             "the searcher's Stop")  # fmt: skip
    assert master.experiment(alice, exp)["progress"] == 1.0
    (job_id,) = master.live_job_ids()
    node = wait_for(lambda: _job_node(job_id), 10, "the job's node")
    # A job in the `urgent` partition that needs the job's node preempts it (SIGTERM, then SIGKILL after the
    # grace time: the final save does not end in time).
    urgent = master.researcher.run(
        [
            "sbatch",
            "--parsable",
            "-p",
            "urgent",
            "--exclusive",
            "-w",
            node,
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 1",
        ]
    ).stdout.strip()
    assert urgent
    started = time.monotonic()
    assert master.wait_state(alice, exp, DONE, 90) == "STATE_COMPLETED", master.diagnose(exp)
    trial = _trial(master, alice, exp)
    assert trial["state"] == "STATE_COMPLETED"
    runs = _rows(master, "SELECT run_number, exit_reason FROM trial_runs WHERE trial_id = ? ORDER BY run_number",
                 trial_id)  # fmt: skip
    assert runs == [(1, "PAUSED_BY_USER"), (2, "SLURM_PREEMPTED")]  # nothing submitted after the preemption
    assert "the searcher was done with the trial" in trial["exitMessage"]
    assert "done" not in _output(master, exp, trial_id, 2).splitlines()  # it was preempted, not finished
    print(f"completed {time.monotonic() - started:.0f} s after the urgent job was submitted")


def test_single_without_a_length_runs_until_its_script_ends(
    master: Master, alice: dict[str, str], tmp_path: Path
) -> None:
    config = """
name: e2e-single-038
entrypoint: python3 train.py
searcher: {name: single, metric: validation_loss}
max_restarts: 0
"""
    exp = master.create_experiment(alice, config, _context(tmp_path, CORE_038))
    assert master.wait_state(alice, exp, DONE, 90) == "STATE_COMPLETED", master.diagnose(exp)
    trial = _trial(master, alice, exp)
    assert trial["state"] == "STATE_COMPLETED"
    assert trial["searcherMetricValue"] == pytest.approx(0.25)
    assert _rows(master, "SELECT exit_reason FROM trial_runs WHERE trial_id = ?", trial["id"]) == [
        ("SEARCHER_DONE",)
    ]
    assert "trained 10 steps, as the script decided" in _output(master, exp, trial["id"], 1)
    assert master.experiment(alice, exp)["progress"] == 1.0
