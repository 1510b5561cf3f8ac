"""The routes and fields Determined's own client needs (tagged ``determined-compat`` in the OpenAPI document), on SQLite and PostgreSQL.
``tests/determined_client`` runs that client itself against them."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import CheckpointModel, MetricModel
from hpc_master.services import lifecycle
from tests.master.helpers import create_experiment, login, make_user

SECRET_CONFIG = """\
name: secretive
entrypoint: python3 train.py
searcher:
  name: single
  metric: validation_loss
  smaller_is_better: true
  max_length:
    batches: 100
hyperparameters:
  lr: 0.1
environment:
  environment_variables:
    - WANDB_API_KEY=abc123
"""


def test_info_and_master(client: TestClient) -> None:
    info = client.get("/info").json()
    assert info["version"] == "0.38.1" and info["hpcDetVersion"] and info["cluster_id"] and info["master_id"]
    master = client.get("/api/v1/master").json()
    assert master["hasCustomLogo"] is False and master["strictJobQueueControl"] is False


@pytest.mark.storage  # listing queries
def test_users_by_name_by_id_and_paginated(client: TestClient) -> None:
    admin = login(client)
    alice = make_user(client, admin, "alice")
    me = client.get("/api/v1/users/alice/by-username", headers=alice).json()["user"]
    assert me["username"] == "alice"
    assert client.get(f"/api/v1/users/{me['id']}", headers=alice).json()["user"] == me
    missing = client.get("/api/v1/users/nobody/by-username", headers=alice)
    assert missing.status_code == 404 and "nobody" in missing.json()["message"]
    assert client.get("/api/v1/users/alice/by-username").status_code == 401

    page = client.get("/api/v1/users", headers=alice, params={"offset": 1, "limit": 1}).json()
    assert [u["username"] for u in page["users"]] == ["determined"]
    assert page["pagination"] == {"offset": 1, "limit": 1, "startIndex": 1, "endIndex": 2, "total": 3}
    everyone = client.get("/api/v1/users", headers=alice).json()
    assert [u["username"] for u in everyone["users"]] == ["admin", "determined", "alice"]
    assert everyone["pagination"]["endIndex"] == everyone["pagination"]["total"] == 3
    client.patch(f"/api/v1/users/{me['id']}", headers=admin, json={"active": False})
    active = client.get("/api/v1/users", headers=admin, params={"active": "true"}).json()["users"]
    assert "alice" not in [u["username"] for u in active]


def test_experiment_lists_carry_the_config_masked_for_others(client: TestClient) -> None:
    admin = login(client)
    alice, bob = make_user(client, admin, "alice"), make_user(client, admin, "bob")
    experiment_id = create_experiment(client, alice, SECRET_CONFIG)

    def listed(headers: dict[str, str]) -> dict[str, object]:
        exps = client.get("/api/v1/experiments", headers=headers).json()["experiments"]
        return next(e for e in exps if e["id"] == experiment_id)

    own, other = listed(alice), listed(bob)
    assert own["projectOwnerId"] == 1 and own["numTrials"] == 0
    assert "abc123" in str(own["config"]) and "abc123" in str(own["originalConfig"])
    assert "abc123" not in str(other["config"]) and "abc123" not in str(other["originalConfig"])
    assert other["config"]["name"] == "secretive"  # type: ignore[index]


@pytest.mark.storage  # listing queries
def test_experiment_lists_carry_each_experiments_own_trial_ids(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    alice = make_user(client, login(client), "alice")
    first, second, empty = (create_experiment(client, alice) for _ in range(3))
    with transaction(sessions) as s:  # interleaved, so that ids alone do not group them
        made = [
            (e, lifecycle.create_trial(s, e, f"r{i}", {"lr": 0.1}).id)
            for i, e in enumerate([second, first] * 3)
        ]
    page = client.get("/api/v1/experiments", headers=alice).json()["experiments"]
    got = {e["id"]: (e["trialIds"], e["numTrials"]) for e in page}
    for exp in (first, second):
        ids = sorted(t for e, t in made if e == exp)
        assert got[exp] == (ids, 3)
    assert got[empty] == ([], 0)
    one = client.get(f"/api/v1/experiments/{first}", headers=alice).json()["experiment"]
    assert one["trialIds"] == got[first][0]


def test_trial_workloads(client: TestClient, sessions: sessionmaker[Session]) -> None:
    alice = make_user(client, login(client), "alice")
    experiment_id = create_experiment(client, alice)
    with transaction(sessions) as s:
        trial_id = lifecycle.create_trial(s, experiment_id, "r1", {"lr": 0.1}).id
        for steps in (10, 20):
            s.add(MetricModel(trial_id=trial_id, trial_run_id=1, group="training", steps_completed=steps,
                              metrics={"avgMetrics": {"loss": 1 / steps}, "batchMetrics": [{"loss": 1.0}]}))  # fmt: skip
        s.add(MetricModel(trial_id=trial_id, trial_run_id=1, group="validation", steps_completed=20,
                          metrics={"validation_loss": 0.5}))  # fmt: skip
        s.add(
            MetricModel(
                trial_id=trial_id, trial_run_id=1, group="custom", steps_completed=20, metrics={"x": 1}
            )
        )
        ckpt = str(uuid.uuid4())
        s.add(CheckpointModel(uuid=ckpt, trial_id=trial_id, trial_run_id=1, steps_completed=20,
                              resources={"model.pt": 5}))  # fmt: skip
    url = f"/api/v1/trials/{trial_id}/workloads"

    answer = client.get(url, headers=alice).json()
    kinds = [(next(iter(w)), next(iter(w.values()))["totalBatches"]) for w in answer["workloads"]]
    assert kinds == [("training", 10), ("training", 20), ("checkpoint", 20), ("validation", 20)]
    assert answer["pagination"]["total"] == 4
    first = answer["workloads"][0]["training"]
    assert first["metrics"] == {"avgMetrics": {"loss": 0.1}} and first["numInputs"] == 0
    assert answer["workloads"][2]["checkpoint"]["uuid"] == ckpt
    assert answer["workloads"][2]["checkpoint"]["state"] == "STATE_COMPLETED"
    assert answer["workloads"][3]["validation"]["metrics"] == {"avgMetrics": {"validation_loss": 0.5}}

    batch = client.get(url, headers=alice, params={"includeBatchMetrics": "true", "limit": 1}).json()
    assert batch["workloads"][0]["training"]["metrics"]["batchMetrics"] == [{"loss": 1.0}]
    assert batch["pagination"] == {"offset": 0, "limit": 1, "startIndex": 0, "endIndex": 1, "total": 4}
    page = client.get(url, headers=alice, params={"offset": 3, "limit": 500}).json()
    assert [next(iter(w)) for w in page["workloads"]] == ["validation"]
    only = client.get(url, headers=alice, params={"filter": "FILTER_OPTION_CHECKPOINT"}).json()
    assert [next(iter(w)) for w in only["workloads"]] == ["checkpoint"]
    desc = client.get(url, headers=alice, params={"orderBy": "ORDER_BY_DESC"}).json()
    assert [next(iter(w)) for w in desc["workloads"]] == ["validation", "checkpoint", "training", "training"]
    assert client.get(url, headers=alice, params={"filter": "nonsense"}).status_code == 400
    assert client.get("/api/v1/trials/999999/workloads", headers=alice).status_code == 404


def test_a_missing_api_route_says_so(client: TestClient) -> None:
    headers = login(client)
    r = client.get("/api/v1/templates", headers=headers)
    assert r.status_code == 404 and r.json()["code"] == "not_implemented"
    assert "docs/determined-client.md" in r.json()["message"]
    assert client.put("/api/v1/master", headers=headers).status_code == 405
    # Outside /api the web UI's answers are unchanged.
    assert client.get("/no-such-page", headers={"Accept": "text/html"}).text.startswith("<!doctype html>")
