"""Asynchronous checkpoints on the real local cluster (``save_state(asynchronous=True)``, issue 41).

The Core API script (``async_ckpt_context/train.py``) saves every 5 steps (0.1 s each) and each save's write
takes ``write_s`` seconds in the harness's writer thread, so a save is in flight nearly all the time. A pause and
a preemption signal arriving then must resume from a complete checkpoint at exactly the step the run stopped
at; a job killed while its only save is in flight must leave no registered checkpoint. About 20–40 s each.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Master
from tests.slurm.fixtures import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CONTEXT = Path(__file__).parent / "async_ckpt_context"
TERMINAL = {"STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED"}
CONFIG = """
name: e2e-async-checkpoint{suffix}
entrypoint: python3 train.py
hyperparameters: {{sleep_s: 0.1, write_s: {write_s}}}
searcher: {{name: single, metric: validation_loss, max_length: {{batches: {batches}}}}}
max_restarts: 0
"""


def _trial(master: Master, headers: dict[str, str], exp: int) -> dict[str, Any]:
    (trial,) = master.trials(headers, exp)
    return trial


def _wait_trial(master: Master, headers: dict[str, str], exp: int, pred: Any, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        trials = master.trials(headers, exp)
        if trials and pred(trials[0]):
            return trials[0]
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}\n{master.diagnose(exp)}")


def _logs(master: Master, exp: int, trial_id: int) -> list[str]:
    runs = sorted(
        (master.user_jobs / f"exp-{exp}" / f"trial-{trial_id}").glob("run-*/output.log"),
        key=lambda p: int(p.parent.name.split("-")[1]),
    )
    return [p.read_text() for p in runs]


def _training_steps(master: Master, headers: dict[str, str], trial_id: int) -> list[int]:
    rows = master.api("GET", f"/trials/{trial_id}/metrics", headers, params={"group": "training"})
    return sorted(int(m["stepsCompleted"]) for m in rows.get("metrics", rows.get("data", [])))


def _registered(master: Master, headers: dict[str, str], uuid: str) -> bool:
    r = master._http().get(f"{master.url}/api/v1/checkpoints/{uuid}", headers=headers)
    assert r.status_code in (200, 404), r.text
    return r.status_code == 200


def _stopped_exactly(master: Master, headers: dict[str, str], exp: int, first_log: str) -> tuple[int, str]:
    """The run stopped at step S with final checkpoint U: U is registered with S steps; an abandoned save is not."""
    m = re.search(r"^preempted at step (\d+): (\S+)$", first_log, re.M)
    assert m, first_log[-4000:]
    steps, uuid = int(m.group(1)), m.group(2)
    assert "in flight at preemption: True" in first_log, first_log[-4000:]
    ckpt = master.api("GET", f"/checkpoints/{uuid}", headers)["checkpoint"]
    assert ckpt["metadata"]["steps_completed"] == steps
    assert (master.root / "checkpoints" / uuid / "state_dict.pth").is_file()
    for abandoned in re.findall(r"asynchronous checkpoint (\S+) abandoned", first_log):
        assert not _registered(master, headers, abandoned)
        assert not (master.root / "checkpoints" / abandoned).exists()
        assert not (master.root / "checkpoints" / f".{abandoned}.tmp").exists()
    return steps, uuid


def _resumed_like_uninterrupted(
    master: Master, headers: dict[str, str], exp: int, steps: int, uuid: str
) -> None:
    assert master.wait_state(headers, exp, TERMINAL, 120) == "STATE_COMPLETED", master.diagnose(exp)
    trial = _trial(master, headers, exp)
    logs = _logs(master, exp, trial["id"])
    assert len(logs) == 2, master.diagnose(exp)
    assert f"resumed from {uuid} at step {steps}\n" in logs[1], logs[1][-4000:]
    assert "done at step 40 w=40.0" in logs[1], logs[1][-4000:]  # the weights count every step exactly once
    assert _training_steps(master, headers, trial["id"]) == list(range(1, 41))
    assert "Traceback" not in logs[0] + logs[1]


def test_pause_while_an_async_save_is_in_flight_resumes_exactly(
    master: Master, alice: dict[str, str]
) -> None:
    exp = master.create_experiment(alice, CONFIG.format(suffix="-pause", write_s=2, batches=40), CONTEXT)
    _wait_trial(master, alice, exp, lambda t: t["stepsCompleted"] >= 12, "12 steps")
    master.api("POST", f"/experiments/{exp}/pause", alice)
    trial = _wait_trial(master, alice, exp, lambda t: t["state"] == "STATE_PAUSED", "the pause")
    wait_for(lambda: not master.jobs_of(exp, trial["id"]), 30, "the paused trial's job to leave Slurm")
    (first,) = _logs(master, exp, trial["id"])
    steps, uuid = _stopped_exactly(master, alice, exp, first)
    assert 12 <= steps < 40
    assert _trial(master, alice, exp)["latestCheckpointUuid"] == uuid
    master.api("POST", f"/experiments/{exp}/activate", alice)
    _resumed_like_uninterrupted(master, alice, exp, steps, uuid)


def test_preemption_signal_while_an_async_save_is_in_flight_resumes_exactly(
    master: Master, alice: dict[str, str]
) -> None:
    exp = master.create_experiment(alice, CONFIG.format(suffix="-preempt", write_s=2, batches=40), CONTEXT)
    trial = _wait_trial(master, alice, exp, lambda t: t["stepsCompleted"] >= 12, "12 steps")
    job = master.jobs_of(exp, trial["id"])
    assert len(job) == 1
    # Slurm's preemption SIGTERM (GraceTime before the SIGKILL), to every process of the job: this one-slot job
    # runs its script in the batch step, which `--signal` alone does not reach (it signals steps only).
    subprocess.run(["scancel", "--signal=TERM", "--full", job[0]], check=True)
    wait_for(lambda: len(_logs(master, exp, trial["id"])) == 2, 120, "the trial's next run")
    first = _logs(master, exp, trial["id"])[0]
    steps, uuid = _stopped_exactly(master, alice, exp, first)
    _resumed_like_uninterrupted(master, alice, exp, steps, uuid)
    assert _trial(master, alice, exp)["restarts"] == 0  # a preemption is not a failure


def test_job_killed_mid_async_save_leaves_no_registered_checkpoint(
    master: Master, alice: dict[str, str]
) -> None:
    # The first save's write takes 10 minutes: it is still in flight when the job is killed.
    exp = master.create_experiment(alice, CONFIG.format(suffix="-killed", write_s=600, batches=1000), CONTEXT)
    trial = _wait_trial(master, alice, exp, lambda t: t["stepsCompleted"] >= 8, "8 steps")
    (log,) = _logs(master, exp, trial["id"])
    m = re.search(r"^async save started at step 5: (\S+)$", log, re.M)
    assert m, log[-4000:]
    uuid = m.group(1)
    assert (master.root / "checkpoints" / f".{uuid}.tmp").is_dir()  # in flight, under its incomplete name
    job = master.jobs_of(exp, trial["id"])
    assert len(job) == 1
    subprocess.run(["scancel", "--full", "--signal=KILL", job[0]], check=True)
    assert master.wait_state(alice, exp, TERMINAL, 90) == "STATE_ERROR", master.diagnose(exp)
    assert master.api("GET", f"/experiments/{exp}/checkpoints", alice)["checkpoints"] == []
    assert not _registered(master, alice, uuid)
    assert not (master.root / "checkpoints" / uuid).exists()
    assert _trial(master, alice, exp)["latestCheckpointUuid"] in (None, "")
