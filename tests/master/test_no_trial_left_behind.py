"""Every run ends somewhere (issue 26, item 1), driven through the real lifecycle loop on SQLite and PostgreSQL
with a small fake Slurm whose jobs end however the test says.

- The hang: a one-trial experiment, paused and activated, whose job Slurm preempts just as the trial reaches
  its ``max_length`` (the searcher has already said Stop). It used to stay ACTIVE at 100 % forever, with
  "resubmitting" logged and nothing submitted; now the trial completes and so does the experiment.
- The loop's invariant: an ACTIVE trial of an ACTIVE experiment with no live run and nothing queued to submit
  (made directly in the database) is repaired on the next tick, and logged at ERROR with the trial and why.
- Determined 0.38's ``searcher: {name: single, metric: x}`` with no length: the trial is submitted, runs until
  its script ends, and the experiment completes (it used to sit ACTIVE with no run and nothing logged).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import ExperimentModel, TrialModel, TrialRunModel
from hpc_master.lifecycle.jobs import JobDriver
from hpc_master.lifecycle.loop import LifecycleLoop
from hpc_master.masterconf import MasterConfig
from hpc_master.services import lifecycle as svc
from slurm_backend import JobStatus, Outcome, Poller, SlurmCli
from tests.master.helpers import create_experiment, login

SINGLE = """\
entrypoint: python3 train.py
searcher: {name: single, metric: validation_loss, max_length: {batches: 100}}
hyperparameters: {lr: 0.1}
"""
SINGLE_038 = """\
entrypoint: python3 train.py
searcher: {name: single, metric: validation_loss}
hyperparameters: {lr: 0.1}
"""
RANDOM_038 = """\
entrypoint: python3 train.py
searcher: {name: random, metric: validation_loss, max_trials: 3, max_concurrent_trials: 2}
hyperparameters: {lr: {type: double, minval: 0.01, maxval: 0.1}}
"""


class FakeSlurm(SlurmCli):
    """sbatch hands out job ids; a job runs until the test ends it with `end(job_id, outcome)`."""

    def __init__(self) -> None:
        super().__init__()
        self.submitted: list[str] = []
        self.ended: dict[str, Outcome] = {}

    def submit(self, script_text: str, *, as_user: str | None = None) -> str:
        job_id = str(1000 + len(self.submitted))
        self.submitted.append(job_id)
        return job_id

    def end(self, job_id: str, outcome: Outcome) -> None:
        self.ended[job_id] = outcome

    def find_by_comment(self, comment: str, *, user: str | None = None) -> list[str]:
        return []

    def cancel(self, job_id: str, *, signal: str | None = None) -> None:
        self.ended.setdefault(job_id, Outcome.CANCELLED)

    def poll_squeue(self, job_ids: Iterable[str]) -> tuple[dict[str, JobStatus], int]:
        return self.squeue(job_ids), 0

    def squeue(self, job_ids: Iterable[str]) -> dict[str, JobStatus]:
        return {
            j: JobStatus(j, Outcome.RUNNING, "RUNNING", node_list="n1", source="squeue")
            for j in job_ids
            if j not in self.ended
        }

    def sacct(self, job_ids: Iterable[str]) -> dict[str, JobStatus] | None:
        return {
            j: JobStatus(j, self.ended[j], self.ended[j].value, exit_code=0, source="sacct")
            for j in job_ids
            if j in self.ended
        }


def _loop(sessions: sessionmaker[Session], config: MasterConfig, slurm: FakeSlurm) -> LifecycleLoop:
    driver = JobDriver(sessions, config, slurm, Poller(slurm, interval_s=0), python="/usr/bin/python3")
    driver.acts_for_users = False  # jobs run as the master's account (tests may run as root)
    return LifecycleLoop(sessions, driver)


def _state(sessions: sessionmaker[Session], exp_id: int) -> tuple[str, list[TrialModel], list[TrialRunModel]]:
    with transaction(sessions) as s:
        exp = s.get(ExperimentModel, exp_id)
        assert exp is not None
        trials = list(
            s.scalars(select(TrialModel).where(TrialModel.experiment_id == exp_id).order_by(TrialModel.id))
        )
        runs = list(
            s.scalars(
                select(TrialRunModel)
                .where(TrialRunModel.trial_id.in_([t.id for t in trials]))
                .order_by(TrialRunModel.id)
            )
        )
        state = str(exp.state)
        s.expunge_all()
        return state, trials, runs


def _validate(client: TestClient, headers: dict[str, str], trial_id: int, run: int, steps: int) -> None:
    item = {"trialRunId": run, "stepsCompleted": steps, "group": "validation",
            "metrics": {"avgMetrics": {"validation_loss": 1.0 / steps}}}  # fmt: skip
    r = client.post(f"/api/v1/trials/{trial_id}/metrics/batch", headers=headers, json={"metrics": [item]})
    assert r.status_code == 200, r.text


def _ticks(loop: LifecycleLoop, n: int = 3) -> None:
    for _ in range(n):
        loop.tick()


@pytest.mark.parametrize(
    "outcome", [Outcome.PREEMPTED, Outcome.TIMED_OUT, Outcome.FAILED, Outcome.NODE_FAILED, Outcome.OOM]
)
def test_a_job_preempted_as_its_trial_reaches_max_length_after_a_pause_still_completes(
    client: TestClient,
    sessions: sessionmaker[Session],
    config: MasterConfig,
    caplog: pytest.LogCaptureFixture,
    outcome: Outcome,
) -> None:
    caplog.set_level(logging.WARNING, logger="hpc_master.lifecycle.loop")
    headers = login(client)
    exp_id = create_experiment(client, headers, SINGLE)
    slurm = FakeSlurm()
    loop = _loop(sessions, config, slurm)
    loop.tick()
    _, (trial,), runs = _state(sessions, exp_id)
    assert [r.slurm_job_id for r in runs] == ["1000"]

    # Paused and activated while its job was told to stop: the job exits, the trial is resubmitted.
    assert client.post(f"/api/v1/experiments/{exp_id}/pause", headers=headers).status_code == 200
    with transaction(sessions) as s:
        run = s.get(TrialRunModel, runs[0].id)
        assert run is not None and run.preempt_requested
        run.preempt_acked = True  # the job heard of the pause
    assert client.post(f"/api/v1/experiments/{exp_id}/activate", headers=headers).status_code == 200
    slurm.end("1000", Outcome.SUCCEEDED)
    loop.tick()
    _, (trial,), runs = _state(sessions, exp_id)
    assert trial.state == "ACTIVE"
    assert [(r.exit_reason, r.slurm_job_id) for r in runs] == [("PAUSE_CALLED_OFF", "1000"), (None, "1001")]

    # The second run reaches max_length: the searcher says Stop (the job is asked to exit) ...
    _validate(client, headers, trial.id, 2, 100)
    loop.tick()
    _, (trial,), runs = _state(sessions, exp_id)
    assert trial.searcher_done and runs[-1].preempt_requested
    # ... and Slurm preempts (or times out, or fails) the job before it exits by itself.
    slurm.end("1001", outcome)
    _ticks(loop)
    exp_state, (trial,), runs = _state(sessions, exp_id)
    assert trial.state == "COMPLETED", (trial.state, [(r.state, r.exit_reason) for r in runs])
    assert exp_state == "COMPLETED"
    assert slurm.submitted == ["1000", "1001"]  # the searcher was done: nothing more to run
    assert trial.exit_message is not None and "the searcher was done with the trial" in trial.exit_message
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # decided where the run ended


def test_a_stranded_active_trial_is_repaired_and_logged(
    client: TestClient,
    sessions: sessionmaker[Session],
    config: MasterConfig,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """States that no code path should make any more, made directly in the database."""
    headers = login(client)
    done = create_experiment(client, headers, SINGLE)
    pending = create_experiment(client, headers, SINGLE)
    slurm = FakeSlurm()
    loop = _loop(sessions, config, slurm)
    loop.tick()
    with transaction(sessions) as s:
        for exp_id in (done, pending):
            trial = s.scalars(select(TrialModel).where(TrialModel.experiment_id == exp_id)).one()
            run = svc.live_run_of(s, trial.id)
            assert run is not None
            svc.set_run_state(s, run, "PREEMPTED", "test: ended with no next step")  # type: ignore[arg-type]
            if exp_id == done:
                trial.searcher_done = True  # the searcher said Stop: nothing is queued for it
    caplog.set_level(logging.WARNING, logger="hpc_master.lifecycle.loop")
    _ticks(loop)

    exp_state, (trial,), runs = _state(sessions, done)
    assert trial.state == "COMPLETED" and exp_state == "COMPLETED"
    assert len(runs) == 1
    breach = [r for r in caplog.records if f"trial {trial.id}" in r.getMessage()]
    assert breach and breach[0].levelno == logging.ERROR
    assert "no live run" in breach[0].getMessage() and "searcher" in breach[0].getMessage()

    # The other one was queued all along (the searcher still wants it): resubmitted, nothing to repair.
    exp_state, (trial,), runs = _state(sessions, pending)
    assert trial.state == "ACTIVE" and exp_state == "ACTIVE"
    assert [r.state for r in runs] == ["PREEMPTED", "RUNNING"]
    assert not [r for r in caplog.records if f"trial {trial.id}" in r.getMessage()]


def test_a_stopping_trial_with_no_live_run_is_closed(
    client: TestClient,
    sessions: sessionmaker[Session],
    config: MasterConfig,
    caplog: pytest.LogCaptureFixture,
) -> None:
    headers = login(client)
    exp_id = create_experiment(client, headers, SINGLE)
    slurm = FakeSlurm()
    loop = _loop(sessions, config, slurm)
    loop.tick()
    assert client.post(f"/api/v1/experiments/{exp_id}/cancel", headers=headers).status_code == 200
    with transaction(sessions) as s:
        trial = s.scalars(select(TrialModel).where(TrialModel.experiment_id == exp_id)).one()
        assert trial.state == "STOPPING_CANCELED"
        run = svc.live_run_of(s, trial.id)
        assert run is not None
        svc.set_run_state(s, run, "CANCELED", "test: ended behind the loop's back")  # type: ignore[arg-type]
    caplog.set_level(logging.WARNING, logger="hpc_master.lifecycle.loop")
    loop.tick()
    exp_state, (trial,), _ = _state(sessions, exp_id)
    assert (trial.state, exp_state) == ("CANCELED", "CANCELED")
    assert any(f"trial {trial.id}" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)


@pytest.mark.parametrize("ending", [Outcome.SUCCEEDED, Outcome.PREEMPTED])
def test_single_without_a_length_runs_until_its_script_ends(
    client: TestClient, sessions: sessionmaker[Session], config: MasterConfig, ending: Outcome
) -> None:
    headers = login(client)
    exp_id = create_experiment(client, headers, SINGLE_038)
    slurm = FakeSlurm()
    loop = _loop(sessions, config, slurm)
    loop.tick()
    _, (trial,), runs = _state(sessions, exp_id)
    assert trial.state == "ACTIVE" and trial.searcher_op_length is None
    assert [r.slurm_job_id for r in runs] == ["1000"]  # submitted with no length from the searcher

    for steps in (50, 100, 150):  # validations do not end it: only the script decides
        _validate(client, headers, trial.id, 1, steps)
        loop.tick()
    exp_state, (trial,), runs = _state(sessions, exp_id)
    assert (exp_state, trial.state, len(runs)) == ("ACTIVE", "ACTIVE", 1)
    assert trial.searcher_metric == pytest.approx(1 / 150)

    if ending is Outcome.PREEMPTED:  # preempted: resubmitted from its checkpoint, then it ends
        slurm.end("1000", Outcome.PREEMPTED)
        loop.tick()
        _, (trial,), runs = _state(sessions, exp_id)
        assert trial.state == "ACTIVE" and [r.slurm_job_id for r in runs] == ["1000", "1001"]
    slurm.end(slurm.submitted[-1], Outcome.SUCCEEDED)  # the script returned
    _ticks(loop)
    exp_state, (trial,), runs = _state(sessions, exp_id)
    assert (exp_state, trial.state) == ("COMPLETED", "COMPLETED")
    assert runs[-1].exit_reason == "SEARCHER_DONE"


def test_random_without_a_length_runs_each_trial_until_its_script_ends(
    client: TestClient, sessions: sessionmaker[Session], config: MasterConfig
) -> None:
    headers = login(client)
    exp_id = create_experiment(client, headers, RANDOM_038)
    slurm = FakeSlurm()
    loop = _loop(sessions, config, slurm)
    loop.tick()
    assert slurm.submitted == ["1000", "1001"]  # max_concurrent_trials: 2
    for job in ("1000", "1001"):
        slurm.end(job, Outcome.SUCCEEDED)
    _ticks(loop)
    assert slurm.submitted == ["1000", "1001", "1002"]  # the third trial, once one closed
    slurm.end("1002", Outcome.SUCCEEDED)
    _ticks(loop)
    exp_state, trials, _ = _state(sessions, exp_id)
    assert exp_state == "COMPLETED" and [t.state for t in trials] == ["COMPLETED"] * 3
