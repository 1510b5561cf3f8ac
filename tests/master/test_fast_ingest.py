"""The metrics fast path (``hpc_master.api.fast_ingest``), on SQLite and PostgreSQL: once a token is known it
answers ``POST .../metrics/batch`` itself, with the route's answers, and hands everything else to the route."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.api.deps import AppState
from hpc_master.db.engine import transaction
from hpc_master.db.models import MetricModel, SearcherOpCompletionModel, TrialModel
from tests.master.helpers import create_experiment, login, make_user
from tests.master.test_api import bearer, make_trial

pytestmark = pytest.mark.storage  # metrics ingest


def _state(client: TestClient) -> AppState:
    state: AppState = client.app.state.det  # type: ignore[attr-defined]
    return state


def _batch(run: int, steps: range, group: str = "training") -> dict[str, Any]:
    name = "validation_loss" if group == "validation" else "loss"  # the experiment's searcher metric
    return {
        "metrics": [
            {
                "trialRunId": run,
                "stepsCompleted": s,
                "group": group,
                "metrics": {"avgMetrics": {name: 1 / s}},
                "reportTime": "2026-11-23T02:50:00.123456+00:00",  # as the harness sends it
            }
            for s in steps
        ]
    }


def _stored(sessions: sessionmaker[Session], trial_id: int) -> list[tuple[int, str, int]]:
    with transaction(sessions) as s:
        rows = s.execute(
            select(MetricModel.trial_run_id, MetricModel.group, MetricModel.steps_completed)
            .where(MetricModel.trial_id == trial_id)
            .order_by(MetricModel.group, MetricModel.steps_completed)
        ).all()
        return [tuple(r) for r in rows]  # type: ignore[misc]


def test_known_tokens_take_the_fast_path_with_the_routes_semantics(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    admin = login(client)
    trial_id, token = make_trial(sessions, create_experiment(client, admin))
    url = f"/api/v1/trials/{trial_id}/metrics/batch"
    state = _state(client)

    first = client.post(url, headers=bearer(token), json=_batch(1, range(1, 51)))
    assert first.json() == {"accepted": 50, "duplicates": 0}
    assert state.fast_ingests == 0  # an unknown token: the route authenticated it (and cached it)

    r = client.post(url, headers=bearer(token), json=_batch(1, range(41, 101)))
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == {"accepted": 50, "duplicates": 10}  # 41-50 were stored already
    assert state.fast_ingests == 1
    assert [row[2] for row in _stored(sessions, trial_id)] == list(range(1, 101))

    # A replaced run's late rows are not stored (its successor may have rolled them back).
    with transaction(sessions) as s:
        trial = s.get(TrialModel, trial_id)
        assert trial is not None and trial.steps_completed == 100
        trial.run_id = 2
    assert client.post(url, headers=bearer(token), json=_batch(1, range(101, 111))).json() == {
        "accepted": 0,
        "duplicates": 10,
    }
    assert client.post(url, headers=bearer(token), json=_batch(2, range(101, 111))).json() == {
        "accepted": 10,
        "duplicates": 0,
    }
    assert state.fast_ingests == 3
    with transaction(sessions) as s:
        trial = s.get(TrialModel, trial_id)
        assert trial is not None and trial.steps_completed == 110

    if state.writer.takes_body:  # a SQLite file: the ingest worker stored the plain training batches
        assert state.writer.worker_groups >= 3 and state.writer.raw_groups == 0
    elif state.writer.raw_dialect == "postgresql":  # one unnest INSERT per batch, in psycopg's driver SQL
        assert state.writer.raw_groups >= 3
    with transaction(sessions) as s:  # the harness's report times, to the microsecond, in UTC
        times = set(s.scalars(select(MetricModel.report_time).where(MetricModel.trial_id == trial_id)))
        assert times == {dt.datetime(2026, 11, 23, 2, 50, 0, 123456, tzinfo=dt.UTC)}

    # Validations on the fast path still reach the searcher.
    r = client.post(url, headers=bearer(token), json=_batch(2, range(100, 101), group="validation"))
    assert r.json() == {"accepted": 1, "duplicates": 0} and state.fast_ingests == 4
    with transaction(sessions) as s:
        done = s.scalars(
            select(SearcherOpCompletionModel.length).where(SearcherOpCompletionModel.trial_id == trial_id)
        ).all()
        assert list(done) == [100]


def test_everything_else_is_answered_by_the_route_exactly_as_before(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    admin = login(client)
    exp_id = create_experiment(client, admin)
    trial_a, token_a = make_trial(sessions, exp_id, "a")
    trial_b, _ = make_trial(sessions, exp_id, "b")
    state = _state(client)
    mallory = make_user(client, admin, "mallory")
    cases = [
        (trial_a, bearer(token_a), {"metrics": [{"stepsCompleted": -1}]}),  # a bad body
        (trial_a, bearer(token_a), b'{"metrics": ['),  # not JSON
        (trial_b, bearer(token_a), _batch(1, range(1, 3))),  # another trial's token
        (trial_a, mallory, _batch(1, range(1, 3))),  # another user's trial
        (trial_a, {"Authorization": "Bearer nope"}, _batch(1, range(1, 3))),  # an unknown token
    ]

    def answer(trial_id: int, headers: dict[str, str], body: Any) -> tuple[int, Any]:
        url = f"/api/v1/trials/{trial_id}/metrics/batch"
        if isinstance(body, bytes):
            r = client.post(url, headers={**headers, "Content-Type": "application/json"}, content=body)
        else:
            r = client.post(url, headers=headers, json=body)
        return r.status_code, r.json()

    cold = []
    for case in cases:
        state.tokens.clear()  # the route authenticates every request
        cold.append(answer(*case))
    # Warm the cache for the known tokens, then the same requests reach the fast path first.
    assert answer(trial_a, bearer(token_a), _batch(1, range(1, 2)))[0] == 200
    assert answer(trial_a, mallory, _batch(1, range(1, 2)))[0] == 403
    before = state.fast_ingests
    warm = [answer(*case) for case in cases]
    assert state.fast_ingests == before  # none of them was answered by the fast path
    assert warm == cold
    assert [status for status, _ in warm] == [400, 400, 403, 403, 401]
    assert all(body["code"] and body["message"] for _, body in warm)
    assert _stored(sessions, trial_a) == [(1, "training", 1)] and _stored(sessions, trial_b) == []


def test_a_trial_deleted_under_a_cached_token_gets_the_routes_error(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    admin = login(client)
    trial_id, token = make_trial(sessions, create_experiment(client, admin))
    url = f"/api/v1/trials/{trial_id}/metrics/batch"
    assert client.post(url, headers=bearer(token), json=_batch(1, range(1, 3))).status_code == 200
    with transaction(sessions) as s:  # gone, while its token is still in the cache
        s.execute(delete(MetricModel).where(MetricModel.trial_id == trial_id))
        s.execute(delete(TrialModel).where(TrialModel.id == trial_id))
    state = _state(client)
    before = state.fast_ingests
    r = client.post(url, headers=bearer(token), json=_batch(1, range(3, 5)))
    assert r.status_code in (401, 404, 409) and r.json()["code"], r.text
    assert state.fast_ingests == before
    assert _stored(sessions, trial_id) == []


def test_large_batches_with_scattered_duplicates_count_exactly(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    """Rows go in as multi-row INSERTs of up to 256 rows: accepted/duplicates must still be exact, on the
    raw path (the trial's token) and the ORM path (a user's token)."""
    admin = login(client)
    trial_id, token = make_trial(sessions, create_experiment(client, admin))
    url = f"/api/v1/trials/{trial_id}/metrics/batch"
    odd = _batch(1, range(1, 1001, 2))  # 500 rows
    assert client.post(url, headers=bearer(token), json=odd).json() == {"accepted": 500, "duplicates": 0}
    everything = _batch(1, range(1, 1001))  # 1,000 rows, every other one already stored
    assert client.post(url, headers=bearer(token), json=everything).json() == {
        "accepted": 500,
        "duplicates": 500,
    }
    more = _batch(1, range(901, 1301))  # as a user: the ORM path; 100 stored, 300 new
    assert client.post(url, headers=admin, json=more).json() == {"accepted": 300, "duplicates": 100}
    assert [row[2] for row in _stored(sessions, trial_id)] == list(range(1, 1301))


def test_insert_chunks_cover_every_row_in_order_with_few_statement_shapes() -> None:
    from hpc_master.services.metrics import _sqlite_insert_chunks

    shapes: set[int] = set()
    for n in (1, 2, 3, 100, 255, 256, 257, 1000, 5461):
        rows = [(1, 1, "training", i, "{}", "t") for i in range(n)]
        flat: list[Any] = []
        for sql, params in _sqlite_insert_chunks(rows):
            count = sql.count("(?, ?, ?, ?, ?, ?)")
            assert len(params) == 6 * count
            shapes.add(count)
            flat += params
        assert flat == [v for row in rows for v in row]
    assert shapes <= {1, 2, 4, 8, 16, 32, 64, 128, 256}


PLAIN = [
    {"trialRunId": 1, "stepsCompleted": 5, "metrics": {"avgMetrics": {"loss": 0.5}}},
    {"trialRunId": 1, "stepsCompleted": 7, "metrics": {}, "reportTime": "2026-11-23T02:50:00.123456+00:00"},
    {"trialRunId": 1, "stepsCompleted": 8, "metrics": {}, "reportTime": "2026-11-23T02:50:00+00:00"},
    {"trialRunId": 1, "stepsCompleted": 9, "metrics": {}, "reportTime": "2026-11-23T04:20:00.5+05:30"},
    {"trialRunId": 1, "stepsCompleted": 10, "metrics": {}, "reportTime": "2026-11-23T02:50:00.000001Z"},
    {"trialRunId": 2, "stepsCompleted": 0, "group": "gpu_util", "metrics": {"a": [1, 2.5, None], "é": "ü"}},
    {
        "trialRunId": 1,
        "stepsCompleted": 6,
        "group": "training",
        "metrics": {"big": 2**53 + 1, "tiny": 5e-324},
    },
]
ODD = [  # valid for the API, but not the plain form: pydantic decides
    [{"trial_run_id": 1, "steps_completed": 5, "metrics": {}}],
    [{"trialRunId": 1, "stepsCompleted": 5.0, "metrics": {}}],
    [{"trialRunId": "1", "stepsCompleted": 5, "metrics": {}}],
    [{"trialRunId": True, "stepsCompleted": 5, "metrics": {}}],  # pydantic's lax mode takes true as 1
    [{"trialRunId": 1, "stepsCompleted": 5, "metrics": {}, "reportTime": "2026-11-23 01:02:03Z"}],
    [{"trialRunId": 1, "stepsCompleted": 5, "metrics": {}, "reportTime": 1790000000}],
    [{"trialRunId": 1, "stepsCompleted": 5, "metrics": {}, "extra": 1}],
    [{"trialRunId": 1, "stepsCompleted": 5, "group": "validation", "metrics": {"validation_loss": 1}}],
    [{"trialRunId": 1, "stepsCompleted": 6, "metrics": {"loss": float("nan")}}],  # orjson refuses NaN
    [{"trialRunId": 1, "stepsCompleted": 6, "metrics": {"big": 2**70}}],  # orjson reads this as a float
    [{"trialRunId": 1, "stepsCompleted": 6, "metrics": {"big": -(2**63) - 1}}],
]
INVALID = [
    [{"trialRunId": -1, "stepsCompleted": 5, "metrics": {}}],
    [{"trialRunId": 1, "stepsCompleted": 5, "group": "", "metrics": {}}],
    [{"trialRunId": 1, "stepsCompleted": 5, "group": "g" * 65, "metrics": {}}],
    [{"trialRunId": 1, "stepsCompleted": 5, "metrics": []}],
    [{"trialRunId": 1, "metrics": {}}],
    [{"trialRunId": 1, "stepsCompleted": 5, "metrics": {}, "reportTime": "2026-13-23T01:02:03Z"}],
    [{"trialRunId": 1, "stepsCompleted": 5, "metrics": {}, "reportTime": "2026-02-30T01:02:03.000001+00:00"}],
    [{"trialRunId": 1, "stepsCompleted": 5, "metrics": {}, "reportTime": "2026-02-03T01:02:61.000001+00:00"}],
    [{"trialRunId": 1, "stepsCompleted": 5, "metrics": {}, "reportTime": "2026-02-03T24:02:01.000001+00:00"}],
    [{"trialRunId": 1, "stepsCompleted": 5, "metrics": {}, "reportTime": "2026-02-03T23:02:01.00000٣+00:00"}],
    [{"trialRunId": 1, "stepsCompleted": 5, "metrics": {}, "reportTime": "2026-02-03T23:02:01x000001+00:00"}],
]


def test_the_plain_form_parses_to_exactly_what_validation_gives() -> None:
    import json

    from pydantic import ValidationError

    from hpc_master.api.fast_ingest import reports_of
    from hpc_master.api.schemas import MetricsBatchRequest
    from hpc_master.ingest.plain import plain_training_rows
    from hpc_master.services.metrics import sqlite_rows

    body = json.dumps({"metrics": PLAIN}).encode()
    plain = plain_training_rows(body, 7)
    validated = sqlite_rows(7, reports_of(MetricsBatchRequest.model_validate_json(body).metrics))
    assert plain is not None and len(plain) == len(PLAIN)
    for got, want, item in zip(plain, validated, PLAIN, strict=True):  # now differs by microseconds
        assert got[:5] == want[:5] and (got[5] == want[5] if "reportTime" in item else True)
    for items in ODD:
        body = json.dumps({"metrics": items}).encode()
        assert plain_training_rows(body, 7) is None
        MetricsBatchRequest.model_validate_json(body)  # valid: the slower path stores it
    for items in INVALID:  # never accepted by the plain form, refused by validation
        body = json.dumps({"metrics": items}).encode()
        assert plain_training_rows(body, 7) is None
        with pytest.raises(ValidationError):
            MetricsBatchRequest.model_validate_json(body)
    for body in (b"", b"[]", b'{"metrics": {}}', b'{"metrics": [], "x": 1}', b'{"metrics": [1]}'):
        assert plain_training_rows(body, 7) is None
