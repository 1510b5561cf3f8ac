"""Schemathesis against the master's whole OpenAPI document: no request it makes gets a 5xx.

The app runs under a real uvicorn (in a thread, on a free loopback port) on SQLite and on PostgreSQL, with one
user's experiment and trial in it, so that small ids reach real rows. The harness routes are called with the
trial's own token; every other request carries a fresh admin token (a generated logout, password change or
demotion would otherwise leave the rest of the run unauthenticated). Bounded for CI: a fixed number of examples per operation, derandomized (the same requests on
every run), no example database, and a 10 s timeout per request. The routes that may wait are tamed on
purpose: ``follow=false`` for the log stream and ``timeoutSeconds=0`` for the long polls, which otherwise
answer only after their wait (or, following a live trial, never); a test below keeps that list complete.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import response_schema_conformance
from schemathesis.core.result import Ok
from schemathesis.generation.modes import GenerationMode
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from hpc_master import auth
from hpc_master.api.app import create_app
from hpc_master.db.engine import transaction
from hpc_master.db.models import SessionModel, UserModel, utcnow
from hpc_master.masterconf import MasterConfig
from hpc_master.services.users import mint_trial_token
from tests.master.helpers import seed_trial

MAX_EXAMPLES = 15
"""Requests per operation and mode (25 until session 23: about 275 s of CI's two CPUs over both databases, in
a CI that must stay under 30 minutes; derandomized, so each run sends the same requests)."""
TAMED: dict[str, dict[str, Any]] = {
    "/api/v1/trials/{trial_id}/logs": {"follow": "false"},
    "/api/v1/tasks/{task_id}/logs": {"follow": "false"},
    "/api/v1/master/logs": {"follow": "false"},
    "/api/v1/allocations/{allocation_id}/signals/preemption": {"timeoutSeconds": 0},
    "/api/v1/trials/{trial_id}/searcher/operation": {"timeoutSeconds": 0},
    # The web UI's metrics streams send once with periodSeconds=0, and keep sending otherwise.
    "/api/v1/experiments/{experiment_id}/metrics-stream/metric-names": {"periodSeconds": 0},
    "/api/v1/experiments/{experiment_id}/metrics-stream/trials-sample": {"periodSeconds": 0},
    "/api/v1/experiments/{experiment_id}/metrics-stream/trials-snapshot": {"periodSeconds": 0},
    # The web UI's change streams send every digest, then only changes, until told not to follow.
    "/api/v1/webui/changes": {"follow": "false"},
    "/api/v1/webui/experiments/{experiment_id}/changes": {"follow": "false"},
    "/api/v1/webui/trials/{trial_id}/changes": {"follow": "false"},
}
"""Query parameters fixed for the routes that would otherwise wait."""
WAITING_PARAMETERS = {"follow", "timeoutSeconds", "periodSeconds"}
SESSION_ENDING = ("/api/v1/auth", "/api/v1/users", "/api/v1/me", "/api/v1/webui/session", "/api/v1/logout")
"""The routes under which a generated request may end, demote or deactivate the admin session it carries."""


@dataclass
class Live:
    url: str
    app: Any
    sessions: sessionmaker[Session]
    trial_token: str
    """The seeded trial's own token, for the harness routes (their fast paths take only it)."""

    def headers(self) -> dict[str, str]:
        """A new session of ``admin``, made an active admin again first."""
        token = auth.new_token()
        with transaction(self.sessions) as s:
            s.execute(update(UserModel).where(UserModel.username == "admin").values(active=True, admin=True))
            admin_id = s.scalar(select(UserModel.id).where(UserModel.username == "admin"))
            expires = utcnow() + dt.timedelta(hours=1)
            s.add(SessionModel(token_hash=auth.hash_token(token), user_id=admin_id, expires_at=expires))
        self.app.state.det.tokens.clear()
        return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def live(config: MasterConfig, engine: Engine, sessions: sessionmaker[Session]) -> Iterator[Live]:
    app = create_app(config, engine=engine)
    trial_id = seed_trial(sessions)
    with transaction(sessions) as s:
        trial_token = mint_trial_token(s, trial_id)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started:
                break
            threading.Event().wait(0.05)
        assert server.started, "uvicorn did not start"
        host, port = sock.getsockname()
        yield Live(f"http://{host}:{port}", app, sessions, trial_token)
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


def _checker(
    live: Live, operation: Any, mode: GenerationMode, errors: list[str], nonconforming: list[str]
) -> Any:
    """A Hypothesis test of one operation, collecting (not shrinking) the requests that got a 5xx and those
    whose answer does not conform to the document."""
    fixed = TAMED.get(operation.path, {})
    harness = "harness" in (operation.tags or [])
    # A fresh admin session before each request of an operation that may end or demote it (a logout, a
    # password change, a user's update); one session for all the requests of any other operation.
    ends_sessions = operation.path.startswith(SESSION_ENDING)
    admin: list[dict[str, str]] = []

    @given(case=operation.as_strategy(mode))
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        if fixed:
            case.query = {**(case.query or {}), **fixed}
        if harness:
            headers = {"Authorization": f"Bearer {live.trial_token}"}
        else:
            if ends_sessions or not admin:
                admin[:] = [live.headers()]
            headers = admin[0]
        response = case.call(base_url=live.url, headers=headers, timeout=10)
        sent = f"{case.method} {case.formatted_path} query={case.query} body={case.body!r:.300}"
        if response.status_code >= 500:
            errors.append(sent)
            return
        try:  # the answer is the shape the document gives for its status (an error's: ApiError)
            case.validate_response(response, checks=[response_schema_conformance])
        except (AssertionError, ExceptionGroup) as failure:
            nonconforming.append(f"{sent} -> {response.status_code}: {str(failure)[:600]}")

    return check


SHARDS = 3
"""The operations are split among this many tests per mode, so that parallel workers share the fuzzing."""


@pytest.mark.storage  # values that one database holds and another refuses
@pytest.mark.parametrize("shard", range(SHARDS), ids=lambda i: f"shard{i}")
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_no_request_gets_a_server_error(live: Live, mode: GenerationMode, shard: int) -> None:
    """Valid requests (positive) and requests that break the schema (negative: numbers past the bounds, wrong
    types, missing fields) for every operation (each shard takes every SHARDS-th); every 5xx is collected,
    with what was sent."""
    schema = schemathesis.openapi.from_dict(live.app.openapi())
    errors: list[str] = []
    nonconforming: list[str] = []
    tested, unbreakable = [], []
    for index, result in enumerate(schema.get_all_operations()):
        assert isinstance(result, Ok), result  # the document is valid OpenAPI
        if index % SHARDS != shard:
            continue
        operation = result.ok()
        try:
            _checker(live, operation, mode, errors, nonconforming)()
        except Unsatisfiable:  # negative mode, for an operation with nothing to break
            assert mode is GenerationMode.NEGATIVE, operation.label
            unbreakable.append(operation.label)
        else:
            tested.append(operation.label)
    assert len(tested) >= 30 // SHARDS if mode is GenerationMode.POSITIVE else len(tested) >= 25 // SHARDS, (
        unbreakable
    )
    assert not errors, "\n".join(errors[:20])
    assert not nonconforming, "\n".join(nonconforming[:20])


def test_every_route_that_may_wait_is_tamed(client: Any) -> None:
    doc = client.get("/openapi.json").json()
    waiting = {
        path
        for path, item in doc["paths"].items()
        for operation in item.values()
        for parameter in operation.get("parameters", [])
        if parameter["name"] in WAITING_PARAMETERS
    }
    assert waiting == set(TAMED)
