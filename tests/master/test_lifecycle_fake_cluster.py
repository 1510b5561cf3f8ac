"""The lifecycle core (job driver + loop) against a scripted Slurm cluster and a real database, in seconds.

`slurm_backend.fake.FakeCluster` answers `SlurmCli`'s commands as Slurm 22.05 does (recorded outputs); the
API is the real one (a harness's reports go through it); time is the fake cluster's clock. Each scenario of
a real cluster has a twin on the local cluster (tests/e2e/test_slurm_faults.py) where it can be made to
happen: a controller outage, a submit limit, a pending reason.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.cli import experiment as cli_experiment
from hpc_master.cli import trial as cli_trial
from hpc_master.db.engine import transaction
from hpc_master.db.models import TrialModel, TrialRunModel
from hpc_master.lifecycle.jobs import JobDriver
from hpc_master.lifecycle.loop import LifecycleLoop
from hpc_master.lifecycle.waiting import SLURM_UNAVAILABLE
from hpc_master.masterconf import MasterConfig
from hpc_master.paths import get_job_storage_root
from hpc_master.services.lifecycle import allocate_trial_run
from slurm_backend import Poller, SlurmCli
from slurm_backend.fake import FakeCluster
from tests.master.helpers import create_experiment, login

SINGLE = """\
entrypoint: python3 train.py
searcher: {name: single, metric: validation_loss, max_length: {batches: 100}}
hyperparameters: {lr: 0.1}
max_restarts: 2
"""
FOUR = """\
entrypoint: python3 train.py
searcher: {name: random, metric: validation_loss, max_trials: 4, max_concurrent_trials: 4,
           max_length: {batches: 100}}
hyperparameters: {lr: {type: double, minval: 0.001, maxval: 0.1}}
reproducibility: {experiment_seed: 3}
"""
POLL_S = 10.0
LOST_AFTER_S = 120.0


@dataclass
class World:
    """A master (API + loop + job driver) on a fake cluster; `restart()` is a new master on the same DB."""

    client: TestClient
    sessions: sessionmaker[Session]
    config: MasterConfig
    cluster: FakeCluster = field(default_factory=lambda: FakeCluster(sleep=lambda _s: None))
    headers: dict[str, str] = field(default_factory=dict)
    loop: LifecycleLoop = field(init=False)

    def __post_init__(self) -> None:
        self.headers = login(self.client)
        self.restart()

    def restart(self) -> None:
        cli = SlurmCli(runner=self.cluster, sleep=lambda _s: None)
        poller = Poller(cli, interval_s=POLL_S, lost_after_s=LOST_AFTER_S, clock=self.cluster.monotonic)
        driver = JobDriver(
            self.sessions, self.config, cli, poller, python="/usr/bin/python3", clock=self.cluster.monotonic
        )
        driver.acts_for_users = False  # jobs run as the master's account (the fake's "root")
        self.loop = LifecycleLoop(self.sessions, driver)

    @property
    def jobs(self) -> JobDriver:
        assert self.loop.jobs is not None
        return self.loop.jobs

    def tick(self, advance_s: float = POLL_S, times: int = 1) -> None:
        for _ in range(times):
            self.cluster.advance(advance_s)
            self.loop.tick()

    # ---- reading the database -------------------------------------------------------------------------
    def trials(self, exp_id: int) -> list[TrialModel]:
        with transaction(self.sessions) as s:
            rows = list(
                s.scalars(
                    select(TrialModel).where(TrialModel.experiment_id == exp_id).order_by(TrialModel.id)
                )
            )
            s.expunge_all()
            return rows

    def trial(self, exp_id: int) -> TrialModel:
        (trial,) = self.trials(exp_id)
        return trial

    def runs(self, trial_id: int) -> list[TrialRunModel]:
        with transaction(self.sessions) as s:
            rows = list(
                s.scalars(
                    select(TrialRunModel)
                    .where(TrialRunModel.trial_id == trial_id)
                    .order_by(TrialRunModel.run_number)
                )
            )
            s.expunge_all()
            return rows

    def job(self, trial_id: int) -> str:
        job_id = self.runs(trial_id)[-1].slurm_job_id
        assert job_id is not None
        return job_id

    def experiment_state(self, exp_id: int) -> str:
        r = self.client.get(f"/api/v1/experiments/{exp_id}", headers=self.headers)
        return str(r.json()["experiment"]["state"])

    # ---- what a job's harness does ---------------------------------------------------------------------
    def train(self, trial_id: int, run: int, steps: range) -> None:
        items = [
            {
                "trialRunId": run,
                "stepsCompleted": s,
                "group": "training",
                "metrics": {"avgMetrics": {"loss": 1 / s}},
            }
            for s in steps
        ]
        r = self.client.post(
            f"/api/v1/trials/{trial_id}/metrics/batch", headers=self.headers, json={"metrics": items}
        )
        assert r.status_code == 200, r.text

    def validate(self, trial_id: int, run: int, steps: int) -> None:
        item = {"trialRunId": run, "stepsCompleted": steps, "group": "validation",
                "metrics": {"avgMetrics": {"validation_loss": 1 / steps}}}  # fmt: skip
        r = self.client.post(
            f"/api/v1/trials/{trial_id}/metrics/batch", headers=self.headers, json={"metrics": [item]}
        )
        assert r.status_code == 200, r.text

    def checkpoint(self, trial_id: int, run: int, steps: int) -> None:
        body = {"checkpoint": {"uuid": str(uuid.uuid4()), "trialId": trial_id, "trialRunId": run,
                               "metadata": {"steps_completed": steps}, "resources": {"state.pt": 10}}}  # fmt: skip
        r = self.client.post("/api/v1/checkpoints", headers=self.headers, json=body)
        assert r.status_code == 200, r.text

    def exit_file(
        self, exp_id: int, trial_id: int, run: int, *, preempted: bool, signal: str | None = None
    ) -> None:
        run_dir = Path(get_job_storage_root()) / f"exp-{exp_id}" / f"trial-{trial_id}" / f"run-{run}"
        run_dir.mkdir(parents=True, exist_ok=True)
        info = {"preempted": preempted, "signal": signal, "exitCode": 0}
        (run_dir / "exit.json").write_text(json.dumps(info))

    def training_steps(self, trial_id: int) -> list[int]:
        r = self.client.get(
            f"/api/v1/trials/{trial_id}/metrics", headers=self.headers, params={"group": "training"}
        )
        return [int(m["stepsCompleted"]) for m in r.json()["metrics"]]

    def finish_trial(self, exp_id: int, trial_id: int, run: int, first_step: int = 1) -> None:
        """The job trains to the searcher's length, validates, exits 0; the loop learns it."""
        self.train(trial_id, run, range(first_step, 101))
        self.checkpoint(trial_id, run, 100)
        self.validate(trial_id, run, 100)
        self.tick()
        self.exit_file(exp_id, trial_id, run, preempted=False)
        self.cluster.complete(self.job(trial_id))
        self.tick(times=2)


@pytest.fixture
def world(client: TestClient, sessions: sessionmaker[Session], config: MasterConfig) -> World:
    return World(client, sessions, config)


def started(world: World, exp_id: int) -> TrialModel:
    """Create → the searcher's trial → submitted → started by Slurm → RUNNING in the master."""
    world.tick()
    trial = world.trial(exp_id)
    world.cluster.start(world.job(trial.id))
    world.tick()
    assert world.runs(trial.id)[-1].state == "RUNNING"
    return trial


# ---- the ordinary life of a trial -----------------------------------------------------------------------


def test_submit_run_and_complete(world: World) -> None:
    exp_id = create_experiment(world.client, world.headers, SINGLE)
    world.tick()
    trial = world.trial(exp_id)
    (run,) = world.runs(trial.id)
    assert run.state == "PENDING" and run.slurm_job_id == "1"
    job = world.cluster.job("1")
    assert job.comment.endswith(f"exp={exp_id},trial={trial.id},run=1") and job.user == "root"
    world.cluster.start("1", "node2")
    world.tick()
    assert [(r.state, r.node_list) for r in world.runs(trial.id)] == [("RUNNING", "node2")]
    world.finish_trial(exp_id, trial.id, 1)
    assert world.trial(exp_id).state == "COMPLETED"
    assert world.experiment_state(exp_id) == "STATE_COMPLETED"
    assert world.training_steps(trial.id) == list(range(1, 101))
    assert world.cluster.count("sbatch") == 1


@pytest.mark.storage  # the lifecycle's guarded writes
def test_preemption_resubmits_from_the_checkpoint_and_every_step_is_exact(world: World) -> None:
    exp_id = create_experiment(world.client, world.headers, SINGLE)
    trial = started(world, exp_id)
    world.train(trial.id, 1, range(1, 46))
    world.checkpoint(trial.id, 1, 40)  # steps 41-45 were trained after it: lost with the job
    world.cluster.preempt(world.job(trial.id))
    world.tick()
    runs = world.runs(trial.id)
    assert [(r.run_number, r.state, r.exit_reason) for r in runs] == [
        (1, "PREEMPTED", "SLURM_PREEMPTED"), (2, "PENDING", None)
    ]  # fmt: skip
    assert world.trial(exp_id).restarts == 0  # a preemption is no failure
    assert world.training_steps(trial.id) == list(range(1, 41))  # rolled back to the checkpoint
    world.cluster.start(world.job(trial.id))
    world.tick()
    world.finish_trial(exp_id, trial.id, 2, first_step=41)
    assert world.trial(exp_id).state == "COMPLETED"
    assert world.training_steps(trial.id) == list(range(1, 101))


def test_a_checkpointed_time_limit_resubmits_and_a_plain_one_restarts(world: World) -> None:
    exp_id = create_experiment(world.client, world.headers, SINGLE)
    trial = started(world, exp_id)
    world.checkpoint(trial.id, 1, 30)
    world.exit_file(exp_id, trial.id, 1, preempted=True, signal="SIGUSR1")  # the lead-time signal came
    world.cluster.complete(world.job(trial.id))  # it checkpointed and exited 0 before the limit
    world.tick()
    assert world.runs(trial.id)[0].exit_reason == "TIME_LIMIT_CHECKPOINTED"
    assert world.trial(exp_id).restarts == 0
    world.cluster.start(world.job(trial.id))
    world.tick()
    world.cluster.time_out(world.job(trial.id))  # no checkpoint this time: Slurm killed it at the limit
    world.tick()
    runs = world.runs(trial.id)
    assert [r.exit_reason for r in runs] == ["TIME_LIMIT_CHECKPOINTED", "TIME_LIMIT", None]
    assert world.trial(exp_id).restarts == 1 and world.trial(exp_id).state == "ACTIVE"


def test_pause_and_activate_while_running(world: World) -> None:
    exp_id = create_experiment(world.client, world.headers, SINGLE)
    trial = started(world, exp_id)
    assert world.client.post(f"/api/v1/experiments/{exp_id}/pause", headers=world.headers).status_code == 200
    world.tick()
    assert world.cluster.job(world.job(trial.id)).state == "RUNNING"  # it checkpoints and exits by itself
    world.checkpoint(trial.id, 1, 20)
    world.exit_file(exp_id, trial.id, 1, preempted=True, signal="SIGTERM")
    world.cluster.complete(world.job(trial.id))
    world.tick()
    assert world.trial(exp_id).state == "PAUSED"
    assert [(r.state, r.exit_reason) for r in world.runs(trial.id)] == [("PREEMPTED", "PAUSED_BY_USER")]
    world.tick(times=3)
    assert world.cluster.count("sbatch") == 1  # paused: nothing is submitted
    assert (
        world.client.post(f"/api/v1/experiments/{exp_id}/activate", headers=world.headers).status_code == 200
    )
    world.tick()
    assert [r.state for r in world.runs(trial.id)] == ["PREEMPTED", "PENDING"]
    assert world.cluster.count("sbatch") == 2


def test_pausing_a_job_still_pending_in_slurm_cancels_it(world: World) -> None:
    exp_id = create_experiment(world.client, world.headers, SINGLE)
    world.tick()
    trial = world.trial(exp_id)
    world.client.post(f"/api/v1/experiments/{exp_id}/pause", headers=world.headers)
    world.tick(times=2)
    assert world.cluster.job(world.runs(trial.id)[0].slurm_job_id or "").state == "CANCELLED"
    assert world.trial(exp_id).state == "PAUSED"
    assert [r.exit_reason for r in world.runs(trial.id)] == ["PAUSED_BY_USER"]


# ---- lost jobs: only sacct or a grace period says so ----------------------------------------------------


def test_a_job_missing_from_one_squeue_answer_is_not_lost(world: World) -> None:
    exp_id = create_experiment(world.client, world.headers, SINGLE)
    trial = started(world, exp_id)
    world.cluster.hide_from_squeue_once(world.job(trial.id))
    world.tick()  # sacct still says RUNNING: not an end
    world.tick()
    assert [(r.state, r.exit_reason) for r in world.runs(trial.id)] == [("RUNNING", None)]


def test_a_job_slurm_forgot_is_lost_after_the_grace_period_and_restarted(world: World) -> None:
    exp_id = create_experiment(world.client, world.headers, SINGLE)
    trial = started(world, exp_id)
    job_id = world.job(trial.id)
    world.cluster.forget(job_id, accounting=False)  # slurmctld lost its state, and slurmdbd never heard of it
    world.tick(times=int(LOST_AFTER_S // POLL_S))
    assert [r.state for r in world.runs(trial.id)] == ["RUNNING"]  # within the grace period: waiting
    world.tick(times=2)
    runs = world.runs(trial.id)
    assert [(r.state, r.exit_reason) for r in runs] == [("FAILED", "JOB_LOST"), ("PENDING", None)]
    assert "missing from squeue for 1" in (runs[0].exit_message or "")
    assert world.trial(exp_id).restarts == 1


def test_a_job_that_ended_while_missing_from_squeue_ends_by_sacct(world: World) -> None:
    exp_id = create_experiment(world.client, world.headers, SINGLE)
    trial = started(world, exp_id)
    job_id = world.job(trial.id)
    world.cluster.fail(job_id, 3)
    world.cluster.advance(400)  # past MinJobAge: squeue forgot it, sacct did not
    world.tick()
    first = world.runs(trial.id)[0]
    assert (first.state, first.exit_reason) == ("FAILED", "NONZERO_EXIT")


# ---- a controller outage --------------------------------------------------------------------------------


def test_a_controller_outage_loses_no_run_and_burns_no_restart(world: World) -> None:
    exp_id = create_experiment(world.client, world.headers, FOUR)
    world.tick()
    trials = world.trials(exp_id)
    assert len(trials) == 4
    first = trials[0]
    world.cluster.start(world.job(first.id))
    world.tick()
    # The searcher's next trial arrives while slurmctld is down: it waits in the master.
    world.cluster.kill_controller()
    world.cluster.complete(world.job(first.id))  # the job ends meanwhile; slurmctld learns of it later
    world.exit_file(exp_id, first.id, 1, preempted=False)
    world.client.post(f"/api/v1/trials/{trials[1].id}/kill", headers=world.headers)
    world.tick(advance_s=5, times=12)  # a minute without a controller
    for t in world.trials(exp_id):
        assert [r.exit_reason for r in world.runs(t.id)] in ([None], []), t.id
        assert t.restarts == 0
    # A job that must be cancelled waits too: scancel is tried again after a backoff, not every tick (12
    # here), and not at all once the poller's failed poll has shown the controller down.
    assert 1 <= world.cluster.count("scancel") <= 2
    world.cluster.restart_controller()
    world.tick(times=3)
    states = {t.id: (t.state, [r.exit_reason for r in world.runs(t.id)]) for t in world.trials(exp_id)}
    assert states[first.id] == ("COMPLETED", ["SEARCHER_DONE"])
    assert states[trials[1].id] == ("CANCELED", ["KILLED_BY_USER"])
    assert all(t.restarts == 0 for t in world.trials(exp_id))
    assert all(r.exit_reason != "JOB_LOST" for t in world.trials(exp_id) for r in world.runs(t.id))


def test_a_trial_created_during_an_outage_waits_in_the_master_and_is_submitted_after(world: World) -> None:
    world.cluster.kill_controller()
    exp_id = create_experiment(world.client, world.headers, SINGLE)
    world.tick(advance_s=5, times=10)
    trial = world.trial(exp_id)
    (run,) = world.runs(trial.id)
    assert (run.state, run.slurm_job_id, run.pending_reason) == ("PENDING", None, SLURM_UNAVAILABLE)
    # Backoff: sbatch is not tried every tick but 5 s, 10 s, 20 s ... apart (at 5, 10, 20 and 40 s of these
    # 50), and each try is one sbatch and one retry (SlurmCli's own three retries would keep a real
    # cluster's sbatch busy for 45 s per try).
    assert world.cluster.count("sbatch") == 4 * 2
    shown = world.client.get(f"/api/v1/trials/{trial.id}", headers=world.headers).json()["trial"]["runs"][-1]
    assert shown["waitingIn"] == "master" and shown["pendingReason"] == SLURM_UNAVAILABLE
    world.cluster.restart_controller()
    world.tick(advance_s=60, times=2)
    (run,) = world.runs(trial.id)  # the same run, submitted once
    assert run.slurm_job_id is not None and run.pending_reason is None
    assert len(world.cluster.jobs) == 1


def test_a_job_restarted_by_a_recovering_controller_stays_the_same_run(world: World) -> None:
    exp_id = create_experiment(world.client, world.headers, SINGLE)
    trial = started(world, exp_id)
    world.cluster.kill_controller()
    world.tick(advance_s=2)
    world.cluster.restart_controller(forget_recent_s=60)  # its start was never saved: PENDING, then again
    world.tick()
    world.cluster.schedule()
    world.tick()
    assert [(r.run_number, r.state, r.exit_reason) for r in world.runs(trial.id)] == [(1, "RUNNING", None)]
    assert world.cluster.job(world.job(trial.id)).starts == 2


# ---- submit limits: wait, never fail ---------------------------------------------------------------------


def test_a_submit_limit_keeps_trials_waiting_in_the_master_until_jobs_end(world: World) -> None:
    world.cluster.max_submit_jobs["root"] = 2
    exp_id = create_experiment(world.client, world.headers, FOUR)
    world.tick()
    trials = world.trials(exp_id)
    waiting = [world.runs(t.id)[-1] for t in trials]
    assert [r.slurm_job_id is not None for r in waiting] == [True, True, False, False]
    assert [r.pending_reason for r in waiting[2:]] == ["AssocMaxSubmitJobLimit"] * 2
    assert all(t.state == "ACTIVE" for t in world.trials(exp_id))
    refused = world.cluster.count("sbatch") - 2
    assert refused == 1  # the second waiting trial did not even try: the limit is known
    world.tick(times=3)
    assert world.cluster.count("sbatch") - 2 == 1  # nor again until a job ends (or limit_retry_s passes)
    shown = world.client.get(f"/api/v1/trials/{trials[2].id}", headers=world.headers).json()["trial"]
    assert str(cli_trial.waiting_text(shown["runs"][-1])).startswith(
        "in the master (not submitted yet) since"
    )

    first = trials[0]
    world.cluster.start(world.job(first.id))
    world.tick()
    world.finish_trial(exp_id, first.id, 1)  # its job ends: a place frees up
    runs = [world.runs(t.id)[-1] for t in trials]
    assert [r.slurm_job_id is not None for r in runs] == [True, True, True, False]
    assert [r.run_number for r in runs] == [1, 1, 1, 1]  # the same runs, no restart
    assert all(t.state in ("ACTIVE", "COMPLETED") and t.restarts == 0 for t in world.trials(exp_id))


def test_a_qos_submit_limit_waits_and_a_per_job_limit_fails_with_slurms_words(world: World) -> None:
    world.cluster.qos_max_submit_per_user["normal"] = 1
    exp_id = create_experiment(world.client, world.headers, FOUR)
    world.tick()
    reasons = [world.runs(t.id)[-1].pending_reason for t in world.trials(exp_id)]
    assert reasons[1:] == ["QOSMaxSubmitJobPerUserLimit"] * 3

    world.cluster.qos_max_submit_per_user.clear()
    real = world.cluster._sbatch

    def deny(args: list[str], script: str, user: str) -> Any:
        from slurm_backend.cli import CommandResult
        from slurm_backend.fake import SBATCH_LIMIT

        return CommandResult(1, "", SBATCH_LIMIT.format(limit="QOSMaxWallDurationPerJobLimit"))

    world.cluster._sbatch = deny  # type: ignore[method-assign]
    world.tick(advance_s=120)
    world.cluster._sbatch = real  # type: ignore[method-assign]
    failed = [t for t in world.trials(exp_id) if t.state == "ERROR"]
    assert len(failed) == 3
    assert all("QOSMaxWallDurationPerJobLimit" in (t.exit_message or "") for t in failed)


# ---- why a trial waits ----------------------------------------------------------------------------------


def test_a_trial_pending_in_slurm_shows_slurms_reason_and_since_when(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    world.cluster.slots = 1
    exp_id = create_experiment(world.client, world.headers, FOUR)
    world.tick()
    world.cluster.schedule()
    world.tick()
    trials = world.trials(exp_id)
    reasons = [world.runs(t.id)[-1].pending_reason for t in trials]
    assert reasons == [None, "Resources", "Priority", "Priority"]
    since = world.runs(trials[2].id)[-1].pending_since
    world.tick(times=2)
    assert world.runs(trials[2].id)[-1].pending_since == since  # the same reason: still since then
    world.cluster.qos_max_running_per_user["normal"] = 1
    world.cluster.schedule()
    world.tick()
    assert world.runs(trials[2].id)[-1].pending_reason == "QOSMaxJobsPerUserLimit"
    assert world.runs(trials[2].id)[-1].pending_since != since

    class ApiSession:  # what the CLI's HTTP session does, through the test client
        def call(self, method: str, path: str, **kw: Any) -> Any:
            r = world.client.request(method, path, headers=world.headers, **kw)
            assert r.status_code == 200, r.text
            return r.json()

    for module in (cli_trial, cli_experiment):
        monkeypatch.setattr(module, "session_from_args", lambda _args: ApiSession())
    args = type(
        "Args", (), {"json": False, "metrics": False, "trial_id": trials[2].id, "experiment_id": exp_id}
    )
    cli_trial._describe(args)  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "Waiting:" in out and "in Slurm since" in out
    assert "QOSMaxJobsPerUserLimit (the QOS's limit on your running jobs" in out
    cli_experiment._describe(args)  # type: ignore[arg-type]
    out = capsys.readouterr().out
    for t in trials[1:]:
        assert f"trial {t.id}: in Slurm since" in out
    assert f"trial {trials[0].id}:" not in out  # running: not waiting


# ---- adopt by comment, master restart -------------------------------------------------------------------


def test_a_lost_sbatch_answer_is_adopted_by_comment_not_submitted_twice(world: World) -> None:
    exp_id = create_experiment(world.client, world.headers, SINGLE)
    world.cluster.lose_next_submit_answer()  # the controller created the job; its answer timed out
    world.tick()
    (run,) = world.runs(world.trial(exp_id).id)
    assert run.slurm_job_id == "1"  # found by its comment at once

    # The same, and then the controller stops answering: the run waits, and is adopted when it is back.
    exp_id = create_experiment(world.client, world.headers, SINGLE)
    world.cluster.lose_next_submit_answer(then_controller_down=True)
    world.tick(advance_s=5, times=6)
    trial = world.trial(exp_id)
    (run,) = world.runs(trial.id)
    assert (run.state, run.slurm_job_id, run.pending_reason) == ("PENDING", None, SLURM_UNAVAILABLE)
    world.cluster.restart_controller()
    world.tick(advance_s=60)
    (run,) = world.runs(trial.id)
    assert run.slurm_job_id == "2" and len(world.cluster.jobs) == 2
    assert world.trial(exp_id).restarts == 0


@pytest.mark.storage  # the lifecycle's guarded writes
def test_a_restarted_master_adopts_a_job_whose_id_it_never_recorded(world: World) -> None:
    exp_id = create_experiment(world.client, world.headers, SINGLE)
    world.cluster.lose_next_submit_answer()
    world.tick()
    world.restart()  # nothing of the first master's memory survives
    world.tick()
    trial = world.trial(exp_id)
    assert [(r.run_number, r.slurm_job_id) for r in world.runs(trial.id)] == [(1, "1")]
    assert len(world.cluster.jobs) == 1


def test_a_restarted_master_submits_the_run_it_held_for_a_limit_and_follows_the_others(world: World) -> None:
    world.cluster.max_submit_jobs["root"] = 3
    exp_id = create_experiment(world.client, world.headers, FOUR)
    world.tick()
    trials = world.trials(exp_id)
    world.cluster.start(world.job(trials[0].id))
    world.tick()
    world.restart()
    world.tick()
    assert world.runs(trials[0].id)[-1].state == "RUNNING"  # followed again
    assert world.runs(trials[3].id)[-1].pending_reason == "AssocMaxSubmitJobLimit"
    world.cluster.max_submit_jobs["root"] = 4
    world.tick(advance_s=61)  # limit_retry_s: the user's other jobs may have ended
    runs = [world.runs(t.id) for t in trials]
    assert [[(r.run_number, r.slurm_job_id is not None) for r in rs] for rs in runs] == [[(1, True)]] * 4
    assert len(world.cluster.jobs) == 4


def test_a_run_waiting_in_the_master_ends_without_slurm_when_its_experiment_is_paused(world: World) -> None:
    world.cluster.max_submit_jobs["root"] = 1
    exp_id = create_experiment(world.client, world.headers, FOUR)
    world.tick()
    world.client.post(f"/api/v1/experiments/{exp_id}/pause", headers=world.headers)
    world.tick(times=2)
    ends = [[r.exit_reason for r in world.runs(t.id)] for t in world.trials(exp_id)]
    assert ends == [["PAUSED_BY_USER"]] * 4
    assert "never submitted to Slurm (it waited in the master: AssocMaxSubmitJobLimit)" in (
        world.runs(world.trials(exp_id)[3].id)[0].exit_message or ""
    )
    assert world.cluster.count("sbatch") == 2 and len(world.cluster.jobs) == 1


# ---- a slow controller does not slow the API ------------------------------------------------------------


def test_a_slow_controller_never_blocks_the_api(world: World) -> None:
    """Every Slurm command takes 1 s (a controller under load) while the loop runs in its thread, as in the
    master: creating experiments and reading them answer as fast as with an idle controller."""
    world.cluster.sleep = time.sleep
    world.cluster.auto_schedule = True
    world.loop.interval_s = 0.05
    idle = _api_latencies(world, 3)
    world.cluster.latency_s = 1.0
    world.loop.start()
    try:
        deadline = time.monotonic() + 10
        while world.cluster.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert world.cluster.in_flight == 1  # the loop waits for sbatch now
        busy = _api_latencies(world, 5)
    finally:
        world.cluster.latency_s = 0.0
        world.loop.stop(timeout_s=10)
    assert world.cluster.count("sbatch") >= 1
    # The median: one request may wait for the CPUs (a full CI machine: 1.2 s once); an API the loop blocked
    # would wait for the 1 s commands the loop runs back to back, half of one on average.
    assert sorted(busy)[2] < max(0.3, 5 * sorted(idle)[1]), (idle, busy)


def test_a_master_restarting_while_slurm_does_not_answer_starts_at_once(world: World) -> None:
    """The run it allocated before it stopped is adopted or resubmitted by the loop's thread, not before
    the API starts (where a controller that does not answer would hold the master's start for minutes)."""
    exp_id = create_experiment(world.client, world.headers, SINGLE)
    world.loop.drive_searchers()
    with transaction(world.sessions) as s:  # the master stopped after allocating the run, before sbatch
        allocate_trial_run(s, world.trial(exp_id).id)
    world.restart()
    world.cluster.kill_controller()
    world.cluster.sleep = time.sleep
    world.cluster.latency_s = 1.0
    world.loop.interval_s = 0.05
    t0 = time.monotonic()
    world.loop.start()
    started_in_s = time.monotonic() - t0
    world.cluster.latency_s = 0.0
    world.cluster.restart_controller()
    world.loop.stop(timeout_s=10)
    assert started_in_s < 0.5
    world.tick(advance_s=60)
    assert [r.slurm_job_id for r in world.runs(world.trial(exp_id).id)] == ["1"]


def _api_latencies(world: World, n: int) -> list[float]:
    out: list[float] = []
    for _ in range(n):
        t0 = time.monotonic()
        exp_id = create_experiment(world.client, world.headers, SINGLE)
        assert world.client.get(f"/api/v1/experiments/{exp_id}", headers=world.headers).status_code == 200
        assert (
            world.client.get(f"/api/v1/experiments/{exp_id}/trials", headers=world.headers).status_code == 200
        )
        out.append(time.monotonic() - t0)
    return out
