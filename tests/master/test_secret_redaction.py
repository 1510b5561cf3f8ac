"""Secrets in an experiment's config and its trials' hyperparameters, read by another user through every route
that answers them (ours, Determined's, the web UI's data routes): masked for that user, shown to the owner and
admins, and ``max_tokens``-like names left alone (issue 32 item 11; ``services.redact.shown``).

``READS`` lists each GET route that answers a config or hyperparameters; ``CARRY_NEITHER`` every other one.
A new GET route fails ``test_every_get_route_is_listed`` until it is added to one of them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import MetricModel
from hpc_master.services import lifecycle, redact
from hpc_master.services.checkpoints.records import CheckpointReport, report_checkpoint

from .helpers import create_experiment, login, make_user

SECRET_CONFIG = """\
name: mnist
entrypoint: python3 train.py
searcher:
  name: single
  metric: validation_loss
  smaller_is_better: true
  max_length:
    batches: 100
environment:
  environment_variables: ["WANDB_API_KEY=env-secret-1", "OMP_NUM_THREADS=4"]
data:
  hf_token: data-secret-2
hyperparameters:
  lr: 0.1
  max_tokens: 512
  api_key: {type: const, val: hp-secret-3}
  model:
    name: gpt
    auth_token: hp-secret-4
"""
HPARAMS = {
    "lr": 0.1,
    "max_tokens": 512,
    "api_key": "hp-secret-3",
    "model": {"name": "gpt", "auth_token": "hp-secret-4"},
}
CONFIG_SECRETS = ("env-secret-1", "data-secret-2", "hp-secret-3", "hp-secret-4")
HPARAM_SECRETS = ("hp-secret-3", "hp-secret-4")


@dataclass(frozen=True)
class Read:
    """One GET route: its path as the OpenAPI document names it, the query it is read with, and whether its
    answer holds the experiment's config (``config``) and the trial's hyperparameters (``hparams``)."""

    path: str
    query: str = ""
    config: bool = False
    hparams: bool = False


READS = [
    Read("/api/v1/experiments", config=True),
    Read("/api/v1/experiments/{experiment_id}", config=True),
    Read("/api/v1/experiments/{experiment_id}/trials", hparams=True),
    Read("/api/v1/trials/{trial_id}", hparams=True),
    Read("/api/v1/trials/time-series", "trialIds={trial_id}", hparams=True),
    Read("/api/v1/checkpoints/{uuid}", config=True, hparams=True),
    Read("/api/v1/experiments/{experiment_id}/checkpoints", config=True, hparams=True),
    Read("/api/v1/trials/{trial_id}/checkpoints", config=True, hparams=True),
    Read("/api/v1/models/{model_name}/versions", config=True, hparams=True),
    Read("/api/v1/models/{model_name}/versions/{model_version_num}", config=True, hparams=True),
    # The web UI's data routes (and Determined's metrics streams, which its WebUI reads).
    Read(
        "/api/v1/experiments/{experiment_id}/metrics-stream/trials-sample",
        "metricName=validation_loss",
        hparams=True,
    ),
    Read(
        "/api/v1/experiments/{experiment_id}/metrics-stream/trials-snapshot",
        "metricName=validation_loss&batchesProcessed=10",
        hparams=True,
    ),
    Read("/api/v1/webui/experiments/{experiment_id}/trials", hparams=True),
    Read("/api/v1/webui/experiments"),
    Read("/api/v1/webui/experiments/{experiment_id}/rungs"),
    Read("/api/v1/experiments/{experiment_id}/metrics-stream/metric-names"),
]

CARRY_NEITHER = {
    # Neither a config nor hyperparameters in the answer.
    "/info", "/api/v1/master", "/api/v1/master/config", "/api/v1/master/logs", "/api/v1/me",
    "/api/v1/users", "/api/v1/users/{user_id}", "/api/v1/users/{username}/by-username",
    "/api/v1/workspaces", "/api/v1/workspaces/{workspace_id}", "/api/v1/workspaces/{workspace_id}/projects",
    "/api/v1/projects/{project_id}", "/api/v1/models", "/api/v1/models/{model_name}", "/api/v1/model/labels",
    "/api/v1/trials/{trial_id}/metrics", "/api/v1/trials/{trial_id}/metrics/training_metrics",
    "/api/v1/trials/{trial_id}/metrics/validation_metrics", "/api/v1/trials/{trial_id}/workloads",
    "/api/v1/trials/metrics/trial_metrics", "/api/v1/trials/metrics/training_metrics",
    "/api/v1/trials/metrics/validation_metrics", "/api/v1/experiments/{experiment_id}/preview_gc",
    "/api/v1/experiments/{experiment_id}/searcher/best_searcher_validation_metric",
    "/api/v1/webui/cluster", "/api/v1/webui/session", "/api/v1/webui/vocabulary",
    # Monitoring: counts and ages only; the audit log (admins only): who acted on what, no configs.
    "/health", "/api/v1/audit",
    # Usage: seconds and slots per run (labels are no secrets); each user's own, an admin's everyone's.
    "/api/v1/resources/allocation/raw", "/api/v1/resources/allocation/aggregated",
    # The web UI's change streams: digests only.
    "/api/v1/webui/changes", "/api/v1/webui/experiments/{experiment_id}/changes",
    "/api/v1/webui/trials/{trial_id}/changes",
    # The owner's and admins' only (another user gets 403 or 404): logs, the code, tasks (whose config is theirs).
    "/api/v1/trials/{trial_id}/logs", "/api/v1/experiments/{experiment_id}/model_def",
    "/api/v1/experiments/{experiment_id}/file_tree", "/api/v1/tasks", "/api/v1/tasks/{task_id}",
    "/api/v1/tasks/{task_id}/logs", "/api/v1/commands", "/api/v1/commands/{task_id}", "/api/v1/notebooks",
    "/api/v1/notebooks/{task_id}", "/api/v1/shells", "/api/v1/shells/{task_id}", "/api/v1/tensorboards",
    "/api/v1/tensorboards/{task_id}",
    # The harness's (its trial's token).
    "/api/v1/trials/{trial_id}/searcher/operation", "/api/v1/allocations/{allocation_id}/signals/preemption",
}  # fmt: skip


@pytest.fixture
def world(client: TestClient, sessions: sessionmaker[Session]) -> dict[str, Any]:
    """alice's experiment with secrets in its config, one trial with secrets in its hparams, a validation, a
    checkpoint registered as version 1 of alice's model ``m``; the admin, alice and bob."""
    admin = login(client)
    alice, bob = make_user(client, admin, "alice"), make_user(client, admin, "bob")
    exp_id = create_experiment(client, alice, SECRET_CONFIG)
    ckpt = str(uuid.uuid4())
    with transaction(sessions) as s:
        trial = lifecycle.create_trial(s, exp_id, "r1", HPARAMS)
        lifecycle.allocate_trial_run(s, trial.id)
        s.add(MetricModel(trial_id=trial.id, trial_run_id=1, group="validation", steps_completed=10,
                          metrics={"avgMetrics": {"validation_loss": 0.5}}))  # fmt: skip
        report = CheckpointReport(
            uuid=ckpt, trial_id=trial.id, trial_run_id=1, steps_completed=10, resources={"model.pt": 100},
            metadata={"steps_completed": 10},
        )  # fmt: skip
        report_checkpoint(s, report)
        trial_id = trial.id
    assert client.post("/api/v1/models", headers=alice, json={"name": "m"}).status_code == 200
    r = client.post("/api/v1/models/m/versions", headers=alice, json={"checkpointUuid": ckpt})
    assert r.status_code == 200, r.text
    ids = {"experiment_id": exp_id, "trial_id": trial_id, "uuid": ckpt, "model_name": "m",
           "model_version_num": 1}  # fmt: skip
    return {"admin": admin, "alice": alice, "bob": bob, "ids": ids}


def read(client: TestClient, route: Read, ids: dict[str, Any], headers: dict[str, str]) -> str:
    """The answer's text, with each ``originalConfig`` (YAML inside the JSON) also as its JSON."""
    url = route.path.format(**ids) + ("?" + route.query.format(**ids) if route.query else "")
    r = client.get(url, headers=headers)
    assert r.status_code == 200, (url, r.text)
    documents = [json.loads(line) for line in r.text.splitlines() if line.strip()]
    texts = [r.text]
    for document in documents:
        texts += [json.dumps(yaml.safe_load(t)) for t in values_of(document, "originalConfig")]
    return "\n".join(texts)


def values_of(document: Any, key: str) -> list[Any]:
    """Every value under `key`, at any depth."""
    if isinstance(document, dict):
        return [v for k, v in document.items() if k == key] + [
            x for v in document.values() for x in values_of(v, key)
        ]
    if isinstance(document, list):
        return [x for v in document for x in values_of(v, key)]
    return []


@pytest.mark.parametrize("route", READS, ids=lambda r: r.path + (f"?{r.query}" if r.query else ""))
def test_another_user_sees_no_secret_the_owner_and_admins_see_them(
    client: TestClient, world: dict[str, Any], route: Read
) -> None:
    secrets = set(CONFIG_SECRETS if route.config else ()) | set(HPARAM_SECRETS if route.hparams else ())
    for viewer in ("alice", "admin"):
        text = read(client, route, world["ids"], world[viewer])
        assert all(s in text for s in secrets), (viewer, text)
    text = read(client, route, world["ids"], world["bob"])
    assert not any(s in text for s in CONFIG_SECRETS), text
    if route.config or route.hparams:
        assert redact.MASK in text
        answer = [json.loads(line) for line in text.splitlines() if line.strip()]
        # max_tokens is no secret: its value (a trial's 512, or the config's {type: const, val: 512}) is shown.
        shown = values_of(answer, "max_tokens")
        assert shown and all(v == 512 or v == {"type": "const", "val": 512} for v in shown), shown
        assert "OMP_NUM_THREADS=4" not in text  # every environment variable's value is masked for others
    if route.config:
        # A secret hyperparameter's definition keeps its shape, its value masked.
        assert {"type": "const", "val": redact.MASK} in values_of(json.loads(text.splitlines()[0]), "api_key")


def test_every_get_route_is_listed(client: TestClient) -> None:
    paths = {p for p, ops in client.app.openapi()["paths"].items() if "get" in ops}  # type: ignore[attr-defined]
    listed = {r.path for r in READS} | CARRY_NEITHER
    assert paths - listed == set(), "a new GET route: add it to READS or CARRY_NEITHER"
    assert listed - paths == set()


def test_masking_keeps_the_shape_and_the_names_that_are_no_secrets() -> None:
    config = {
        "hyperparameters": {
            "api_key": {"type": "categorical", "vals": ["k1", "k2"]},
            "max_tokens": {"type": "int", "minval": 1, "maxval": 8},
            "key_dim": 64,
            "nested": {"secretAccessKey": "s3", "hf_token": ["t1", {"x": "t2"}], "empty_token": ""},
        },
        "password": {"type": "hunter2"},  # not a hyperparameter kind: masked too
    }
    assert redact.masked(config) == {
        "hyperparameters": {
            "api_key": {"type": "categorical", "vals": [redact.MASK, redact.MASK]},
            "max_tokens": {"type": "int", "minval": 1, "maxval": 8},
            "key_dim": 64,
            "nested": {"secretAccessKey": redact.MASK, "hf_token": [redact.MASK, {"x": redact.MASK}],
                       "empty_token": ""},
        },
        "password": {"type": redact.MASK},
    }  # fmt: skip
    assert config["password"] == {"type": "hunter2"}  # the stored value is not changed
