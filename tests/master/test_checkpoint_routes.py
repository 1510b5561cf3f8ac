"""The checkpoint GC routes on the real app, on SQLite and PostgreSQL: who may call them (no token, another
user's, a trial's own token, the owner, an admin), their bounds, and what they return (Determined's fields)."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import CheckpointGCRequestModel, CheckpointModel, MetricModel
from hpc_master.services import lifecycle
from hpc_master.services.checkpoints.records import CheckpointReport, report_checkpoint
from hpc_master.services.checkpoints.remover import CheckpointRemover
from hpc_master.services.states import TerminationReason

from .helpers import create_experiment, login, make_user

POLICY = {"checkpointStorage": {"saveExperimentBest": 1, "saveTrialBest": 0, "saveTrialLatest": 0}}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def trial_with_checkpoints(
    sessions: sessionmaker[Session], exp_id: int, losses: dict[int, float], request_id: str = "r1"
) -> tuple[int, int, str, list[str]]:
    """(trial id, run id, its token, checkpoint uuids in step order): a trial whose run is live."""
    out = []
    with transaction(sessions) as s:
        trial = lifecycle.create_trial(s, exp_id, request_id, {"lr": 0.1})
        run = lifecycle.allocate_trial_run(s, trial.id)
        for steps, loss in losses.items():
            ckpt = str(uuid.uuid4())
            s.add(MetricModel(trial_id=trial.id, trial_run_id=1, group="validation", steps_completed=steps,
                              metrics={"avgMetrics": {"validation_loss": loss}}))  # fmt: skip
            report_checkpoint(
                s,
                CheckpointReport(
                    uuid=ckpt, trial_id=trial.id, trial_run_id=1, steps_completed=steps,
                    resources={"model.pt": 100 * steps}, metadata={"steps_completed": steps},
                    report_time=dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=steps),
                ),
            )  # fmt: skip
            out.append(ckpt)
        return trial.id, run.id, lifecycle.mint_trial_token(s, trial.id), out


def end_run(sessions: sessionmaker[Session], run_id: int) -> None:
    with transaction(sessions) as s:
        lifecycle.finish_trial_run(s, run_id, TerminationReason.SEARCHER_DONE)


def delete(client: TestClient, headers: dict[str, str], uuids: list[str]) -> Any:
    return client.request("DELETE", "/api/v1/checkpoints", headers=headers, json={"checkpointUuids": uuids})


@pytest.fixture
def world(client: TestClient, sessions: sessionmaker[Session]) -> dict[str, Any]:
    """alice's experiment with a running trial (3 checkpoints, best at 10), bob, an admin, and a trial of
    bob's (whose token must not reach alice's checkpoints)."""
    client.app.state.det.checkpoint_remover = CheckpointRemover(as_owner=False)  # type: ignore[attr-defined]
    admin = login(client)
    alice, bob = make_user(client, admin, "alice"), make_user(client, admin, "bob")
    exp_id = create_experiment(client, alice)
    trial_id, run_id, token, ckpts = trial_with_checkpoints(sessions, exp_id, {5: 0.5, 10: 0.2, 15: 0.4})
    bob_exp = create_experiment(client, bob)
    _, _, bob_token, _ = trial_with_checkpoints(sessions, bob_exp, {5: 0.1}, "b1")
    return {
        "admin": admin, "alice": alice, "bob": bob, "exp": exp_id, "trial": trial_id, "run": run_id,
        "token": bearer(token), "bob_token": bearer(bob_token), "ckpts": ckpts,
    }  # fmt: skip


# ---------------------------------------------------------------- PATCH /api/v1/experiments/{id}


def test_patching_the_gc_policy_is_for_the_owner_and_admins(
    client: TestClient, sessions: sessionmaker[Session], world: dict[str, Any]
) -> None:
    url = f"/api/v1/experiments/{world['exp']}"
    assert client.patch(url, json=POLICY).status_code == 401
    assert client.patch(url, headers=world["bob"], json=POLICY).status_code == 403
    assert client.patch(url, headers=world["token"], json=POLICY).status_code == 403  # a trial's token
    r = client.patch(url, headers=world["alice"], json=POLICY)
    assert r.status_code == 200, r.text
    exp = r.json()["experiment"]
    assert exp["config"]["checkpoint_storage"]["save_experiment_best"] == 1
    assert exp["config"]["checkpoint_storage"]["save_trial_latest"] == 0
    assert {"checkpointSize", "checkpointCount"} <= exp.keys()
    with transaction(sessions) as s:  # collected again under the new policy
        assert s.scalar(select(func.count()).select_from(CheckpointGCRequestModel)) == 1
    r = client.patch(url, headers=world["admin"], json={"checkpointStorage": {"saveTrialLatest": 2}})
    storage = r.json()["experiment"]["config"]["checkpoint_storage"]
    assert (storage["save_experiment_best"], storage["save_trial_latest"]) == (1, 2)  # left out: kept
    r = client.patch(url, headers=world["alice"], json={"name": "renamed", "description": "d"})
    assert (r.json()["experiment"]["name"], r.json()["experiment"]["description"]) == ("renamed", "d")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"checkpointStorage": {"saveTrialBest": -1}}, "checkpointStorage.saveTrialBest"),
        ({"checkpointStorage": {"saveExperimentBest": 2**31}}, "checkpointStorage.saveExperimentBest"),
        ({"checkpointStorage": {"saveTrialLatest": "many"}}, "checkpointStorage.saveTrialLatest"),
        ({"name": "x" * 600}, "name"),
        ({"id": 2**31}, "id"),
    ],
)
def test_patch_bodies_are_bounded(client: TestClient, world: dict[str, Any], body: Any, field: str) -> None:
    r = client.patch(f"/api/v1/experiments/{world['exp']}", headers=world["alice"], json=body)
    assert r.status_code == 400 and r.json()["field"] == field, r.text


def test_patch_refuses_another_id_and_unknown_experiments(client: TestClient, world: dict[str, Any]) -> None:
    r = client.patch(f"/api/v1/experiments/{world['exp']}", headers=world["alice"], json={"id": 999})
    assert r.status_code == 400 and r.json()["field"] == "id"
    assert client.patch("/api/v1/experiments/424242", headers=world["admin"], json=POLICY).status_code == 404
    assert (
        client.patch(f"/api/v1/experiments/{2**31}", headers=world["admin"], json=POLICY).status_code == 400
    )


# ---------------------------------------------------------------- preview_gc


def test_preview_shows_what_a_policy_would_delete_in_determineds_shape(
    client: TestClient, sessions: sessionmaker[Session], world: dict[str, Any]
) -> None:
    params = {"save_experiment_best": 0, "save_trial_best": 1, "save_trial_latest": 0}
    url = f"/api/v1/experiments/{world['exp']}/preview_gc"
    assert client.get(url, params=params).status_code == 401
    assert client.get(url, params=params, headers=world["token"]).status_code == 403
    r = client.get(url, params=params, headers=world["bob"])  # anyone may look, as at its checkpoints
    assert r.status_code == 200 and r.json()["checkpoints"] == []  # the trial runs: nothing collectable
    end_run(sessions, world["run"])
    body = client.get(url, params=params, headers=world["alice"]).json()
    assert body["metric_name"] == "validation_loss" and body["policy"]["save_trial_latest"] == 0
    rows = body["checkpoints"]
    assert [(c["UUID"], c["StepsCompleted"]) for c in rows] == [
        (world["ckpts"][0], 5),
        (world["ckpts"][2], 15),
    ]
    assert rows[0]["TrialID"] == world["trial"] and rows[0]["State"] == "COMPLETED"
    assert rows[0]["ValidationMetrics"] == {"validation_loss": 0.5} and rows[0]["Size"] == 500
    legacy = client.get(f"/experiments/{world['exp']}/preview_gc", params=params, headers=world["alice"])
    assert legacy.json()["checkpoints"] == rows  # where Determined's own CLI asks
    own = client.get(
        url, headers=world["alice"]
    ).json()  # no fields: the experiment's policy (1 best, 1 latest)
    assert [c["StepsCompleted"] for c in own["checkpoints"]] == [5]
    assert client.get(url, params={"save_trial_best": -1}, headers=world["alice"]).json()["field"] == (
        "save_trial_best"
    )


# ---------------------------------------------------------------- DELETE /api/v1/checkpoints


def test_deleting_checkpoints_auth_matrix(
    client: TestClient, sessions: sessionmaker[Session], world: dict[str, Any]
) -> None:
    first, _, latest = world["ckpts"]
    assert delete(client, {}, [first]).status_code == 401
    assert delete(client, world["bob"], [first]).status_code == 403
    assert delete(client, world["bob_token"], [first]).status_code == 403  # another trial's token
    r = delete(client, world["alice"], [latest])
    assert r.status_code == 409 and "resume" in r.json()["message"]  # the running trial's latest
    assert delete(client, world["token"], [first]).json() == {}  # the trial's own harness
    second = world["ckpts"][1]
    assert delete(client, world["admin"], [second]).json() == {}
    end_run(sessions, world["run"])
    assert delete(client, world["alice"], [latest]).json() == {}  # ended: its latest may go
    with transaction(sessions) as s:
        assert {s.get(CheckpointModel, u).state for u in world["ckpts"]} == {"DELETED"}  # type: ignore[union-attr]
    got = client.get(f"/api/v1/checkpoints/{latest}", headers=world["bob"]).json()["checkpoint"]
    assert got["state"] == "STATE_DELETED" and got["size"] == 1500


def test_delete_bodies_are_bounded(client: TestClient, world: dict[str, Any]) -> None:
    too_many = [str(uuid.uuid4()) for _ in range(10_001)]
    assert delete(client, world["admin"], too_many).status_code == 400
    r = delete(client, world["admin"], ["../etc"])
    assert r.status_code == 400 and r.json()["field"].startswith("checkpointUuids")
    assert delete(client, world["admin"], [str(uuid.uuid4())]).status_code == 404


def test_a_deletion_that_fails_is_answered_and_recorded(client: TestClient, world: dict[str, Any]) -> None:
    """Removing as the owner: alice's Unix account (her name, by default) does not exist here: nothing goes."""
    client.app.state.det.checkpoint_remover = CheckpointRemover(as_owner=True)  # type: ignore[attr-defined]
    first = world["ckpts"][0]
    root = Path(client.app.state.det.config.checkpoint_dir())  # type: ignore[attr-defined]
    (root / first).mkdir(parents=True)
    r = delete(client, world["alice"], [first])
    assert r.status_code == 200
    assert r.json()["failed"][0]["uuid"] == first and "Unix account 'alice'" in r.json()["failed"][0]["error"]
    got = client.get(f"/api/v1/checkpoints/{first}", headers=world["alice"]).json()["checkpoint"]
    assert got["state"] == "STATE_COMPLETED" and got["deletion"]["attempts"] == 1
    assert (root / first).is_dir()


# ---------------------------------------------------------------- storage accounting in the API


@pytest.mark.storage  # aggregate queries
def test_experiments_and_trials_carry_their_checkpoint_totals(
    client: TestClient, sessions: sessionmaker[Session], world: dict[str, Any]
) -> None:
    delete(client, world["alice"], [world["ckpts"][0]])
    exp = client.get(f"/api/v1/experiments/{world['exp']}", headers=world["bob"]).json()["experiment"]
    assert (exp["checkpointCount"], exp["checkpointSize"]) == (2, 2500)
    assert (exp["deletedCheckpointCount"], exp["deletedCheckpointSize"]) == (1, 500)
    listed = client.get("/api/v1/experiments", headers=world["alice"]).json()["experiments"]
    assert {e["id"]: e["checkpointSize"] for e in listed}[world["exp"]] == 2500
    trial = client.get(f"/api/v1/trials/{world['trial']}", headers=world["alice"]).json()["trial"]
    assert (trial["checkpointCount"], trial["totalCheckpointSize"], trial["deletedCheckpointSize"]) == (
        2,
        2500,
        500,
    )
    trials = client.get(f"/api/v1/experiments/{world['exp']}/trials", headers=world["alice"]).json()["trials"]
    assert trials[0]["totalCheckpointSize"] == 2500
