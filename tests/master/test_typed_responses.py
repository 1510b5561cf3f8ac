"""Every JSON operation documents what it answers, and answers only that.

The OpenAPI document names the properties of every 2xx answer (no free-form object at the top; a stream's
line under ``application/x-ndjson``) and documents every error as ``ApiError``. FastAPI checks each answer
against its shape: an answer with a key its shape does not name is a 500 that says so (and the log names the
key, not its value). Schemathesis checks that real answers conform (``test_schemathesis``).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hpc_master.api import convert
from tests.master.helpers import login

MEDIA_TYPES = {"application/json", "application/x-ndjson"}


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].removeprefix("#/components/schemas/")
        schema = doc["components"]["schemas"][name]
    return schema


def _operations(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{m.upper()} {p}", op) for p, item in doc["paths"].items() for m, op in item.items()]


def test_every_operation_names_the_properties_of_its_answer(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    operations = _operations(doc)
    assert len(operations) >= 100
    free_form = []
    for label, operation in operations:
        answers = {code: a for code, a in operation["responses"].items() if code.startswith("2")}
        assert answers, label
        for code, answer in answers.items():
            assert set(answer.get("content", {})) & MEDIA_TYPES, (label, code, answer)
            for media_type, content in answer["content"].items():
                schema = _resolve(doc, content.get("schema", {}))
                named = schema.get("type") == "object" and "properties" in schema
                if not named or schema.get("additionalProperties") is not False:
                    free_form.append(f"{label} {code} {media_type}: {schema}")
    assert not free_form, "\n".join(free_form)


def test_every_error_is_documented_as_an_api_error(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    for label, operation in _operations(doc):
        assert "422" not in operation["responses"], label  # FastAPI's HTTPValidationError: never sent
        default = operation["responses"]["default"]["content"]
        assert list(default) == ["application/json"], label
        assert _resolve(doc, default["application/json"]["schema"])["required"] == ["code", "message"]


def test_a_stream_documents_one_line(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    logs = doc["paths"]["/api/v1/trials/{trial_id}/logs"]["get"]["responses"]["200"]["content"]
    assert list(logs) == ["application/x-ndjson"]
    line = _resolve(doc, logs["application/x-ndjson"]["schema"])
    entry = _resolve(doc, line["properties"]["result"])
    assert {"id", "trialId", "message", "level", "timestamp", "rankId"} <= set(entry["properties"])


def test_a_determined_object_has_determineds_field_names(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    # v1Experiment, v1Trial and v1Checkpoint as Determined 0.38.1's bindings name them.
    assert {"id", "name", "state", "startTime", "endTime", "numTrials", "searcherType", "projectId",
            "workspaceId", "originalConfig", "forkedFrom", "jobId"} <= set(schemas["Experiment"]["properties"])  # fmt: skip
    assert {"id", "experimentId", "hparams", "totalBatchesProcessed", "latestCheckpointUuid",
            "bestValidationMetric", "restarts"} <= set(schemas["Trial"]["properties"])  # fmt: skip
    assert {"uuid", "taskId", "allocationId", "reportTime", "resources", "metadata", "state",
            "training"} <= set(schemas["Checkpoint"]["properties"])  # fmt: skip


def test_an_answer_with_a_key_its_shape_does_not_name_is_refused(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    headers = login(client)
    assert client.get("/api/v1/me", headers=headers).status_code == 200
    original = convert.user_to_api
    monkeypatch.setattr(convert, "user_to_api", lambda user: {**original(user), "secretish": "hunter2"})
    with caplog.at_level(logging.ERROR, logger="hpc_master"):
        answer = client.get("/api/v1/me", headers=headers)
    assert answer.status_code == 500
    assert answer.json()["code"] == "internal"
    assert "user.secretish" in caplog.text and "extra_forbidden" in caplog.text
    assert "hunter2" not in caplog.text  # where it differs, never the value


def test_an_answer_missing_a_named_key_is_refused(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    headers = login(client)
    original = convert.user_to_api

    def without_username(user: Any) -> dict[str, Any]:
        out = original(user)
        del out["username"]
        return out

    monkeypatch.setattr(convert, "user_to_api", without_username)
    assert client.get("/api/v1/me", headers=headers).status_code == 500


def test_a_body_that_is_not_json_is_a_400_that_names_no_field(client: TestClient) -> None:
    headers = {**login(client), "content-type": "application/json"}
    answer = client.post("/api/v1/experiments", content=b"{not json", headers=headers)
    assert answer.status_code == 400
    body = answer.json()
    assert body["code"] == "invalid_argument" and body["field"] is None  # not the decode error's position
    assert body["message"].startswith("the request body is not valid JSON")
