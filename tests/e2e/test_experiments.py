"""Experiments end to end on the real local cluster: master → searcher → Slurm jobs (as a researcher) →
harness → master. Every assertion is about what the platform recorded and what Slurm saw."""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.conftest import Master, make_alice
from tests.slurm.fixtures import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CONST = """
name: e2e-const
entrypoint: python3 train.py
hyperparameters: {increment_by: 2, sleep_s: 0.02}
searcher: {name: single, metric: validation_loss, max_length: {batches: 20}}
max_restarts: 0
"""

ASHA = """
name: e2e-asha
entrypoint: python3 train.py
reproducibility: {experiment_seed: 3}
hyperparameters:
  increment_by: {type: int, minval: 1, maxval: 100}
  sleep_s: 0.02
searcher:
  name: async_halving
  metric: validation_loss
  max_trials: 4
  max_concurrent_trials: 2
  num_rungs: 2
  divisor: 2
  max_length: {batches: 20}
max_restarts: 0
"""


def _metrics(master: Master, headers: dict[str, str], trial_id: int, group: str) -> list[dict[str, object]]:
    rows = master.api("GET", f"/trials/{trial_id}/metrics", headers, params={"group": group})
    return list(rows.get("metrics", rows.get("data", [])))


def _sacct_uids(job_ids: list[str]) -> dict[str, tuple[str, int]] | None:
    """{job id: (user, uid)} once slurmdbd has recorded every job's end (it records asynchronously), else None.

    slurmdbd lags behind the controller, and Slurm 22.05 first records a short job with uid 0 (root), as
    PENDING or even COMPLETED, before its start record fills the uid in: wait for a finished record with a
    uid, so a job that really ran as root keeps uid 0 and times the wait out.
    """
    assert job_ids, "the master recorded no Slurm job"
    out = subprocess.run(
        ["sacct", "-X", "-n", "-a", "-P", "--format=JobIDRaw,User,UID,State", "-j", ",".join(job_ids)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split("|") for line in out.splitlines() if line.count("|") >= 3]
    found = {r[0]: (r[1], int(r[2])) for r in rows if r[3] not in ("PENDING", "RUNNING") and r[2].isdigit()}
    if any(uid == 0 for _, uid in found.values()):
        return None
    return found if set(found) >= set(job_ids) else None


def test_const_experiment_runs_as_the_researcher_and_completes(master: Master, alice: dict[str, str]) -> None:
    exp = master.create_experiment(alice, CONST)
    assert master.wait_state(alice, exp, {"STATE_COMPLETED", "STATE_ERROR"}, 120) == "STATE_COMPLETED", (
        master.diagnose(exp)
    )
    (trial,) = master.trials(alice, exp)
    assert trial["state"] == "STATE_COMPLETED" and trial["stepsCompleted"] == 20
    assert trial["searcherMetricValue"] == pytest.approx(1 / (1 + 40))
    training = _metrics(master, alice, trial["id"], "training")
    assert sorted(int(m["stepsCompleted"]) for m in training) == list(range(1, 21))
    assert trial["latestCheckpointUuid"]
    jobs = master.job_ids()
    recorded = wait_for(lambda: _sacct_uids(jobs), 60, "slurmdbd to record the job as run by a non-root uid")
    assert {recorded[j][1] for j in jobs} == {master.researcher.uid}, recorded
    # What the job itself wrote is owned by the researcher too (ground truth, not an accounting record).
    (run_dir,) = (master.user_jobs / f"exp-{exp}").glob("trial-*/run-*")
    assert (run_dir / "exit.json").stat().st_uid == master.researcher.uid


def test_async_halving_pauses_and_resumes_trials_and_picks_the_best(
    master: Master, alice: dict[str, str]
) -> None:
    exp = master.create_experiment(alice, ASHA)
    assert master.wait_state(alice, exp, TERMINAL_OK, 300) == "STATE_COMPLETED", master.diagnose(exp)
    trials = master.trials(alice, exp)
    assert len(trials) == 4 and all(t["state"] == "STATE_COMPLETED" for t in trials)
    best = min(trials, key=lambda t: t["searcherMetricValue"])
    assert best["stepsCompleted"] == 20  # the best trial trained to the last rung
    assert best["hparams"]["increment_by"] == max(t["hparams"]["increment_by"] for t in trials)
    for t in trials:
        steps = [int(m["stepsCompleted"]) for m in _metrics(master, alice, t["id"], "training")]
        assert len(steps) == len(set(steps)), f"duplicated metrics for trial {t['id']}"
    exp_row = master.experiment(alice, exp)
    assert exp_row["progress"] == 1.0
    # One context archive for the experiment, written as the researcher, unpacked into each trial's work/.
    exp_dir = master.user_jobs / f"exp-{exp}"
    assert [p.name for p in exp_dir.glob("*.tar.gz")] == ["context.tar.gz"]
    assert (exp_dir / "context.tar.gz").stat().st_uid == master.researcher.uid
    assert not list(exp_dir.glob("trial-*/*.tar.gz"))
    assert all((exp_dir / f"trial-{t['id']}" / "work" / "train.py").is_file() for t in trials)


TERMINAL_OK = {"STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED"}

LONG = """
name: e2e-long
entrypoint: python3 train.py
hyperparameters: {increment_by: 1, sleep_s: 0.2}
searcher: {name: single, metric: validation_loss, max_length: {batches: 60}}
max_restarts: 0
"""


def _wait_trial(master: Master, headers: dict[str, str], exp: int, pred, what: str, timeout_s: float = 90):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        trials = master.trials(headers, exp)
        if trials and pred(trials[0]):
            return trials[0]
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}\n{master.diagnose(exp)}")


def _runs_of(master: Master, exp: int, trial_id: int) -> list[str]:
    return [
        p.read_text()
        for p in sorted((master.user_jobs / f"exp-{exp}" / f"trial-{trial_id}").glob("run-*/output.log"))
    ]


def test_pause_and_activate_resume_from_the_latest_checkpoint(master: Master, alice: dict[str, str]) -> None:
    exp = master.create_experiment(alice, LONG)
    trial = _wait_trial(master, alice, exp, lambda t: t["stepsCompleted"] >= 10, "10 steps")
    master.api("POST", f"/experiments/{exp}/pause", alice)
    trial = _wait_trial(master, alice, exp, lambda t: t["state"] == "STATE_PAUSED", "the pause")
    # The job checkpointed and exited: nothing of the trial is left in Slurm.
    wait_for(lambda: not master.jobs_of(exp, trial["id"]), 30, "the paused trial's job to leave Slurm")
    paused_at = _wait_trial(master, alice, exp, lambda t: t["latestCheckpointUuid"], "a checkpoint")[
        "stepsCompleted"
    ]
    master.api("POST", f"/experiments/{exp}/activate", alice)
    assert master.wait_state(alice, exp, TERMINAL_OK, 180) == "STATE_COMPLETED", master.diagnose(exp)
    logs = _runs_of(master, exp, trial["id"])
    assert len(logs) == 2
    assert "preempted at step" in logs[0]
    assert "resumed from" in logs[1]
    steps = [int(m["stepsCompleted"]) for m in _metrics(master, alice, trial["id"], "training")]
    assert steps == sorted(set(steps)) and steps[-1] == 60  # strictly increasing, no duplicates
    assert paused_at >= 10


@pytest.mark.exclusive  # an urgent job preempts every batch job on the cluster
def test_slurm_preemption_resubmits_from_the_checkpoint(
    master: Master, alice: dict[str, str], tmp_path: Path
) -> None:
    # 30 s of work: Slurm needs ~10 s (sched_interval=5) to decide on the preemption once the urgent job waits.
    exp = master.create_experiment(alice, LONG.replace("sleep_s: 0.2", "sleep_s: 0.5"))
    trial = _wait_trial(master, alice, exp, lambda t: t["stepsCompleted"] >= 10, "10 steps")
    # A high-priority job that needs every node of the cluster preempts the trial's job (SIGTERM + grace time).
    urgent = subprocess.run(
        ["runuser", "-u", master.researcher.name, "--", "sbatch", "--parsable", "-p", "urgent", "--exclusive",
         "-N", str(_node_count()), "-o", "/dev/null", "--wrap", "sleep 2"],
        capture_output=True, text=True, check=True, cwd="/",
    ).stdout.strip()  # fmt: skip
    assert urgent
    assert master.wait_state(alice, exp, TERMINAL_OK, 240) == "STATE_COMPLETED", master.diagnose(exp)
    (trial,) = master.trials(alice, exp)
    assert trial["restarts"] == 0  # preemption does not use up restarts
    logs = _runs_of(master, exp, trial["id"])
    assert len(logs) >= 2 and "resumed from" in logs[1]
    steps = [int(m["stepsCompleted"]) for m in _metrics(master, alice, trial["id"], "training")]
    assert steps == sorted(set(steps)) and steps[-1] == 60


def _node_count() -> int:
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-p", "batch", "-o", "%N"], capture_output=True, text=True, check=True
    )
    return len(set(out.stdout.split()))


def test_master_killed_mid_experiment_loses_nothing_and_runs_nothing_twice(own_master: Master) -> None:
    master, alice = own_master, make_alice(own_master)
    config = ASHA.replace("name: e2e-asha", "name: e2e-restart").replace("sleep_s: 0.02", "sleep_s: 0.1")
    exp = master.create_experiment(alice, config)
    _wait_trial(master, alice, exp, lambda t: t["stepsCompleted"] >= 3, "training to start")
    logs = sorted((master.user_jobs / f"exp-{exp}").glob("trial-*/run-*/output.log"))
    sizes = {p: p.stat().st_size for p in logs}
    master.kill9()
    # The jobs go on while the master is down: their logs grow, or (a trial at the end of its searcher
    # operation waits for the master without a word) Slurm still runs them a while later.
    down = time.monotonic()
    wait_for(
        lambda: any(p.stat().st_size > n for p, n in sizes.items())
        or (time.monotonic() - down > 5 and bool(master.jobs_of(exp, states="RUNNING"))),
        30, "a trial to log, or to run, without a master",
    )  # fmt: skip
    master.start()
    assert master.wait_state(alice, exp, TERMINAL_OK, 300) == "STATE_COMPLETED", master.diagnose(exp)
    trials = master.trials(alice, exp)
    assert len(trials) == 4  # no trial lost, none created twice
    for t in trials:
        steps = [int(m["stepsCompleted"]) for m in _metrics(master, alice, t["id"], "training")]
        assert Counter(steps).most_common(1)[0][1] == 1, f"duplicated metrics for trial {t['id']}"
    # No second job of the experiment is left running (job names repeat across masters: by comment).
    assert master.jobs_of(exp, states="RUNNING") == [], "a job of the experiment outlived it"


def test_a_failing_trial_restarts_then_errors_with_the_reason(master: Master, alice: dict[str, str]) -> None:
    config = CONST.replace("max_restarts: 0", "max_restarts: 1").replace(
        "sleep_s: 0.02", "sleep_s: 0.02, fail: true"
    )
    exp = master.create_experiment(alice, config)
    assert master.wait_state(alice, exp, TERMINAL_OK, 120) == "STATE_ERROR", master.diagnose(exp)
    (trial,) = master.trials(alice, exp)
    assert trial["state"] == "STATE_ERROR" and trial["restarts"] == 1
    assert "non-zero" in trial["exitMessage"]  # the reason is shown to the user
    logs = _runs_of(master, exp, trial["id"])
    assert len(logs) == 2 and all("failing on purpose" in log for log in logs)


MODEL_ASHA = """
name: e2e-model-asha
entrypoint: python3 train.py
reproducibility: {experiment_seed: 2}
hyperparameters:
  increment_by: {type: int, minval: 1, maxval: 100}
  sleep_s: 0.1
searcher:
  name: async_halving
  metric: validation_loss
  max_trials: 8
  max_concurrent_trials: 2
  num_rungs: 2
  divisor: 2
  max_length: {batches: 12}
  promotion: pause
  proposals: model
max_restarts: 0
"""


def test_model_proposals_with_pause_promotion_survive_a_master_restart(own_master: Master) -> None:
    """Issue 40: a `proposals: model` search with pause promotion runs to completion across a kill -9 of the
    master. The searcher's model lives in its snapshot (the master rebuilds the search from it at every
    pass), so the restarted master goes on with the same model: every trial is created once, the later
    ones are proposed by the model, and each trial records where its hyperparameters came from."""
    master, alice = own_master, make_alice(own_master)
    exp = master.create_experiment(alice, MODEL_ASHA)
    # Kill once three results are in (one hyperparameter: the model needs 2), mid-search.
    wait_for(
        lambda: sum(t["stepsCompleted"] >= 6 for t in master.trials(alice, exp)) >= 3,
        120,
        "three trials to reach the first rung",
    )
    before = {t["id"]: t for t in master.trials(alice, exp)}
    master.kill9()
    master.start()
    assert master.wait_state(alice, exp, TERMINAL_OK, 240) == "STATE_COMPLETED", master.diagnose(exp)
    trials = master.trials(alice, exp)
    assert len(trials) == 8, [t["id"] for t in trials]  # none lost, none created twice
    for trial_id, t in before.items():  # what was decided before the restart stands
        after = next(u for u in trials if u["id"] == trial_id)
        assert after["hparams"] == t["hparams"] and after["proposal"] == t["proposal"]
    kinds = [t["proposal"] for t in trials]
    # A third of the model's proposals are random on purpose; with experiment_seed 2 the searcher's
    # draws make 5 of the 8 trials model proposals in the simulator, whatever the order of events.
    assert kinds[:2] == ["random", "random"] and "model" in kinds, kinds
    assert {t["stepsCompleted"] for t in trials} == {6, 12}  # some stopped at the first rung, some promoted
    assert all(1 <= t["hparams"]["increment_by"] <= 100 for t in trials)
