"""Checkpoint GC on the real local cluster: trials (run as the researcher) write real checkpoint directories,
and the master (root) deletes them as the researcher when trials pause or end. Every assertion counts
directories on disk, not rows."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Master

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

GC_CONTEXT = Path(__file__).parent / "gc_context"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
PEAKS = [3, 6, 9, 12]
GRID = """
name: e2e-gc-NAME
entrypoint: python3 train.py
hyperparameters:
  peak: {type: categorical, vals: [3, 6, 9, 12]}
  sleep_s: 0.02
searcher: {name: grid, metric: validation_loss, max_length: {batches: 12}}
max_restarts: 0
"""
ONLY_THE_BEST = "checkpoint_storage: {save_experiment_best: 1, save_trial_best: 0, save_trial_latest: 0}\n"
PAUSE = """
name: e2e-gc-pause
entrypoint: python3 train.py
hyperparameters: {peak: 6, sleep_s: 0.3}
searcher: {name: single, metric: validation_loss, max_length: {batches: 30}}
checkpoint_storage: {save_experiment_best: 0, save_trial_best: 0, save_trial_latest: 0}
max_restarts: 0
"""
DONE = {"STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED"}


def checkpoints(master: Master, headers: dict[str, str], exp: int) -> list[dict[str, Any]]:
    return list(master.api("GET", f"/experiments/{exp}/checkpoints", headers)["checkpoints"])


def on_disk(master: Master) -> set[str]:
    """The checkpoint directories in the master's storage (hidden temporary ones aside)."""
    return {p.name for p in (master.root / "checkpoints").iterdir() if UUID.fullmatch(p.name) and p.is_dir()}


def settled(master: Master, headers: dict[str, str], exp: int, kept: int, timeout_s: float = 60) -> list[Any]:
    """Wait until `kept` checkpoints of the experiment are left, each DELETED one gone from disk and each kept
    one there (the loop collects within a few ticks of a trial's end); its checkpoints then."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = checkpoints(master, headers, exp)
        alive = {c["uuid"] for c in rows if c["state"] == "STATE_COMPLETED"}
        mine = on_disk(master) & {c["uuid"] for c in rows}
        if len(alive) == kept and mine == alive:
            return rows
        if time.monotonic() > deadline:
            states = {c["uuid"][:8]: c["state"] for c in rows}
            raise AssertionError(f"{len(mine)} on disk, {states}\n{master.diagnose(exp)}")
        time.sleep(0.5)


def test_a_search_keeps_each_trials_best_and_latest_and_a_strict_policy_only_the_best(
    master: Master, alice: dict[str, str]
) -> None:
    defaults = master.create_experiment(alice, GRID.replace("NAME", "defaults"), GC_CONTEXT)
    strict = master.create_experiment(alice, GRID.replace("NAME", "strict") + ONLY_THE_BEST, GC_CONTEXT)
    for exp in (defaults, strict):
        assert master.wait_state(alice, exp, DONE, 150) == "STATE_COMPLETED", master.diagnose(exp)

    # Defaults (save_experiment_best 0, save_trial_best 1, save_trial_latest 1): each trial's best (at its
    # peak) and latest (step 12) directories stay, one when they are the same: 7 of the 16 written.
    rows = settled(master, alice, defaults, kept=7)
    assert len(rows) == 4 * len(PEAKS)  # every trial wrote a directory at steps 3, 6, 9, 12
    trials = {t["id"]: t["hparams"]["peak"] for t in master.trials(alice, defaults)}
    kept: dict[int, set[int]] = {}
    for c in rows:
        if c["uuid"] in on_disk(master):
            kept.setdefault(trials[c["training"]["trialId"]], set()).add(c["stepsCompleted"])
    assert kept == {3: {3, 12}, 6: {6, 12}, 9: {9, 12}, 12: {12}}
    print(
        f"defaults: {len(rows)} checkpoint directories written, {sum(map(len, kept.values()))} left on disk"
    )
    exp = master.experiment(alice, defaults)
    assert (exp["checkpointCount"], exp["deletedCheckpointCount"]) == (7, 9)
    assert exp["checkpointSize"] > 0 and exp["deletedCheckpointSize"] > 0

    # save_experiment_best 1 only: the search's best checkpoint (peak 3, at step 3) is the one directory left.
    rows = settled(master, alice, strict, kept=1)
    (best,) = [c for c in rows if c["uuid"] in on_disk(master)]
    peaks = {t["id"]: t["hparams"]["peak"] for t in master.trials(alice, strict)}
    assert (peaks[best["training"]["trialId"]], best["stepsCompleted"]) == (3, 3)
    # Deleted as the researcher's account, which owns what the jobs wrote (root could delete anything).
    assert (master.root / "checkpoints" / best["uuid"]).stat().st_uid == master.researcher.uid
    print(f"save_experiment_best 1 only: {len(rows)} written, 1 left on disk")


def test_a_registered_checkpoint_survives_a_stricter_policy_and_only_its_owner_registers_it(
    master: Master, alice: dict[str, str]
) -> None:
    """Real directories written by the researcher's jobs: one kept checkpoint registered as a model version
    stays on disk when the policy is tightened to keep nothing; another user can neither register nor delete
    it; once its version is deleted, the next collection removes it."""
    admin = master.login("admin", "admin-pw")
    user = {"username": "bob", "admin": False, "active": True, "unixUsername": master.researcher.name}
    master.api("POST", "/users", admin, json={"user": user, "password": "bob-pw"})
    bob = master.login("bob", "bob-pw")
    exp = master.create_experiment(alice, GRID.replace("NAME", "registry"), GC_CONTEXT)
    assert master.wait_state(alice, exp, DONE, 150) == "STATE_COMPLETED", master.diagnose(exp)
    rows = settled(master, alice, exp, kept=7)
    kept = sorted((c for c in rows if c["uuid"] in on_disk(master)), key=lambda c: c["stepsCompleted"])
    chosen = kept[-1]["uuid"]  # a latest (step 12): any kept one would do

    master.api("POST", "/models", alice, json={"name": "e2e-gc-model"})
    master.api("POST", "/models", bob, json={"name": "bobs-model"})
    url = f"{master.url}/api/v1/models/bobs-model/versions"
    r = master._http().post(url, headers=bob, json={"checkpointUuid": chosen})
    assert r.status_code == 403, r.text  # bob cannot register alice's checkpoint
    version = master.api("POST", "/models/e2e-gc-model/versions", alice, json={"checkpointUuid": chosen})
    r = master._http().request(
        "DELETE", f"{master.url}/api/v1/checkpoints", headers=bob, json={"checkpointUuids": [chosen]}
    )
    assert r.status_code == 403, r.text  # nor delete it

    # Keep nothing: every directory goes but the registered one.
    storage = {"saveExperimentBest": 0, "saveTrialBest": 0, "saveTrialLatest": 0}
    master.api("PATCH", f"/experiments/{exp}", alice, json={"checkpointStorage": storage})
    rows = settled(master, alice, exp, kept=1)
    assert on_disk(master) & {c["uuid"] for c in rows} == {chosen}
    print(f"registered: {len(rows)} written, 1 left on disk under 0/0/0 (the registered one)")

    # Its version deleted, the next collection takes it too.
    number = version["modelVersion"]["version"]
    master.api("DELETE", f"/models/e2e-gc-model/versions/{number}", alice)
    settled(master, alice, exp, kept=0)
    assert chosen not in on_disk(master)


def test_a_paused_trial_keeps_only_its_latest_checkpoint_and_resumes_from_it(
    master: Master, alice: dict[str, str]
) -> None:
    exp = master.create_experiment(alice, PAUSE, GC_CONTEXT)
    deadline = time.monotonic() + 90
    while len(checkpoints(master, alice, exp)) < 2:
        assert time.monotonic() < deadline, master.diagnose(exp)
        time.sleep(0.3)
    master.api("POST", f"/experiments/{exp}/pause", alice)
    deadline = time.monotonic() + 60
    while True:
        (trial,) = master.trials(alice, exp)
        runs = master.api("GET", f"/trials/{trial['id']}", alice)["trial"]["runs"]
        if trial["state"] == "STATE_PAUSED" and runs[-1]["state"] not in ("PENDING", "RUNNING"):
            break
        assert time.monotonic() < deadline, master.diagnose(exp)
        time.sleep(0.3)
    # The policy keeps nothing, but a paused trial keeps the checkpoint it resumes from.
    rows = settled(master, alice, exp, kept=1)
    latest = trial["latestCheckpointUuid"]
    assert on_disk(master) & {c["uuid"] for c in rows} == {latest}
    assert len(rows) >= 2  # the others were deleted
    print(f"paused: {len(rows)} written before the pause, 1 left on disk (its latest)")

    master.api("POST", f"/experiments/{exp}/activate", alice)
    assert master.wait_state(alice, exp, DONE, 120) == "STATE_COMPLETED", master.diagnose(exp)
    logs = sorted((master.user_jobs / f"exp-{exp}" / f"trial-{trial['id']}").glob("run-*/output.log"))
    assert len(logs) == 2 and f"resumed from {latest}" in logs[1].read_text()
    rows = settled(master, alice, exp, kept=0)  # ended: nothing is kept under this policy
    print(f"resumed and completed: {len(rows)} written in all, 0 left on disk")
