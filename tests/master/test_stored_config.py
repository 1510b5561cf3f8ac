"""The one accessor of a stored config (``services.stored_config``, issue 42): typed, parsed once per content,
never stale after ``PATCH``, and an edit is checked by the model before it is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.models import CheckpointGCRequestModel, ExperimentModel, utcnow
from hpc_master.expconf import ExperimentConfig, ExperimentConfigError
from hpc_master.services import stored_config
from hpc_master.services.checkpoints.gc import plan_collection
from hpc_master.services.lifecycle import request_checkpoint_gc
from hpc_master.services.stored_config import StoredConfigError, edited_config, experiment_config
from tests.master.helpers import CONFIG, create_experiment, login, make_user


def _read(sessions: sessionmaker[Session], exp_id: int) -> ExperimentConfig:
    with sessions() as s:
        experiment = s.get(ExperimentModel, exp_id)
        assert experiment is not None
        return experiment_config(experiment)


def test_a_stored_config_is_parsed_once_and_read_again_after_patch(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    alice = make_user(client, login(client), "alice")
    exp_id = create_experiment(client, alice)
    first = _read(sessions, exp_id)
    assert first.max_restarts == 5 and first.resources.priority is None
    parses = stored_config.stats["parses"]
    again = _read(sessions, exp_id)  # a new session: a new row and a new dict, with the same content
    assert again is first and stored_config.stats["parses"] == parses

    r = client.patch(
        f"/api/v1/experiments/{exp_id}", json={"resources": {"priority": 7}, "labels": ["a"]}, headers=alice
    )
    assert r.status_code == 200, r.text
    patched = _read(sessions, exp_id)
    assert patched is not first and stored_config.stats["parses"] == parses + 1
    assert (patched.resources.priority, patched.labels) == (7, ["a"])
    got = client.get(f"/api/v1/experiments/{exp_id}", headers=alice).json()["experiment"]
    assert got["labels"] == ["a"]


def test_an_edit_the_model_refuses_is_not_written(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    alice = make_user(client, login(client), "alice")
    exp_id = create_experiment(client, alice)
    with sessions() as s:
        experiment = s.get(ExperimentModel, exp_id)
        assert experiment is not None
        before = dict(experiment.config)
        with pytest.raises(ExperimentConfigError) as err:
            edited_config(experiment, merged={"resources": {"weight": -1}})
        assert err.value.field == "resources.weight"
        assert experiment.config == before
    r = client.patch(f"/api/v1/experiments/{exp_id}", json={"resources": {"weight": -1}}, headers=alice)
    assert r.status_code == 400 and "resources.weight" in r.text, r.text
    assert _read(sessions, exp_id).resources.weight == 1.0


def test_a_stored_config_this_master_refuses_is_an_error_naming_the_experiment_and_field(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    alice = make_user(client, login(client), "alice")
    exp_id = create_experiment(client, alice)
    with sessions() as s, s.begin():
        experiment = s.get(ExperimentModel, exp_id)
        assert experiment is not None
        experiment.config = {**experiment.config, "max_restarts": "many"}  # as an older master stored it
    stored_config.forget()  # read by a master process that starts now
    with pytest.raises(StoredConfigError) as err:
        _read(sessions, exp_id)
    assert f"experiment {exp_id}'s stored config" in err.value.message and err.value.field == "max_restarts"
    assert err.value.code == "invalid_stored_config"


def test_checkpoint_gc_skips_an_experiment_whose_config_it_refuses_and_takes_its_request(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    alice = make_user(client, login(client), "alice")
    bad, good = create_experiment(client, alice), create_experiment(client, alice)
    with sessions() as s, s.begin():
        experiment = s.get(ExperimentModel, bad)
        assert experiment is not None
        experiment.config = {**experiment.config, "max_restarts": "many"}
        request_checkpoint_gc(s, bad)
        request_checkpoint_gc(s, good)
    stored_config.forget()
    with sessions() as s, s.begin():
        _, taken = plan_collection(s, utcnow(), default_root=tmp_path)  # does not raise
    assert sorted(taken) == sorted([bad, good])
    with sessions() as s:  # both requests were taken: the bad one does not come back every pass
        assert s.scalar(select(func.count()).select_from(CheckpointGCRequestModel)) == 0


def test_one_refused_config_does_not_fail_a_listing_of_everyones_experiments(
    client: TestClient, sessions: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    admin = login(client)
    alice, bob = make_user(client, admin, "alice"), make_user(client, admin, "bob")
    old = create_experiment(client, alice, CONFIG + "labels: [old]\n")
    fine = create_experiment(client, bob, CONFIG + "labels: [new]\n")
    with sessions() as s, s.begin():
        experiment = s.get(ExperimentModel, old)
        assert experiment is not None
        experiment.config = {**experiment.config, "max_restarts": "many"}  # as an older master stored it
    stored_config.forget()
    for _ in range(2):
        r = client.get("/api/v1/experiments", headers=admin)
        assert r.status_code == 200, r.text
        shown = {e["id"]: e for e in r.json()["experiments"]}
        assert shown[fine]["labels"] == ["new"] and shown[fine]["searcherMetric"] == "validation_loss"
        assert shown[old]["labels"] == [] and shown[old]["searcherType"] == ""  # listed, without what it says
    said = [r.message for r in caplog.records if f"experiment {old}'s stored config" in r.message]
    assert len(said) == 1, said  # once, not on every listing
