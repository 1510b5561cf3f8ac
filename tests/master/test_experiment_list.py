"""``GET /api/v1/experiments``: Determined's filters and sort keys, each applied or refused by name (none
accepted and ignored), on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.master.helpers import CONFIG, create_experiment, login

pytestmark = pytest.mark.storage  # the listing query's filters and sorts


def _experiments(client: TestClient, headers: dict[str, str], query: str) -> list[dict[str, Any]]:
    r = client.get(f"/api/v1/experiments?{query}", headers=headers)
    assert r.status_code == 200, r.text
    return list(r.json()["experiments"])


def _names(client: TestClient, headers: dict[str, str], query: str) -> list[str]:
    return [e["name"] for e in _experiments(client, headers, query)]


def _make(client: TestClient, headers: dict[str, str], name: str, description: str, labels: list[str]) -> int:
    config = (
        CONFIG.replace("name: mnist", f"name: {name}", 1) + f"description: {description}\nlabels: {labels}\n"
    )
    return create_experiment(client, headers, config)


@pytest.fixture
def seeded(client: TestClient) -> dict[str, str]:
    admin = login(client)
    _make(client, admin, "Digits-CNN", "small convnet", ["vision", "baseline"])
    _make(client, admin, "digits_mlp", "a plain MLP", ["vision"])
    _make(client, admin, "iris", "tabular 100%", ["tabular", "baseline"])
    return admin


def test_name_and_description_match_anywhere_case_aside(client: TestClient, seeded: dict[str, str]) -> None:
    assert _names(client, seeded, "name=digits") == ["Digits-CNN", "digits_mlp"]
    assert _names(client, seeded, "name=CNN") == ["Digits-CNN"]
    assert _names(client, seeded, "name=_") == ["digits_mlp"]  # the pattern's own characters are literal
    assert _names(client, seeded, "description=100%25") == ["iris"]
    assert _names(client, seeded, "name=nothing-like-it") == []
    r = client.get("/api/v1/experiments?name=digits&limit=1", headers=seeded).json()
    assert r["pagination"]["total"] == 2 and len(r["experiments"]) == 1


def test_labels_select_experiments_carrying_all_of_them(client: TestClient, seeded: dict[str, str]) -> None:
    assert _names(client, seeded, "labels=vision") == ["Digits-CNN", "digits_mlp"]
    assert _names(client, seeded, "labels=vision&labels=baseline") == ["Digits-CNN"]
    assert _names(client, seeded, "labels=baseline") == ["Digits-CNN", "iris"]
    assert _names(client, seeded, "labels=nope") == []


def test_sort_by_determineds_keys(client: TestClient, seeded: dict[str, str]) -> None:
    assert _names(client, seeded, "sortBy=SORT_BY_NAME") == ["Digits-CNN", "digits_mlp", "iris"]
    assert _names(client, seeded, "sortBy=SORT_BY_NAME&orderBy=ORDER_BY_DESC") == [
        "iris",
        "digits_mlp",
        "Digits-CNN",
    ]
    assert _names(client, seeded, "sortBy=SORT_BY_DESCRIPTION") == ["digits_mlp", "Digits-CNN", "iris"]
    ids = [e["id"] for e in _experiments(client, seeded, "sortBy=SORT_BY_ID&orderBy=ORDER_BY_DESC")]
    assert ids == sorted(ids, reverse=True)
    assert len(_names(client, seeded, "sortBy=SORT_BY_NUM_TRIALS")) == 3


@pytest.mark.parametrize("value", ["SORT_BY_CHECKPOINT_SIZE", "SORT_BY_SEARCHER_METRIC_VAL", "BOGUS"])
def test_a_sort_this_master_does_not_have_is_an_error_that_names_it(
    client: TestClient, seeded: dict[str, str], value: str
) -> None:
    r = client.get(f"/api/v1/experiments?sortBy={value}", headers=seeded)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["field"] == "sortBy" and value in body["message"] and "SORT_BY_NAME" in body["message"]
