"""A trial restarted after a failure resumes from its latest checkpoint: metrics reported after that
checkpoint are rolled back, and late reports of the replaced run are refused, so no step is ever recorded
twice (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import ExperimentModel, MetricModel, TrialModel
from hpc_master.lifecycle import searchers
from hpc_master.services import lifecycle as svc
from hpc_master.services.states import TerminationReason
from tests.master.helpers import context_file, login

pytestmark = pytest.mark.storage  # transactions of the lifecycle

C10 = "00000000-0000-4000-8000-000000000010"  # the checkpoint at step 10

CONFIG = """\
entrypoint: python3 train.py
searcher: {name: single, metric: validation_loss, max_length: {batches: 100}}
hyperparameters: {lr: 0.1}
max_restarts: 3
"""


def _report(
    client: TestClient, headers: dict[str, str], trial: int, run: int, steps: range
) -> dict[str, int]:
    items = [
        {
            "trialRunId": run,
            "stepsCompleted": s,
            "group": "training",
            "metrics": {"avgMetrics": {"loss": 1.0 / s}},
        }
        for s in steps
    ]
    r = client.post(f"/api/v1/trials/{trial}/metrics/batch", headers=headers, json={"metrics": items})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _steps(sessions: sessionmaker[Session], trial: int) -> list[tuple[int, int]]:
    with transaction(sessions) as s:
        rows = s.execute(
            select(MetricModel.trial_run_id, MetricModel.steps_completed)
            .where(MetricModel.trial_id == trial)
            .order_by(MetricModel.steps_completed)
        ).all()
        return [(int(a), int(b)) for a, b in rows]


def test_restart_rolls_back_metrics_after_the_checkpoint(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    headers = login(client)
    r = client.post(
        "/api/v1/experiments",
        headers=headers,
        json={"config": CONFIG, "modelDefinition": [context_file("train.py")], "activate": True},
    )
    exp_id = int(r.json()["experiment"]["id"])
    with transaction(sessions) as s:
        exp = s.get(ExperimentModel, exp_id)
        assert exp is not None
        searchers.drive(s, exp)
        trial_id = s.scalars(select(TrialModel.id).where(TrialModel.experiment_id == exp_id)).one()
        run1 = svc.allocate_trial_run(s, trial_id).id
        svc.start_trial_run(s, run1, "1001")

    _report(client, headers, trial_id, 1, range(1, 13))  # steps 1..12
    ckpt = {
        "uuid": C10,
        "trialId": trial_id,
        "trialRunId": 1,
        "resources": {},
        "metadata": {"steps_completed": 10},
    }
    assert client.post("/api/v1/checkpoints", headers=headers, json={"checkpoint": ckpt}).status_code == 200

    with transaction(sessions) as s:  # the node died: Slurm reported NODE_FAIL
        outcome = svc.finish_trial_run(s, run1, TerminationReason.NODE_FAIL)
        assert outcome.resubmit
        svc.allocate_trial_run(s, trial_id)  # run 2, from checkpoint c10 at step 10

    assert _steps(sessions, trial_id) == [(1, s) for s in range(1, 11)]  # 11 and 12 rolled back
    late = _report(client, headers, trial_id, 1, range(13, 15))  # a late flush of the replaced run
    assert late == {"accepted": 0, "duplicates": 2}
    assert _report(client, headers, trial_id, 2, range(11, 16))["accepted"] == 5
    steps = _steps(sessions, trial_id)
    assert [s for _, s in steps] == list(range(1, 16))  # strictly increasing, nothing twice
    with transaction(sessions) as s:
        trial = s.get(TrialModel, trial_id)
        assert trial is not None and trial.steps_completed == 15 and trial.restarts == 1
