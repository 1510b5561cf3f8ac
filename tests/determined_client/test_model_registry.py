"""Determined 0.38.1's own ``det model`` and SDK model registry (``client.create_model``, ``get_model``,
``register_version``, ``get_version``, ``list_versions``, labels, metadata, archive, deletes), unmodified,
against our master."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from hpc_master.db.models import CheckpointModel
from tests.determined_client.conftest import DeterminedClient, OurApi

pytestmark = pytest.mark.determined_client

PASSWORD = "Secret123pw"


def a_checkpoint(our_api: OurApi, user: str) -> str:
    experiment_id = our_api.create_experiment(our_api.login(user, PASSWORD), "registry")
    (trial_id,) = our_api.seed_trials(experiment_id, [{"lr": 0.1}])
    with Session(create_engine(our_api.master.db_url)) as session:
        uuid = session.scalar(select(CheckpointModel.uuid).where(CheckpointModel.trial_id == trial_id))
    assert uuid is not None
    return str(uuid)


def test_det_model_commands(determined: DeterminedClient, our_api: OurApi) -> None:
    user = our_api.create_user("models", PASSWORD)
    env = {"DET_USER": user, "DET_PASS": PASSWORD}
    ckpt = a_checkpoint(our_api, user)
    name = f"cli-{user}"

    r = determined.det("model", "create", name, "--description", "digits", env=env)
    assert r.rc == 0 and name in r.out and "digits" in r.out, r.err
    r = determined.det("model", "register-version", name, ckpt, env=env)
    assert r.rc == 0 and ckpt in r.out and "validation_loss" in r.out, r.err
    for argv in (["list-versions", name], ["describe", name], ["describe", name, "--version", "1"]):
        r = determined.det("model", *argv, env=env)
        assert r.rc == 0 and ckpt in r.out, (argv, r.err)
    listed = json.loads(determined.det("model", "list", "--json", env=env).out)
    assert name in [m["name"] for m in listed]
    assert json.loads(determined.det("model", "describe", name, "--json", env=env).out)["name"] == name
    # A workspace this master does not have is an error that names it, not a move that did nothing.
    moved = determined.det("model", "move", name, "-w", "NOSUCH", env=env)
    assert moved.rc != 0 and "workspace NOSUCH not found" in moved.out + moved.err, (moved.out, moved.err)
    assert determined.det("model", "move", name, "-w", "Uncategorized", env=env).rc == 0  # the one there is
    assert determined.det("model", "delete", name, env=env).rc == 0
    assert name not in determined.det("model", "list", env=env).out


def test_sdk_model_registry(determined: DeterminedClient, our_api: OurApi) -> None:
    user = our_api.create_user("sdkmodels", PASSWORD)
    ckpt = a_checkpoint(our_api, user)
    code = f"""
import json
from determined.experimental import client
client.login(master={our_api.master.url!r}, user={user!r}, password={PASSWORD!r})
model = client.create_model("sdk-{user}", description="x", metadata={{"a": 1}})
version = model.register_version({ckpt!r})
model.set_labels(["l1"]); model.add_metadata({{"b": 2}}); model.set_description("new")
version.set_name("first")
got = client.get_model(str(model.model_id))
latest = got.get_version()
first = got.get_version(1)
count = len(got.list_versions())
got.archive(); got.unarchive()
first.delete()
print(json.dumps({{
    "version": version.model_version, "uuid": latest.checkpoint.uuid, "name": first.name, "count": count,
    "after": len(got.list_versions()), "labels": got.labels, "metadata": got.metadata,
    "description": got.description, "validation": latest.checkpoint.training.validation_metrics,
    "listed": [m.name for m in client.list_models()],
}}))
got.delete()
"""
    out = determined.sdk(code)
    assert isinstance(out, dict)
    assert out == {
        "version": 1, "uuid": ckpt, "name": "first", "count": 1, "after": 0, "labels": ["l1"],
        "metadata": {"a": 1, "b": 2}, "description": "new",
        "validation": {"avgMetrics": {"validation_loss": 0.25}, "batchMetrics": None},
        "listed": out["listed"],
    }  # fmt: skip
    assert f"sdk-{user}" in out["listed"]
