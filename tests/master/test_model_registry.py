"""The model registry on the real app, on SQLite and PostgreSQL: Determined's routes and fields, who may do
what (no token, another user, a trial's token, the owner, an admin), bounds and errors, and what it means for
checkpoint GC: a registered checkpoint survives any policy (its directory stays on disk), DELETE
/checkpoints and experiment deletion refuse it, and deleting its version makes it collectible again."""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import (
    CheckpointGCRequestModel,
    CheckpointModel,
    ExperimentModel,
    MetricModel,
    ModelVersionModel,
    UserModel,
)
from hpc_master.services import lifecycle, models_registry
from hpc_master.services.access import Principal
from hpc_master.services.checkpoints import gc
from hpc_master.services.checkpoints.gc import CheckpointCollector
from hpc_master.services.checkpoints.records import CheckpointReport, report_checkpoint
from hpc_master.services.checkpoints.remover import CheckpointRemover
from hpc_master.services.states import ExperimentState, TerminationReason

from .helpers import create_experiment, login, make_user

MODELS = "/api/v1/models"
KEEP_NOTHING = {"checkpointStorage": {"saveExperimentBest": 0, "saveTrialBest": 0, "saveTrialLatest": 0}}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def ended_trial_with_checkpoints(
    sessions: sessionmaker[Session], root: Path, exp_id: int, losses: dict[int, float], request_id: str
) -> tuple[str, list[str]]:
    """A trial whose job ended, with a directory (one 100-byte file) and a validation per checkpoint: its
    token and the checkpoint uuids in step order."""
    uuids = []
    with transaction(sessions) as s:
        trial = lifecycle.create_trial(s, exp_id, request_id, {"lr": 0.1})
        run = lifecycle.allocate_trial_run(s, trial.id)
        for steps, loss in losses.items():
            ckpt = str(uuid.uuid4())
            (root / ckpt).mkdir(parents=True)
            (root / ckpt / "model.pt").write_bytes(b"x" * 100)
            s.add(MetricModel(trial_id=trial.id, trial_run_id=1, group="validation", steps_completed=steps,
                              metrics={"avgMetrics": {"validation_loss": loss}}))  # fmt: skip
            report_checkpoint(
                s,
                CheckpointReport(
                    uuid=ckpt, trial_id=trial.id, trial_run_id=1, steps_completed=steps,
                    resources={"model.pt": 100}, metadata={"steps_completed": steps},
                    report_time=dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=steps),
                ),
            )  # fmt: skip
            uuids.append(ckpt)
        token = lifecycle.mint_trial_token(s, trial.id)
    with transaction(sessions) as s:
        lifecycle.finish_trial_run(s, run.id, TerminationReason.SEARCHER_DONE)
    return token, uuids


@pytest.fixture
def world(client: TestClient, sessions: sessionmaker[Session]) -> dict[str, Any]:
    """alice's experiment (an ended trial: checkpoints at 5, 10, 15, best at 10), bob's (one checkpoint), an
    admin, alice's trial's token; checkpoint directories on disk under the master's root."""
    client.app.state.det.checkpoint_remover = CheckpointRemover(as_owner=False)  # type: ignore[attr-defined]
    root = Path(client.app.state.det.config.checkpoint_dir())  # type: ignore[attr-defined]
    root.mkdir(parents=True, exist_ok=True)
    admin = login(client)
    alice, bob = make_user(client, admin, "alice"), make_user(client, admin, "bob")
    exp_id = create_experiment(client, alice)
    token, ckpts = ended_trial_with_checkpoints(sessions, root, exp_id, {5: 0.5, 10: 0.2, 15: 0.4}, "a1")
    bob_exp = create_experiment(client, bob)
    _, bob_ckpts = ended_trial_with_checkpoints(sessions, root, bob_exp, {3: 0.9}, "b1")
    return {
        "admin": admin, "alice": alice, "bob": bob, "exp": exp_id, "ckpts": ckpts, "token": bearer(token),
        "bob_exp": bob_exp, "bob_ckpt": bob_ckpts[0], "root": root,
    }  # fmt: skip


def new_model(client: TestClient, headers: dict[str, str], name: str, **fields: Any) -> dict[str, Any]:
    r = client.post(MODELS, headers=headers, json={"name": name, **fields})
    assert r.status_code == 200, r.text
    model: dict[str, Any] = r.json()["model"]
    return model


def register(client: TestClient, headers: dict[str, str], model: str, ckpt: str, **fields: Any) -> Any:
    return client.post(f"{MODELS}/{model}/versions", headers=headers, json={"checkpointUuid": ckpt, **fields})


def collect(sessions: sessionmaker[Session], root: Path) -> gc.Outcome:
    collector = CheckpointCollector(
        sessions, default_root=root, remover=CheckpointRemover(as_owner=False), min_interval_s=0
    )
    return collector.run_once()


def gc_requests(sessions: sessionmaker[Session], exp_id: int) -> int:
    with transaction(sessions) as s:
        stmt = select(func.count()).where(CheckpointGCRequestModel.experiment_id == exp_id)
        return int(s.scalar(stmt) or 0)


# ---------------------------------------------------------------- the routes, as Determined's


@pytest.mark.storage  # claims and registrations under concurrency, listing queries
def test_create_list_describe_register_list_versions_and_delete(
    client: TestClient, world: dict[str, Any]
) -> None:
    alice = world["alice"]
    five, ten, fifteen = world["ckpts"]
    model = new_model(client, alice, "mnist cnn", description="digits", metadata={"team": "vision"},
                      labels=["cnn", "prod"], notes="# readme")  # fmt: skip
    assert model["name"] == "mnist cnn" and model["description"] == "digits"
    assert (model["numVersions"], model["username"], model["archived"], model["workspaceId"]) == (0, "alice",
                                                                                                   False, 1)  # fmt: skip
    assert model["metadata"] == {"team": "vision"} and model["labels"] == ["cnn", "prod"]
    assert model["notes"] == "# readme" and model["creationTime"].endswith("Z") and model["userId"] > 0
    r = client.post(MODELS, headers=world["bob"], json={"name": "MNIST CNN"})
    assert r.status_code == 409 and r.json()["code"] == "already_exists"  # unique regardless of case
    other = new_model(client, world["bob"], "resnet")

    listed = client.get(MODELS, headers=world["bob"]).json()
    assert [m["name"] for m in listed["models"]] == ["mnist cnn", "resnet"]
    assert listed["pagination"]["total"] == 2
    by_name = client.get(MODELS, params={"sortBy": "SORT_BY_NAME", "orderBy": "ORDER_BY_DESC"}, headers=alice)
    assert [m["name"] for m in by_name.json()["models"]] == ["resnet", "mnist cnn"]
    assert [m["id"] for m in client.get(MODELS, params={"users": "bob"}, headers=alice).json()["models"]] == [
        other["id"]
    ]
    assert (
        client.get(MODELS, params={"labels": ["cnn"], "name": "CNN"}, headers=alice).json()["models"][0]["id"]
        == model["id"]
    )
    page = client.get(MODELS, params={"limit": 1, "offset": 1}, headers=alice).json()
    assert [m["name"] for m in page["models"]] == ["resnet"] and page["pagination"]["total"] == 2
    assert client.get(MODELS, params={"workspaceNames": "other"}, headers=alice).json()["models"] == []

    for ident in ("mnist cnn", "MNIST CNN", str(model["id"])):  # a name regardless of case, or the id
        got = client.get(f"{MODELS}/{ident}", headers=world["bob"])
        assert got.status_code == 200 and got.json()["model"]["id"] == model["id"], ident

    r = register(client, alice, "mnist cnn", ten, name="best", comment="val 0.2", labels=["a"])
    assert r.status_code == 200, r.text
    version = r.json()["modelVersion"]
    assert (version["version"], version["name"], version["comment"], version["username"]) == (1, "best",
                                                                                               "val 0.2", "alice")  # fmt: skip
    assert version["model"]["id"] == model["id"] and version["model"]["numVersions"] == 1
    checkpoint = version["checkpoint"]  # as GET /api/v1/checkpoints/{uuid} gives it, with its validation
    assert checkpoint["uuid"] == ten and checkpoint["state"] == "STATE_COMPLETED"
    assert checkpoint["training"]["experimentId"] == world["exp"]
    assert checkpoint["training"]["validationMetrics"] == {"avgMetrics": {"validation_loss": 0.2}}
    assert checkpoint["training"]["searcherMetric"] == 0.2
    assert checkpoint["training"]["experimentConfig"]["searcher"]["metric"] == "validation_loss"
    assert register(client, alice, str(model["id"]), fifteen).json()["modelVersion"]["version"] == 2

    versions = client.get(f"{MODELS}/mnist cnn/versions", headers=world["bob"]).json()
    assert [v["version"] for v in versions["modelVersions"]] == [1, 2]
    assert versions["model"]["numVersions"] == 2 and versions["pagination"]["total"] == 2
    desc = client.get(f"{MODELS}/mnist cnn/versions", params={"orderBy": "ORDER_BY_DESC", "limit": 1},
                      headers=alice).json()  # fmt: skip
    assert [v["checkpoint"]["uuid"] for v in desc["modelVersions"]] == [fifteen]
    one = client.get(f"{MODELS}/mnist cnn/versions/1", headers=world["bob"]).json()["modelVersion"]
    assert one["checkpoint"]["uuid"] == ten

    r = client.patch(f"{MODELS}/mnist cnn", headers=alice, json={"description": "new", "labels": ["x"]})
    assert r.json()["model"]["description"] == "new" and r.json()["model"]["labels"] == ["x"]
    r = client.patch(f"{MODELS}/mnist cnn/versions/2", headers=alice, json={"notes": "hi"})
    assert r.json()["modelVersion"]["notes"] == "hi"
    assert client.get("/api/v1/model/labels", headers=alice).json()["labels"] == ["x"]

    assert client.delete(f"{MODELS}/mnist cnn/versions/2", headers=alice).json() == {}
    assert client.get(f"{MODELS}/mnist cnn/versions/2", headers=alice).status_code == 404
    again = register(client, alice, "mnist cnn", five).json()["modelVersion"]
    assert again["version"] == 3  # numbers are never reused
    assert client.delete(f"{MODELS}/mnist cnn", headers=alice).json() == {}
    assert client.get(f"{MODELS}/mnist cnn", headers=alice).status_code == 404
    assert [m["name"] for m in client.get(MODELS, headers=alice).json()["models"]] == ["resnet"]


def test_archived_models_refuse_changes_and_new_versions(client: TestClient, world: dict[str, Any]) -> None:
    alice = world["alice"]
    new_model(client, alice, "frozen")
    assert client.post(f"{MODELS}/frozen/archive", headers=alice).json() == {}
    assert client.get(MODELS, params={"archived": "false"}, headers=alice).json()["models"] == []
    r = register(client, alice, "frozen", world["ckpts"][0])
    assert r.status_code == 409 and r.json()["code"] == "archived"
    assert client.patch(f"{MODELS}/frozen", headers=alice, json={"notes": "n"}).status_code == 409
    assert client.post(f"{MODELS}/frozen/unarchive", headers=alice).json() == {}
    assert register(client, alice, "frozen", world["ckpts"][0]).status_code == 200


# ---------------------------------------------------------------- who may do what


def test_auth_matrix(client: TestClient, world: dict[str, Any]) -> None:
    alice, bob, admin, token = world["alice"], world["bob"], world["admin"], world["token"]
    ten = world["ckpts"][1]
    new_model(client, alice, "m")
    assert register(client, alice, "m", ten).status_code == 200

    # No token: 401 everywhere.
    assert client.get(MODELS).status_code == 401
    assert client.post(MODELS, json={"name": "x"}).status_code == 401
    assert client.get(f"{MODELS}/m/versions").status_code == 401
    assert client.delete(f"{MODELS}/m").status_code == 401
    # A trial's token: refused (403), even for reading.
    assert client.get(MODELS, headers=token).status_code == 403
    assert client.post(MODELS, headers=token, json={"name": "x"}).status_code == 403
    assert register(client, token, "m", ten).status_code == 403
    assert client.delete(f"{MODELS}/m/versions/1", headers=token).status_code == 403
    # Another user reads, and changes nothing.
    assert client.get(f"{MODELS}/m", headers=bob).status_code == 200
    assert client.get(f"{MODELS}/m/versions/1", headers=bob).status_code == 200
    for method, url, body in (
        ("PATCH", f"{MODELS}/m", {"description": "mine"}),
        ("POST", f"{MODELS}/m/archive", None),
        ("POST", f"{MODELS}/m/versions", {"checkpointUuid": world["bob_ckpt"]}),
        ("PATCH", f"{MODELS}/m/versions/1", {"comment": "mine"}),
        ("DELETE", f"{MODELS}/m/versions/1", None),
        ("DELETE", f"{MODELS}/m", None),
    ):
        r = client.request(method, url, headers=bob, json=body)
        assert r.status_code == 403 and r.json()["code"] == "permission_denied", (method, url, r.text)
    # An admin may.
    assert client.patch(f"{MODELS}/m", headers=admin, json={"description": "admin's"}).status_code == 200
    assert register(client, admin, "m", world["bob_ckpt"]).json()["modelVersion"]["version"] == 2
    assert client.delete(f"{MODELS}/m/versions/2", headers=admin).json() == {}
    assert client.delete(f"{MODELS}/m", headers=admin).json() == {}


def test_a_user_cannot_register_another_users_checkpoint(client: TestClient, world: dict[str, Any]) -> None:
    new_model(client, world["bob"], "bobs")
    r = register(client, world["bob"], "bobs", world["ckpts"][1])  # alice's checkpoint, bob's own model
    assert r.status_code == 403 and "another user's experiment" in r.json()["message"]
    assert client.get(f"{MODELS}/bobs", headers=world["bob"]).json()["model"]["numVersions"] == 0
    assert register(client, world["bob"], "bobs", world["bob_ckpt"]).status_code == 200  # his own
    new_model(client, world["admin"], "admins")
    assert register(client, world["admin"], "admins", world["ckpts"][1]).status_code == 200


# ---------------------------------------------------------------- bounds and errors


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x" * 257}, "name"),
        ({"name": ""}, "name"),
        ({"name": "   "}, "name"),
        ({"name": "12345"}, "name"),  # a number names a model by id
        ({"name": "a/b"}, "name"),
        ({"name": "a  b"}, "name"),
        ({"name": "tab\there"}, "name"),
        ({"name": "ok", "description": "d" * 10_001}, "description"),
        ({"name": "ok", "metadata": {"blob": "x" * 70_000}}, "metadata"),
        ({"name": "ok", "metadata": "not an object"}, "metadata"),
        ({"name": "ok", "labels": [str(i) for i in range(101)]}, "labels"),
        ({"name": "ok", "labels": ["x" * 257]}, "labels.0"),
        ({"name": "ok", "notes": "nul\x00"}, "notes"),
        ({"name": "ok", "metadata": {"k": "\ud800"}}, "metadata"),  # stored, it could never be answered
    ],
)
def test_model_bodies_are_bounded(client: TestClient, world: dict[str, Any], body: Any, field: str) -> None:
    headers = {**world["alice"], "Content-Type": "application/json"}
    r = client.post(MODELS, headers=headers, content=json.dumps(body).encode())  # (a lone surrogate escaped)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "invalid_argument" and r.json()["field"] == field and r.json()["message"]


def test_deeply_nested_metadata_is_refused(client: TestClient, world: dict[str, Any]) -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(40):
        node["a"] = {}
        node = node["a"]
    r = client.post(MODELS, headers=world["alice"], json={"name": "deep", "metadata": deep})
    assert r.status_code == 400 and "nests" in r.json()["message"]


def test_clear_errors_for_unknown_things_and_bad_queries(client: TestClient, world: dict[str, Any]) -> None:
    alice = world["alice"]
    new_model(client, alice, "m")
    cases = [
        ("GET", f"{MODELS}/nope", None, 404, "not_found"),
        ("GET", f"{MODELS}/424242", None, 404, "not_found"),
        ("GET", f"{MODELS}/99999999999999999999", None, 404, "not_found"),
        ("GET", f"{MODELS}/{'x' * 300}", None, 400, "invalid_argument"),
        ("GET", f"{MODELS}/a%00b", None, 404, "not_found"),
        ("GET", f"{MODELS}?users=a%00b", None, 200, None),
        ("GET", f"{MODELS}/m/versions/7", None, 404, "not_found"),
        ("GET", f"{MODELS}/m/versions/0", None, 400, "invalid_argument"),
        ("GET", f"{MODELS}/m/versions/{2**31}", None, 400, "invalid_argument"),
        ("GET", f"{MODELS}?sortBy=SORT_BY_COLOUR", None, 400, "invalid_argument"),
        ("GET", f"{MODELS}/m/versions?orderBy=sideways", None, 400, "invalid_argument"),
        ("POST", f"{MODELS}/m/versions", {"checkpointUuid": "../../etc"}, 400, "invalid_argument"),
        ("POST", f"{MODELS}/m/versions", {"checkpointUuid": str(uuid.uuid4())}, 404, "not_found"),
        ("POST", f"{MODELS}/nope/versions", {"checkpointUuid": world["ckpts"][0]}, 404, "not_found"),
        ("POST", f"{MODELS}", {"name": "w", "workspaceName": "elsewhere"}, 404, "not_found"),
        ("PATCH", f"{MODELS}/m", {"name": "9"}, 400, "invalid_argument"),
    ]
    for method, url, body, status, code in cases:
        r = client.request(method, url, headers=alice, json=body)
        assert (r.status_code, r.json().get("code")) == (status, code), (method, url, r.text)
        assert status == 200 or r.json()["message"]
    assert client.get(MODELS, params={"sortBy": "name", "orderBy": "desc"}, headers=alice).status_code == 200
    assert client.get(MODELS, params={"sortBy": "1", "orderBy": "2"}, headers=alice).status_code == 200


def test_only_completed_checkpoints_not_being_deleted_are_registered(
    client: TestClient, sessions: sessionmaker[Session], world: dict[str, Any]
) -> None:
    new_model(client, world["alice"], "m")
    five, ten, _ = world["ckpts"]
    with transaction(sessions) as s:
        s.get(CheckpointModel, five).state = "DELETED"  # type: ignore[union-attr]
        s.get(CheckpointModel, ten).gc_retry_at = dt.datetime.now(dt.UTC)  # type: ignore[union-attr]
    r = register(client, world["alice"], "m", five)
    assert r.status_code == 409 and "DELETED" in r.json()["message"]
    r = register(client, world["alice"], "m", ten)
    assert r.status_code == 409 and "being deleted" in r.json()["message"]


# ---------------------------------------------------------------- registered checkpoints and GC


def test_a_registered_checkpoint_survives_a_stricter_policy_and_goes_once_unregistered(
    client: TestClient, sessions: sessionmaker[Session], world: dict[str, Any]
) -> None:
    alice, root, exp = world["alice"], world["root"], world["exp"]
    five, ten, fifteen = world["ckpts"]
    new_model(client, alice, "keeper")
    assert register(client, alice, "keeper", five).status_code == 200  # neither best nor latest
    collect(sessions, root)  # the default policy (best and latest): 10 and 15 kept, and 5, registered
    assert all((root / u / "model.pt").is_file() for u in (five, ten, fifteen))

    preview = client.get(f"/api/v1/experiments/{exp}/preview_gc", headers=alice,
                         params={"save_experiment_best": 0, "save_trial_best": 0, "save_trial_latest": 0})  # fmt: skip
    assert sorted(c["UUID"] for c in preview.json()["checkpoints"]) == sorted([ten, fifteen])
    assert client.patch(f"/api/v1/experiments/{exp}", headers=alice, json=KEEP_NOTHING).status_code == 200
    outcome = collect(sessions, root)
    assert sorted(outcome.deleted) == sorted([ten, fifteen])
    assert (
        (root / five / "model.pt").is_file() and not (root / ten).exists() and not (root / fifteen).exists()
    )
    got = client.get(f"/api/v1/checkpoints/{five}", headers=alice).json()["checkpoint"]
    assert got["state"] == "STATE_COMPLETED" and "deletion" not in got
    version = client.get(f"{MODELS}/keeper/versions/1", headers=alice).json()["modelVersion"]
    assert version["checkpoint"]["state"] == "STATE_COMPLETED"

    # Deleting by hand is refused, naming the model and version; so is deleting its experiment.
    r = client.request("DELETE", "/api/v1/checkpoints", headers=alice, json={"checkpointUuids": [five]})
    assert r.status_code == 409 and r.json()["code"] == "registered"
    assert "version 1 of model 'keeper'" in r.json()["message"]
    r = client.request(
        "DELETE", "/api/v1/checkpoints", headers=world["admin"], json={"checkpointUuids": [five]}
    )
    assert r.status_code == 409
    with transaction(sessions) as s:  # a finished experiment (deleting an active one is refused anyway)
        lifecycle.set_experiment_state(s, s.get(ExperimentModel, exp), ExperimentState.COMPLETED, "done")  # type: ignore[arg-type]
    r = client.delete(f"/api/v1/experiments/{exp}", headers=alice)
    assert r.status_code == 409 and "version 1 of model 'keeper'" in r.json()["message"]
    got_exp = client.get(f"/api/v1/experiments/{exp}", headers=alice).json()["experiment"]
    assert got_exp["state"] == "STATE_COMPLETED"  # nothing happened
    assert (root / five / "model.pt").is_file()

    # Its version deleted: a GC of the experiment is requested, and it goes.
    before = gc_requests(sessions, exp)
    assert client.delete(f"{MODELS}/keeper/versions/1", headers=alice).json() == {}
    assert gc_requests(sessions, exp) == before + 1
    assert collect(sessions, root).deleted == [five]
    assert not (root / five).exists()
    got = client.get(f"/api/v1/checkpoints/{five}", headers=alice).json()["checkpoint"]
    assert got["state"] == "STATE_DELETED"


def test_deleting_a_model_makes_its_checkpoints_collectible(
    client: TestClient, sessions: sessionmaker[Session], world: dict[str, Any]
) -> None:
    alice, root, exp = world["alice"], world["root"], world["exp"]
    five = world["ckpts"][0]
    new_model(client, alice, "a")
    new_model(client, alice, "b")
    register(client, alice, "a", five)
    register(client, alice, "b", five)  # one checkpoint in two models
    client.patch(f"/api/v1/experiments/{exp}", headers=alice, json=KEEP_NOTHING)
    collect(sessions, root)
    assert (root / five).is_dir()
    assert client.delete(f"{MODELS}/a", headers=alice).json() == {}
    collect(sessions, root)
    assert (root / five).is_dir()  # still version 1 of b
    assert client.delete(f"{MODELS}/b", headers=alice).json() == {}
    assert gc_requests(sessions, exp) >= 1
    assert collect(sessions, root).deleted == [five] and not (root / five).exists()
    with transaction(sessions) as s:
        assert s.scalar(select(func.count()).select_from(ModelVersionModel)) == 0


@pytest.mark.storage  # claims and registrations under concurrency, listing queries
def test_a_claim_never_takes_a_registered_checkpoint(
    client: TestClient, sessions: sessionmaker[Session], world: dict[str, Any]
) -> None:
    """Every deletion goes through ``claim``: even a caller that picked a registered checkpoint (a GC that
    chose it just before the registration committed) gets nothing, and the checkpoint is left untouched."""
    new_model(client, world["alice"], "m")
    five, ten, _ = world["ckpts"]
    register(client, world["alice"], "m", five)
    root = world["root"]
    with transaction(sessions) as s:
        targets = gc.claim(s, [five, ten], dt.datetime.now(dt.UTC), root)
        assert [t.uuid for t in targets] == [ten]
        assert s.get(CheckpointModel, five).gc_retry_at is None  # type: ignore[union-attr]
    assert os.path.isdir(root / five)


@pytest.mark.storage  # claims and registrations under concurrency, listing queries
def test_a_registration_racing_a_claim_keeps_its_checkpoint(
    client: TestClient, sessions: sessionmaker[Session], world: dict[str, Any]
) -> None:
    """The registration holds the checkpoint's row; a claim that started before it committed waits on that
    row, then sees the version (PostgreSQL: the look after the update; SQLite: one writer at a time)."""
    new_model(client, world["admin"], "raced")
    five = world["ckpts"][0]
    with transaction(sessions) as s:
        admin_id = s.scalar(select(UserModel.id).where(UserModel.username == "admin"))
    admin = Principal(user_id=int(admin_id or 0), username="admin", admin=True)
    claimed: list[list[str]] = []

    def claim() -> None:
        with transaction(sessions) as s:
            claimed.append([t.uuid for t in gc.claim(s, [five], dt.datetime.now(dt.UTC), world["root"])])

    with transaction(sessions) as s:
        models_registry.register_version(s, admin, "raced", five)
        thread = threading.Thread(target=claim)
        thread.start()
        time.sleep(0.5)  # the claim waits for the registration's row (or connection) meanwhile
        assert not claimed
    thread.join(30)
    assert claimed == [[]]
    with transaction(sessions) as s:
        assert s.get(CheckpointModel, five).gc_retry_at is None  # type: ignore[union-attr]
