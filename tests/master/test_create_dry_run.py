"""Create refuses what every submission would refuse, and applies Determined's eventually-required fields
(issue: items 3 and 4), on SQLite and PostgreSQL.

A refused config answers 400 ``invalid_config`` with the field's YAML path, and nothing is stored. The master
here has a GPU pool of 2 slots per node with a 2-hour maximum, and a CPU-only pool with 4G per node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import ExperimentModel, UserModel
from hpc_master.errors import ConfigError
from hpc_master.masterconf import MasterConfig, parse_master_config
from hpc_master.services import experiments as exps
from hpc_master.services.access import Principal
from tests.master.helpers import context_file, count, login

BASE: dict[str, Any] = {
    "entrypoint": "python3 train.py",
    "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 100}},
    "hyperparameters": {"lr": 0.1},
}
POOLS = {
    "default": {"partition": "batch", "slots_per_node": 2, "max_time_limit": "2:00:00"},
    "cpu": {"slots_per_node": 0, "gpu_request_style": "none", "mem_per_node": "4G"},
}


@pytest.fixture
def config(engine: Engine, tmp_path: Path) -> MasterConfig:
    """The `client` fixture's master config (overrides tests/master/conftest.py's)."""
    return parse_master_config(
        {
            "db": {"url": engine.url.render_as_string(hide_password=False)},
            "checkpoint_storage": {"host_path": str(tmp_path / "ck"), "save_trial_best": 2},
            "resource_pools": POOLS,
        },
        env={},
    )


def post(client: TestClient, headers: dict[str, str], validate_only: bool = False, **overrides: Any) -> Any:
    body = {
        "config": yaml.safe_dump({**BASE, **overrides}),
        "modelDefinition": [context_file("train.py")],
        "activate": True,
        "validateOnly": validate_only,
    }
    return client.post("/api/v1/experiments", headers=headers, json=body)


def assert_refused(r: Any, field: str, message: str) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == "invalid_config", body
    assert body["field"] == field, body
    assert message in body["message"], body


# ---- item 3 ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"resources": {"resource_pool": "a100"}}, "resources.resource_pool", "unknown resource pool 'a100'"),
        (
            {"resources": {"slots_per_trial": 3}},
            "resources.slots_per_trial",
            "not a multiple of the pool's 2",
        ),
        (
            {"resources": {"slots_per_trial": 4, "is_single_node": True}},
            "resources.slots_per_trial",
            "does not fit on one node",
        ),
        ({"resources": {"resource_pool": "cpu"}}, "resources.slots_per_trial", "CPU-only"),
        (
            {"resources": {"slots_per_trial": 3}, "slurm": {"slots_per_node": 2}},
            "resources.slots_per_trial",
            "not a multiple of 2 slots per node (slurm.slots_per_node)",
        ),
        ({"slurm": {"time_limit": "4:00:00"}}, "slurm.time_limit", "over the 'default' pool's limit of 120"),
        (
            {
                "resources": {"resource_pool": "cpu", "slots_per_trial": 0},
                "slurm": {"sbatch_args": ["--mem=8G"]},
            },
            "slurm.sbatch_args",
            "--mem is already set by hpc-det",
        ),
        ({"slurm": {"sbatch_args": ["--gres=gpu:8"]}}, "slurm.sbatch_args[0]", "--gres is set by hpc-det"),
        ({"slurm": {"sbatch_args": ["--nodes=4"]}}, "slurm.sbatch_args[0]", "--nodes is set by hpc-det"),
        ({"slurm": {"sbatch_args": ["-p", "x"]}}, "slurm.sbatch_args[0]", "use slurm.partition instead"),
        (
            {"slurm": {"sbatch_args": ["--uid=0"]}},
            "slurm.sbatch_args[0]",
            "jobs run as the user's own account",
        ),
    ],
)
def test_create_refuses_what_submission_would(
    client: TestClient,
    sessions: sessionmaker[Session],
    overrides: dict[str, Any],
    field: str,
    message: str,
) -> None:
    headers = login(client)
    assert_refused(post(client, headers, **overrides), field, message)
    assert_refused(post(client, headers, validate_only=True, **overrides), field, message)
    assert count(sessions, ExperimentModel) == 0


def test_what_the_pools_can_run_is_created(client: TestClient, sessions: sessionmaker[Session]) -> None:
    headers = login(client)
    r = post(client, headers, resources={"slots_per_trial": 4}, slurm={"sbatch_args": ["--constraint=ib"]})
    assert r.status_code == 200, r.text  # two nodes of two GPUs
    r = post(client, headers, resources={"resource_pool": "cpu", "slots_per_trial": 0})
    assert r.status_code == 200, r.text
    assert r.json()["config"]["resources"]["resource_pool"] == "cpu"
    with transaction(sessions) as s:
        pools = sorted(e.resource_pool for e in s.query(ExperimentModel))
    assert pools == ["cpu", "default"]


# ---- item 4 ---------------------------------------------------------------------------------------------------


def test_searcher_metric_is_required_at_create(client: TestClient, sessions: sessionmaker[Session]) -> None:
    headers = login(client)
    searcher = {"name": "single", "max_length": {"batches": 100}}
    assert_refused(post(client, headers, searcher=searcher), "searcher.metric", "missing required field")
    assert count(sessions, ExperimentModel) == 0


def test_searcher_metric_is_required_by_the_service_too(sessions: sessionmaker[Session]) -> None:
    """Every caller of create goes through the one pipeline, even one that passes no master config."""
    with transaction(sessions) as s:
        user = UserModel(username="alice", password_hash="", admin=False)
        s.add(user)
        s.flush()
        owner = Principal(user_id=user.id, username="alice", admin=False)
        text = yaml.safe_dump({**BASE, "searcher": {"name": "single", "max_length": {"batches": 1}}})
        with pytest.raises(ConfigError) as info:
            exps.create_experiment(s, owner, config_text=text, model_definition=[], activate=True)
        assert info.value.field == "searcher.metric"
    assert count(sessions, ExperimentModel) == 0


def test_max_length_in_epochs_needs_records_per_epoch(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    headers = login(client)
    searcher = {"name": "single", "metric": "validation_loss", "max_length": {"epochs": 2}}
    assert_refused(
        post(client, headers, searcher=searcher), "records_per_epoch", "searcher.max_length is in epochs"
    )
    assert count(sessions, ExperimentModel) == 0
    r = post(client, headers, searcher=searcher, records_per_epoch=640)
    assert r.status_code == 200, r.text


def test_a_gc_only_checkpoint_storage_merges_with_the_masters(
    client: TestClient, sessions: sessionmaker[Session], config: MasterConfig
) -> None:
    headers = login(client)
    r = post(client, headers, checkpoint_storage={"save_trial_latest": 5})
    assert r.status_code == 200, r.text
    expected = {
        "type": "shared_fs",
        "host_path": str(config.checkpoint_storage.host_path),
        "save_experiment_best": 0,
        "save_trial_best": 2,  # the master's
        "save_trial_latest": 5,  # the experiment's
    }
    assert {k: r.json()["config"]["checkpoint_storage"][k] for k in expected} == expected
    with transaction(sessions) as s:
        (stored,) = s.query(ExperimentModel).all()
        assert {k: stored.config["checkpoint_storage"][k] for k in expected} == expected
