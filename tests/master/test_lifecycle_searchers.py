"""The searcher side of the lifecycle loop, on SQLite and PostgreSQL: events from the DB in, actions applied.

Experiments are created and validations reported through the real API; `searchers.drive` then runs in one
transaction per experiment, exactly as the loop calls it.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import ExperimentModel, TrialModel
from hpc_master.lifecycle import searchers
from tests.master.helpers import context_file, login

SINGLE = """\
entrypoint: python3 train.py
searcher: {name: single, metric: validation_loss, max_length: {batches: 100}}
hyperparameters: {lr: 0.1}
"""

ASHA = """\
entrypoint: python3 train.py
reproducibility: {experiment_seed: 7}
searcher:
  name: async_halving
  metric: validation_loss
  max_trials: 4
  max_concurrent_trials: 4
  num_rungs: 2
  divisor: 2
  max_length: {batches: 100}
hyperparameters:
  lr: {type: double, minval: 0.001, maxval: 0.1}
"""


def _create(client: TestClient, headers: dict[str, str], config: str) -> int:
    r = client.post(
        "/api/v1/experiments",
        headers=headers,
        json={"config": config, "modelDefinition": [context_file("train.py")], "activate": True},
    )
    assert r.status_code == 200, r.text
    return int(r.json()["experiment"]["id"])


def _drive(sessions: sessionmaker[Session], exp_id: int) -> int:
    with transaction(sessions) as s:
        exp = s.get(ExperimentModel, exp_id)
        assert exp is not None
        return searchers.drive(s, exp)


def _trials(sessions: sessionmaker[Session], exp_id: int) -> list[TrialModel]:
    with transaction(sessions) as s:
        rows = list(
            s.scalars(select(TrialModel).where(TrialModel.experiment_id == exp_id).order_by(TrialModel.id))
        )
        s.expunge_all()
        return rows


def _validate(client: TestClient, headers: dict[str, str], trial_id: int, steps: int, loss: float) -> None:
    item = {"trialRunId": 1, "stepsCompleted": steps, "group": "validation",
            "metrics": {"avgMetrics": {"validation_loss": loss}}}  # fmt: skip
    r = client.post(f"/api/v1/trials/{trial_id}/metrics/batch", headers=headers, json={"metrics": [item]})
    assert r.status_code == 200, r.text


def test_single_search_creates_trains_stops_and_completes(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    headers = login(client)
    exp_id = _create(client, headers, SINGLE)
    assert _drive(sessions, exp_id) >= 2  # Create + ValidateAfter
    (trial,) = _trials(sessions, exp_id)
    assert trial.searcher_op_length == 100 and trial.hparams == {"lr": 0.1}

    _validate(client, headers, trial.id, 50, 0.9)  # before the target: ignored by the search
    _drive(sessions, exp_id)
    assert _trials(sessions, exp_id)[0].searcher_done is False

    _validate(client, headers, trial.id, 100, 0.5)
    _drive(sessions, exp_id)  # Stop: the trial has no live job, so it completes at once
    (trial,) = _trials(sessions, exp_id)
    assert trial.searcher_done and trial.state == "COMPLETED"
    _drive(sessions, exp_id)  # on_trial_closed → Shutdown
    exp = client.get(f"/api/v1/experiments/{exp_id}", headers=headers).json()["experiment"]
    assert exp["state"] == "STATE_COMPLETED"
    assert exp["progress"] == 1.0


def test_asha_pauses_unpromoted_trials_then_stops_them_when_the_rung_is_done(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    headers = login(client)
    exp_id = _create(client, headers, ASHA)
    _drive(sessions, exp_id)
    trials = _trials(sessions, exp_id)
    assert len(trials) == 4
    assert {t.searcher_op_length for t in trials} == {50}  # rung 1 of 2 with divisor 2
    assert len({t.hparams["lr"] for t in trials}) == 4

    # A second experiment with the same seed samples the same hyperparameters (deterministic search).
    twin = _create(client, headers, ASHA)
    _drive(sessions, twin)
    assert [t.hparams for t in _trials(sessions, twin)] == [t.hparams for t in trials]

    for t, loss in zip(trials[:3], (0.4, 0.3, 0.2), strict=True):
        _validate(client, headers, t.id, 50, loss)
    _drive(sessions, exp_id)
    after = {t.id: t for t in _trials(sessions, exp_id)}
    # The worst so far is not promoted yet: paused (its slots freed), not stopped; the better ones go on.
    assert after[trials[0].id].state == "PAUSED"
    assert after[trials[0].id].pause_reason == "PAUSED_BY_SEARCHER"
    assert after[trials[1].id].searcher_op_length == 100
    assert after[trials[2].id].searcher_op_length == 100

    _validate(client, headers, trials[3].id, 50, 0.1)
    _drive(sessions, exp_id)
    after = {t.id: t for t in _trials(sessions, exp_id)}
    # With the rung complete the paused trial can never be promoted: it is closed for good.
    assert after[trials[0].id].state == "COMPLETED"
    assert after[trials[3].id].searcher_op_length == 100

    # Driving again with no new events changes nothing (the snapshot is the whole state).
    before = [(t.id, t.state, t.searcher_op_length) for t in _trials(sessions, exp_id)]
    assert _drive(sessions, exp_id) == 0
    assert [(t.id, t.state, t.searcher_op_length) for t in _trials(sessions, exp_id)] == before


def test_a_promotion_calls_off_a_pause_that_is_still_pending(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    """Pause → (job still running) → Resume: the trial must keep running, not end up paused for good."""
    from hpc_master.services import lifecycle as svc

    headers = login(client)
    exp_id = _create(client, headers, ASHA)
    _drive(sessions, exp_id)
    trials = _trials(sessions, exp_id)
    with transaction(sessions) as s:  # every trial has a running job
        for t in trials:
            run = svc.allocate_trial_run(s, t.id)
            svc.start_trial_run(s, run.id, f"90{t.id}")
    _validate(client, headers, trials[0].id, 50, 0.9)  # alone in its rung: not promoted yet → Pause
    _drive(sessions, exp_id)
    with transaction(sessions) as s:
        run = svc.live_run_of(s, trials[0].id)
        assert run is not None and run.preempt_requested
    for t, loss in zip(trials[1:], (0.8, 0.95, 0.99), strict=True):  # now the first one is in the top half
        _validate(client, headers, t.id, 50, loss)
    _drive(sessions, exp_id)
    with transaction(sessions) as s:
        trial = s.get(TrialModel, trials[0].id)
        run = svc.live_run_of(s, trials[0].id)
        assert trial is not None and run is not None
        assert trial.searcher_op_length == 100 and trial.pause_reason is None
        assert trial.state == "ACTIVE" and not run.preempt_requested


def _told_to_stop(client: TestClient, sessions: sessionmaker[Session], trial_id: int, how: str) -> None:
    """The job hears of the stop request the way a real harness does, with its own per-trial token."""
    from hpc_master.services import users

    with transaction(sessions) as s:
        headers = {"Authorization": f"Bearer {users.mint_trial_token(s, trial_id)}"}
    if how == "operation":  # a ≤0.37 script asks for its next operation: none comes, so its script ends
        r = client.get(f"/api/v1/trials/{trial_id}/searcher/operation?timeoutSeconds=0", headers=headers)
        assert r.status_code == 200 and r.json() == {"op": None, "completed": False}, r.text
    else:  # the harness's preemption long poll: should_preempt() becomes true
        r = client.get(
            f"/api/v1/allocations/{trial_id}.1/signals/preemption?timeoutSeconds=0", headers=headers
        )
        assert r.status_code == 200 and r.json() == {"preempt": True}, r.text


def _job_exits_cleanly(sessions: sessionmaker[Session], trial_id: int) -> tuple[str, bool]:
    """Its job ends with exit status 0, as Slurm reports it; → (termination reason, resubmitted?)."""
    from hpc_master.lifecycle.jobs import record_run_end
    from hpc_master.services import lifecycle as svc
    from slurm_backend import JobStatus, Outcome

    with transaction(sessions) as s:
        run = svc.live_run_of(s, trial_id)
        assert run is not None
        status = JobStatus(job_id=str(run.slurm_job_id), outcome=Outcome.SUCCEEDED, slurm_state="COMPLETED")
        ended = record_run_end(s, run.id, status, {"exitCode": 0, "preempted": False}, "SIGUSR1")
        assert ended is not None
        return str(ended[0]), ended[1].resubmit


@pytest.mark.parametrize("how", ["operation", "preemption"])
def test_a_promotion_after_the_job_was_told_to_pause_resubmits_the_trial(
    client: TestClient, sessions: sessionmaker[Session], how: str
) -> None:
    """Pause → the job is told → Resume → the job exits 0: the trial must run again, not complete early.

    (The e2e ASHA test once lost its best trial this way: it completed after its first rung.)"""
    from hpc_master.services import lifecycle as svc

    headers = login(client)
    exp_id = _create(client, headers, ASHA)
    _drive(sessions, exp_id)
    trials = _trials(sessions, exp_id)
    with transaction(sessions) as s:
        for t in trials:
            run = svc.allocate_trial_run(s, t.id)
            svc.start_trial_run(s, run.id, f"90{t.id}")
    _validate(client, headers, trials[0].id, 50, 0.9)  # alone in its rung → Pause
    _drive(sessions, exp_id)
    _told_to_stop(client, sessions, trials[0].id, how)
    for t, loss in zip(trials[1:], (0.8, 0.95, 0.99), strict=True):  # now it is in the top half → Resume
        _validate(client, headers, t.id, 50, loss)
    _drive(sessions, exp_id)
    with transaction(sessions) as s:
        trial = s.get(TrialModel, trials[0].id)
        run = svc.live_run_of(s, trials[0].id)
        assert trial is not None and run is not None
        assert trial.state == "ACTIVE" and trial.searcher_op_length == 100
        assert run.preempt_requested  # too late to call off: the job is exiting
    assert _job_exits_cleanly(sessions, trials[0].id) == ("PAUSE_CALLED_OFF", True)
    with transaction(sessions) as s:
        trial = s.get(TrialModel, trials[0].id)
        assert trial is not None and trial.state == "ACTIVE" and trial.restarts == 0
        assert trials[0].id in [t.id for t in svc.list_trials_to_submit(s)]


@pytest.mark.parametrize("told", [False, True])
def test_activating_a_pausing_experiment_keeps_or_resubmits_its_trial(
    client: TestClient, sessions: sessionmaker[Session], told: bool
) -> None:
    """`det e pause` then `det e activate` before the job exited: it goes on in place if it had not heard
    of the pause yet; otherwise it exits and is resubmitted at once."""
    from hpc_master.services import lifecycle as svc

    headers = login(client)
    exp_id = _create(client, headers, SINGLE)
    _drive(sessions, exp_id)
    (trial,) = _trials(sessions, exp_id)
    with transaction(sessions) as s:
        run = svc.allocate_trial_run(s, trial.id)
        svc.start_trial_run(s, run.id, "9001")
    assert client.post(f"/api/v1/experiments/{exp_id}/pause", headers=headers).status_code == 200
    if told:
        _told_to_stop(client, sessions, trial.id, "preemption")
    assert client.post(f"/api/v1/experiments/{exp_id}/activate", headers=headers).status_code == 200
    with transaction(sessions) as s:
        row = s.get(TrialModel, trial.id)
        run = svc.live_run_of(s, trial.id)
        assert row is not None and run is not None
        assert row.state == "ACTIVE" and run.preempt_requested is told
    if told:
        assert _job_exits_cleanly(sessions, trial.id) == ("PAUSE_CALLED_OFF", True)
    else:  # nothing asked of it any more: when its script finishes, the trial is done
        r = client.get(
            f"/api/v1/allocations/{trial.id}.1/signals/preemption?timeoutSeconds=0", headers=headers
        )
        assert r.json() == {"preempt": False}
        assert _job_exits_cleanly(sessions, trial.id) == ("SEARCHER_DONE", False)


MODEL_ASHA = """\
entrypoint: python3 train.py
reproducibility: {experiment_seed: 7}
searcher:
  name: async_halving
  metric: validation_loss
  max_trials: 10
  max_concurrent_trials: 2
  num_rungs: 2
  divisor: 2
  max_length: {batches: 100}
  proposals: model
hyperparameters:
  lr: {type: double, minval: 0.001, maxval: 0.1}
"""


def test_model_proposals_are_recorded_with_each_trial_and_shown_by_the_api(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    """`proposals: model` (issue 40): the first trials are sampled, later ones proposed by the model, and each
    trial row (and the API's trial) says which. The master rebuilds the search from its snapshot at every
    pass, so every proposal here was made by a restored searcher."""
    headers = login(client)
    exp_id = _create(client, headers, MODEL_ASHA)
    _drive(sessions, exp_id)
    reported: set[tuple[int, int]] = set()
    for _ in range(40):
        pending = [
            t for t in _trials(sessions, exp_id)
            if t.state == "ACTIVE" and t.searcher_op_length and (t.id, t.searcher_op_length) not in reported
        ]  # fmt: skip
        if not pending:
            break
        t = pending[0]
        assert t.searcher_op_length is not None
        reported.add((t.id, t.searcher_op_length))
        _validate(client, headers, t.id, t.searcher_op_length, (t.hparams["lr"] - 0.03) ** 2)
        _drive(sessions, exp_id)
        _drive(sessions, exp_id)  # closings, and what they lead to
    trials = _trials(sessions, exp_id)
    assert len(trials) == 10
    kinds = [t.proposal for t in trials]
    assert kinds[:3] == ["random"] * 3  # nothing to learn from yet (one hyperparameter: 3 results needed)
    assert "model" in kinds and set(kinds) <= {"random", "model"}
    assert all(0.001 <= t.hparams["lr"] <= 0.1 for t in trials)
    listed = client.get(f"/api/v1/experiments/{exp_id}/trials", headers=headers).json()["trials"]
    assert [t["proposal"] for t in listed] == kinds
