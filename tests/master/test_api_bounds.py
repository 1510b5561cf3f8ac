"""Every integer the API takes is bounded to what its column holds (``api.bounds``): out of range is a 400 with
the field, never a 500 (SQLite's OverflowError beyond 64 bits, PostgreSQL's DataError beyond ``INTEGER``)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import DataError
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.api.schemas import MetricsBatchRequest
from hpc_master.db.engine import transaction
from hpc_master.ingest.plain import plain_training_rows
from hpc_master.services.users import mint_trial_token
from tests.master.helpers import admin_token, seed_trial

BIG = 2**63  # past SQLite's integers
INT32_PAST = 2**31  # past PostgreSQL's INTEGER


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _refused(r: Any, field: str) -> None:
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "invalid_argument" and r.json()["field"] == field, r.json()


@pytest.mark.parametrize("value", [BIG, INT32_PAST, 0, -1])
def test_ids_in_paths_out_of_range_are_400(
    client: TestClient, sessions: sessionmaker[Session], value: int
) -> None:
    h = _bearer(admin_token(sessions))
    _refused(client.get(f"/api/v1/trials/{value}", headers=h), "trial_id")
    _refused(client.get(f"/api/v1/experiments/{value}", headers=h), "experiment_id")
    _refused(client.get(f"/api/v1/trials/{value}/metrics", headers=h), "trial_id")
    _refused(client.patch(f"/api/v1/users/{value}", headers=h, json={}), "user_id")
    _refused(
        client.post(f"/api/v1/trials/{value}/metrics/batch", headers=h, json={"metrics": []}), "trial_id"
    )
    r = client.get(f"/api/v1/allocations/{value}.0/signals/preemption", headers=h)
    _refused(r, "allocation_id")
    assert client.get(f"/api/v1/trials/{2**31 - 1}", headers=h).status_code == 404  # the largest id


@pytest.mark.parametrize("param", ["offset=9223372036854775808", "limit=9223372036854775808", "offset=-1"])
def test_offsets_and_limits_out_of_range_are_400(
    client: TestClient, sessions: sessionmaker[Session], param: str
) -> None:
    h = _bearer(admin_token(sessions))
    trial_id = seed_trial(sessions)
    name = param.split("=")[0]
    _refused(client.get(f"/api/v1/experiments?{param}", headers=h), name)
    _refused(client.get(f"/api/v1/trials/{trial_id}/metrics?{param}", headers=h), name)
    _refused(client.get(f"/api/v1/experiments/1/trials?{param}", headers=h), name)
    _refused(client.get(f"/api/v1/experiments/1/checkpoints?{param}", headers=h), name)
    _refused(client.get(f"/api/v1/experiments?userIds={INT32_PAST}", headers=h), "userIds.0")
    r = client.get(f"/api/v1/trials/{trial_id}/searcher/operation?timeoutSeconds={BIG}", headers=h)
    _refused(r, "timeoutSeconds")
    assert client.get(f"/api/v1/trials/{trial_id}/metrics?limit=-1", headers=h).status_code == 200  # no limit


def test_integers_in_bodies_out_of_range_are_400(client: TestClient, sessions: sessionmaker[Session]) -> None:
    trial_id = seed_trial(sessions)
    with transaction(sessions) as s:
        h = _bearer(mint_trial_token(s, trial_id))
    ckpt = {"uuid": str(uuid.uuid4()), "trialId": trial_id, "trialRunId": 0}
    for body, field in [
        ({**ckpt, "trialId": BIG}, "checkpoint.trialId"),
        ({**ckpt, "trialId": INT32_PAST}, "checkpoint.trialId"),
        ({**ckpt, "trialRunId": INT32_PAST}, "checkpoint.trialRunId"),
        ({**ckpt, "metadata": {"steps_completed": BIG}}, "checkpoint.metadata"),
    ]:
        _refused(client.post("/api/v1/checkpoints", headers=h, json={"checkpoint": body}), field)
    batch = f"/api/v1/trials/{trial_id}/metrics/batch"
    row = {"trialRunId": 1, "stepsCompleted": 5, "metrics": {}}
    for item, field in [
        ({**row, "stepsCompleted": BIG}, "metrics.0.stepsCompleted"),
        ({**row, "trialRunId": INT32_PAST}, "metrics.0.trialRunId"),
    ]:
        _refused(client.post(batch, headers=h, json={"metrics": [item]}), field)
    op = f"/api/v1/trials/{trial_id}/searcher/completed_operation"
    r = client.post(op, headers=h, json={"op": {"validateAfter": {"length": BIG}}})
    _refused(r, "op.validateAfter.length")
    for progress in ("NaN", "Infinity", "1.5"):
        r = client.post(
            f"/api/v1/trials/{trial_id}/progress",
            headers={**h, "content-type": "application/json"},
            content=b'{"progress": ' + progress.encode() + b"}",
        )
        _refused(r, "progress")
    # In range, the same bodies are taken.
    assert client.post("/api/v1/checkpoints", headers=h, json={"checkpoint": ckpt}).status_code == 200
    r = client.post(batch, headers=h, json={"metrics": [{**row, "stepsCompleted": 2**63 - 1}]})
    assert r.json() == {"accepted": 1, "duplicates": 0}


def test_the_plain_metrics_form_keeps_to_the_same_bounds() -> None:
    """The fast path's parser without pydantic takes nothing validation refuses."""
    for run in (INT32_PAST, 2**40):
        body = json.dumps({"metrics": [{"trialRunId": run, "stepsCompleted": 5, "metrics": {}}]}).encode()
        assert plain_training_rows(body, 7) is None
        with pytest.raises(ValueError):
            MetricsBatchRequest.model_validate_json(body)


def test_the_openapi_document_states_the_bounds(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    params = {
        p["name"]: p["schema"] for p in doc["paths"]["/api/v1/trials/{trial_id}/metrics"]["get"]["parameters"]
    }
    assert params["trial_id"]["minimum"] == 1 and params["trial_id"]["maximum"] == 2**31 - 1
    assert params["offset"]["maximum"] == 2**31 - 1


@pytest.mark.storage  # what the database can hold
def test_values_the_database_cannot_hold_are_400_not_500(client: TestClient) -> None:
    """The safety net behind the bounds: an OverflowError or a DataError is the request's fault."""
    app: Any = client.app

    def overflow() -> None:
        raise OverflowError("Python int too large to convert to SQLite INTEGER")

    def data_error() -> None:
        raise DataError("SELECT 1", {}, Exception("integer out of range"))

    app.add_api_route("/test/overflow", overflow)
    app.add_api_route("/test/data-error", data_error)
    for path in ("/test/overflow", "/test/data-error"):
        r = client.get(path)
        assert r.status_code == 400 and r.json()["code"] == "invalid_argument", r.text


def test_the_agent_user_group_is_typed(client: TestClient, sessions: sessionmaker[Session]) -> None:
    """``agentUser`` becomes a user's unix username (a 128-character column): a string, or nothing."""
    h = _bearer(admin_token(sessions))
    for group in ({"agentUser": 5}, {"agentUser": ["a"]}, {"agentUser": "x" * 129}, {"agentUid": BIG}):
        r = client.post("/api/v1/users", headers=h, json={"user": {"username": "u", "agentUserGroup": group}})
        _refused(r, "user.agentUserGroup")
        _refused(client.patch("/api/v1/users/1", headers=h, json={"agentUserGroup": group}), "agentUserGroup")
    group = {"agentUser": "u", "agentUid": 1000, "agentGroup": "g", "agentGid": 1000}
    r = client.post("/api/v1/users", headers=h, json={"user": {"username": "u", "agentUserGroup": group}})
    assert r.status_code == 200 and r.json()["user"]["unixUsername"] == "u", r.text
