"""Every route that answers checkpoints gives the same Determined-shaped ``v1Checkpoint`` (``GET
/api/v1/checkpoints/{uuid}``, ``/experiments/{id}/checkpoints``, ``/trials/{id}/checkpoints``, the model
registry's versions), on SQLite and PostgreSQL: who may call the lists (no token, another user, a trial's
token), their bounds, Determined's sorts, and the ``training`` fields Determined's client requires
(``experimentConfig`` with the effective checkpoint storage, masked for others; ``validationMetrics`` as
``{"avgMetrics": ...}``)."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import ExperimentModel, MetricModel, TrialModel
from hpc_master.masterconf import MasterConfig
from hpc_master.services import lifecycle
from hpc_master.services.checkpoints.records import CheckpointReport, report_checkpoint
from hpc_master.services.checkpoints.remover import CheckpointRemover

from .helpers import create_experiment, login, make_user

SECRET_CONFIG = """\
name: listing
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
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def add_trial(
    sessions: sessionmaker[Session], exp_id: int, steps: dict[int, float | None], request_id: str, t0: int = 0
) -> tuple[int, str, list[str]]:
    """A trial with a checkpoint per step (reported at T0 + t0 + steps seconds) and, where the loss is not
    None, a validation (flat, as the harness reports it) at those steps: (trial id, its token, uuids)."""
    uuids = []
    with transaction(sessions) as s:
        trial = lifecycle.create_trial(s, exp_id, request_id, {"lr": 0.1})
        lifecycle.allocate_trial_run(s, trial.id)
        for step, loss in steps.items():
            if loss is not None:
                s.add(MetricModel(trial_id=trial.id, trial_run_id=1, group="validation", steps_completed=step,
                                  metrics={"validation_loss": loss, "accuracy": 1 - loss}))  # fmt: skip
            ckpt = str(uuid.uuid4())
            report_checkpoint(
                s,
                CheckpointReport(
                    uuid=ckpt, trial_id=trial.id, trial_run_id=1, steps_completed=step,
                    resources={"model.pt": step}, metadata={"steps_completed": step},
                    report_time=T0 + dt.timedelta(seconds=t0 + step),
                ),
            )  # fmt: skip
            uuids.append(ckpt)
        return trial.id, lifecycle.mint_trial_token(s, trial.id), uuids


@pytest.fixture
def world(client: TestClient, sessions: sessionmaker[Session]) -> dict[str, Any]:
    """alice's experiment (a secret in its config): trial 1 with checkpoints at 10 (loss 0.5), 20 (0.2) and
    30 (no validation); trial 2 at 10 (0.3) and 20 (0.4), reported later. bob, an admin, trial 1's token."""
    client.app.state.det.checkpoint_remover = CheckpointRemover(as_owner=False)  # type: ignore[attr-defined]
    admin = login(client)
    alice, bob = make_user(client, admin, "alice"), make_user(client, admin, "bob")
    exp_id = create_experiment(client, alice, SECRET_CONFIG)
    t1, token, (a10, a20, a30) = add_trial(sessions, exp_id, {10: 0.5, 20: 0.2, 30: None}, "r1")
    t2, _, (b10, b20) = add_trial(sessions, exp_id, {10: 0.3, 20: 0.4}, "r2", t0=100)
    return {
        "admin": admin, "alice": alice, "bob": bob, "exp": exp_id, "t1": t1, "t2": t2, "token": bearer(token),
        "a10": a10, "a20": a20, "a30": a30, "b10": b10, "b20": b20,
    }  # fmt: skip


def listed(client: TestClient, url: str, headers: dict[str, str], **params: Any) -> list[str]:
    r = client.get(url, headers=headers, params=params)
    assert r.status_code == 200, r.text
    return [c["uuid"] for c in r.json()["checkpoints"]]


def test_the_trial_route_who_may_call_it(client: TestClient, world: dict[str, Any]) -> None:
    url = f"/api/v1/trials/{world['t1']}/checkpoints"
    assert client.get(url).status_code == 401
    assert client.get(url, headers=bearer("not-a-token")).status_code == 401
    assert client.get(url, headers=world["token"]).status_code == 403  # a trial's token: users only
    for who in ("alice", "bob", "admin"):  # every user reads every experiment (Determined's team view)
        assert len(listed(client, url, world[who])) == 3
    assert client.get("/api/v1/trials/424242/checkpoints", headers=world["alice"]).status_code == 404
    exp_url = f"/api/v1/experiments/{world['exp']}/checkpoints"
    assert client.get(exp_url).status_code == 401
    assert client.get(exp_url, headers=world["token"]).status_code == 403


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("offset=-1", "offset"),
        (f"offset={2**31}", "offset"),
        (f"limit={2**31}", "limit"),
        ("sortByAttr=SORT_BY_SIZE", "sortByAttr"),
        (f"sortByAttr={'x' * 65}", "sortByAttr"),
        ("orderBy=SIDEWAYS", "orderBy"),
        ("states=STATE_BOGUS", "states"),
        ("&".join(["states=STATE_COMPLETED"] * 17), "states"),
        (f"sortByMetric={'m' * 257}", "sortByMetric"),
    ],
)
def test_bounds(client: TestClient, world: dict[str, Any], query: str, field: str) -> None:
    for url in (f"/api/v1/trials/{world['t1']}", f"/api/v1/experiments/{world['exp']}"):
        r = client.get(f"{url}/checkpoints?{query}", headers=world["alice"])
        assert r.status_code == 400, r.text
        assert r.json()["field"] == field, r.text
    assert client.get(f"/api/v1/trials/{2**31}/checkpoints", headers=world["alice"]).status_code == 400


@pytest.mark.storage  # listing queries
def test_determined_sorts_orders_states_and_pages(
    client: TestClient, sessions: sessionmaker[Session], world: dict[str, Any]
) -> None:
    w, h = world, world["alice"]
    exp = f"/api/v1/experiments/{w['exp']}/checkpoints"
    # No sort, or the searcher metric: best first (smaller is better), no validation last, in either order.
    best = [w["a20"], w["b10"], w["b20"], w["a10"], w["a30"]]
    assert listed(client, exp, h) == best
    assert listed(client, exp, h, sortByAttr="SORT_BY_SEARCHER_METRIC") == best
    assert listed(client, exp, h, sortByAttr="SORT_BY_SEARCHER_METRIC", orderBy="ORDER_BY_DESC") == [
        w["a10"], w["b20"], w["b10"], w["a20"], w["a30"],
    ]  # fmt: skip
    # Another metric: ascending unless asked otherwise (accuracy = 1 - loss).
    assert listed(client, exp, h, sortByMetric="accuracy")[:4] == [w["a10"], w["b20"], w["b10"], w["a20"]]
    assert listed(client, exp, h, sortByMetric="accuracy", orderBy="ORDER_BY_DESC")[0] == w["a20"]
    # Attributes: ascending unless ORDER_BY_DESC.
    by_time = [w["a10"], w["a20"], w["a30"], w["b10"], w["b20"]]
    assert listed(client, exp, h, sortByAttr="SORT_BY_END_TIME") == by_time
    assert listed(client, exp, h, sortByAttr="SORT_BY_END_TIME", orderBy="ORDER_BY_DESC") == by_time[::-1]
    assert listed(client, exp, h, sortByAttr="SORT_BY_BATCH_NUMBER", orderBy="ORDER_BY_DESC")[0] == w["a30"]
    assert listed(client, exp, h, sortByAttr="SORT_BY_TRIAL_ID", orderBy="DESC") == [
        w["b20"], w["b10"], w["a30"], w["a20"], w["a10"],
    ]  # fmt: skip
    assert listed(client, exp, h, sortByAttr="SORT_BY_UUID") == sorted(by_time)
    assert listed(client, exp, h, sortBy="SORT_BY_END_TIME") == by_time  # older clients' name

    delete = {"checkpointUuids": [w["a10"]]}
    with transaction(sessions) as s:  # a trial that ended: its latest checkpoint may go too
        s.execute(update(TrialModel).where(TrialModel.id == w["t1"]).values(state="COMPLETED"))
    assert client.request("DELETE", "/api/v1/checkpoints", headers=h, json=delete).json() == {}
    assert listed(client, exp, h, sortByAttr="SORT_BY_STATE", orderBy="ORDER_BY_DESC")[0] == w["a10"]
    assert w["a10"] not in listed(client, exp, h, states=["STATE_COMPLETED"])
    assert listed(client, exp, h, states=["STATE_DELETED", "STATE_ERROR"]) == [w["a10"]]

    r = client.get(exp, headers=h, params={"sortByAttr": "SORT_BY_END_TIME", "offset": 1, "limit": 2})
    page = r.json()
    assert [c["uuid"] for c in page["checkpoints"]] == by_time[1:3]
    assert page["pagination"] == {"offset": 1, "limit": 2, "startIndex": 1, "endIndex": 3, "total": 5}

    trial = f"/api/v1/trials/{w['t2']}/checkpoints"
    assert listed(client, trial, h) == [w["b10"], w["b20"]]
    assert listed(client, trial, h, sortByAttr="SORT_BY_BATCH_NUMBER", orderBy="ORDER_BY_DESC") == [
        w["b20"], w["b10"],
    ]  # fmt: skip
    assert listed(client, trial, h, limit=1) == [w["b10"]]


@pytest.mark.storage  # listing queries
def test_every_route_gives_the_same_determined_checkpoint(
    client: TestClient, config: MasterConfig, world: dict[str, Any]
) -> None:
    w = world
    one = client.get(f"/api/v1/checkpoints/{w['a20']}", headers=w["alice"]).json()["checkpoint"]
    training = one["training"]
    assert training["validationMetrics"] == {"avgMetrics": {"validation_loss": 0.2, "accuracy": 0.8}}
    assert training["searcherMetric"] == 0.2
    assert (training["experimentId"], training["trialId"], training["hparams"]) == (
        w["exp"],
        w["t1"],
        {"lr": 0.1},
    )
    assert "WANDB_API_KEY=abc123" in str(training["experimentConfig"]["environment"]["environment_variables"])
    storage = training["experimentConfig"]["checkpoint_storage"]
    assert (storage["type"], storage["host_path"]) == ("shared_fs", str(config.checkpoint_dir()))
    assert one["state"] == "STATE_COMPLETED" and one["metadata"] == {"steps_completed": 20}
    in_experiment = client.get(f"/api/v1/experiments/{w['exp']}/checkpoints", headers=w["alice"]).json()
    in_trial = client.get(f"/api/v1/trials/{w['t1']}/checkpoints", headers=w["alice"]).json()
    assert next(c for c in in_experiment["checkpoints"] if c["uuid"] == w["a20"]) == one
    assert next(c for c in in_trial["checkpoints"] if c["uuid"] == w["a20"]) == one
    no_validation = client.get(f"/api/v1/checkpoints/{w['a30']}", headers=w["alice"]).json()["checkpoint"]
    assert (no_validation["training"]["validationMetrics"], no_validation["training"]["searcherMetric"]) == (
        None,
        None,
    )

    r = client.post("/api/v1/models", headers=w["alice"], json={"name": "listing-model"})
    assert r.status_code == 200, r.text
    r = client.post(
        "/api/v1/models/listing-model/versions", headers=w["alice"], json={"checkpointUuid": w["a20"]}
    )
    assert r.status_code == 200, r.text
    assert r.json()["modelVersion"]["checkpoint"] == one

    # Another user sees the config masked, as GET /experiments/{id} shows it; the trial's own token reads its
    # checkpoint unmasked (its owner's).
    theirs = client.get(f"/api/v1/checkpoints/{w['a20']}", headers=w["bob"]).json()["checkpoint"]
    masked = client.get(f"/api/v1/experiments/{w['exp']}", headers=w["bob"]).json()["experiment"]["config"]
    assert theirs["training"]["experimentConfig"]["environment"] == masked["environment"]
    assert "WANDB_API_KEY=********" in str(masked["environment"]) and "abc123" not in str(masked)
    listed_by_bob = client.get(f"/api/v1/trials/{w['t1']}/checkpoints", headers=w["bob"]).json()[
        "checkpoints"
    ]
    assert all("abc123" not in str(c) for c in listed_by_bob)
    version = client.get("/api/v1/models/listing-model/versions/1", headers=w["bob"]).json()["modelVersion"]
    assert version["checkpoint"] == theirs
    own = client.get(f"/api/v1/checkpoints/{w['a20']}", headers=w["token"]).json()["checkpoint"]
    assert own == one


def test_the_effective_storage_when_the_config_names_none(
    client: TestClient, sessions: sessionmaker[Session], config: MasterConfig, world: dict[str, Any]
) -> None:
    """An experiment stored without ``checkpoint_storage`` (or with only GC fields): its jobs wrote under the
    master's root, which the answer names, so Determined's ``shared_fs`` download finds the files."""
    w = world
    with transaction(sessions) as s:
        experiment = s.get(ExperimentModel, w["exp"])
        assert experiment is not None
        stored = {k: v for k, v in experiment.config.items() if k != "checkpoint_storage"}
        s.execute(update(ExperimentModel).where(ExperimentModel.id == w["exp"]).values(config=stored))
    got = client.get(f"/api/v1/checkpoints/{w['a20']}", headers=w["alice"]).json()["checkpoint"]
    root = str(config.checkpoint_dir())
    assert got["training"]["experimentConfig"]["checkpoint_storage"] == {
        "type": "shared_fs",
        "host_path": root,
    }
    with transaction(sessions) as s:
        partial = {**stored, "checkpoint_storage": {"save_trial_best": 3}}
        s.execute(update(ExperimentModel).where(ExperimentModel.id == w["exp"]).values(config=partial))
    got = client.get(f"/api/v1/checkpoints/{w['a20']}", headers=w["alice"]).json()["checkpoint"]
    assert got["training"]["experimentConfig"]["checkpoint_storage"] == {
        "type": "shared_fs", "host_path": root, "save_trial_best": 3,
    }  # fmt: skip
    assert Path(root).is_absolute()
