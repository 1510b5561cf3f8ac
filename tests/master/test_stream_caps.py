"""Streams and long polls under a cap per user (``security.max_streams_per_user``) and per trial's harness
(``security.max_long_polls_per_trial``), and their reads in threads of their own (``api.streams``).

Against real servers: a master in a subprocess (its cap set the way an admin would, from the environment) for
what users see, and uvicorn in this process where a test must hold a stream's read or break it. Then at the
ASGI level, each way a streaming response ends (finished, client gone, server error) gives its slot back.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.api.app import create_app
from hpc_master.db.engine import transaction
from hpc_master.masterconf import MasterConfig, parse_master_config
from hpc_master.services.access import Principal
from hpc_master.services.users import mint_trial_token
from tests.cli.conftest import running_master
from tests.master.helpers import CONFIG, context_file
from tests.webui.conftest import free_port, serve
from tests.webui.seed import seed_experiment, seed_user

CAP = 3
PASSWORD = "streams-test-pw"


# ---------------------------------------------------------------- a real master in a subprocess


@dataclass(frozen=True)
class Capped:
    url: str
    a: dict[str, str]
    b: dict[str, str]
    experiment_id: int


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Capped]:
    env = {"DET_ADMIN_PASSWORD": PASSWORD, "DET_MAX_STREAMS_PER_USER": str(CAP)}
    with running_master(tmp_path_factory.mktemp("capped"), ["tests.cli._api_master", "{port}"], env) as m:

        def login(username: str, password: str) -> dict[str, str]:
            body = {"username": username, "password": password}
            r = httpx.post(f"{m.url}/api/v1/auth/login", json=body)
            assert r.status_code == 200, r.text
            return {"Authorization": f"Bearer {r.json()['token']}"}

        admin = login("admin", PASSWORD)
        for name in ("usera", "userb"):
            body = {"user": {"username": name}, "password": f"{name}-pw"}
            assert httpx.post(f"{m.url}/api/v1/users", headers=admin, json=body).status_code == 200
        a = login("usera", "usera-pw")
        created = {"config": CONFIG, "modelDefinition": [context_file("train.py")], "activate": False}
        r = httpx.post(f"{m.url}/api/v1/experiments", headers=a, json=created)
        assert r.status_code == 200, r.text
        yield Capped(m.url, a, login("userb", "userb-pw"), int(r.json()["experiment"]["id"]))


def _streams(experiment_id: int) -> list[str]:
    """Streams that stay open (change streams, a metrics stream with a period)."""
    metrics = f"/api/v1/experiments/{experiment_id}/metrics-stream"
    return [
        "/api/v1/webui/changes",
        f"/api/v1/webui/experiments/{experiment_id}/changes",
        f"{metrics}/metric-names?periodSeconds=30",
        f"{metrics}/trials-snapshot?metricName=loss&batchesProcessed=10&periodSeconds=30",
    ]


@dataclass
class _Open:
    response: httpx.Response
    lines: Iterator[str]  # kept: a line iterator that is dropped closes the connection

    def first(self) -> str:
        return next(self.lines)


@contextlib.contextmanager
def _open(client: httpx.Client, path: str, headers: dict[str, str]) -> Iterator[_Open]:
    """A stream whose headers have arrived (its slot is taken by then); closed when the block ends."""
    with client.stream("GET", path, headers=headers, timeout=10) as response:
        yield _Open(response, response.iter_lines())


def test_a_user_over_the_cap_gets_429_while_others_stream_and_me_answers(capped: Capped) -> None:
    paths = _streams(capped.experiment_id)
    with httpx.Client(base_url=capped.url) as client, contextlib.ExitStack() as held:
        a_streams = [held.enter_context(_open(client, path, capped.a)) for path in paths[:CAP]]
        assert [s.response.status_code for s in a_streams] == [200] * CAP
        assert all(s.first() for s in a_streams)  # each sent its first message

        started = time.monotonic()
        refused = client.get(paths[CAP], headers=capped.a, timeout=10)
        assert refused.status_code == 429, refused.text
        assert time.monotonic() - started < 5  # refused at once, not queued
        error = refused.json()
        assert error["code"] == "too_many_streams"
        assert "security.max_streams_per_user" in error["message"]
        assert f"{CAP} streams open" in error["message"] and "usera" in error["message"]
        assert int(refused.headers["retry-after"]) >= 1
        # Requests that are not streams are not capped.
        assert client.get("/api/v1/me", headers=capped.a, timeout=10).status_code == 200

        # Another user still streams, and is answered.
        b_stream = held.enter_context(_open(client, paths[0], capped.b))
        assert b_stream.response.status_code == 200 and b_stream.first()
        me = client.get("/api/v1/me", headers=capped.b, timeout=10)
        assert me.status_code == 200 and me.json()["user"]["username"] == "userb"

        # Closing one of A's streams (the client goes) gives its slot back.
        a_streams[0].response.close()
        deadline = time.monotonic() + 10
        while True:
            again = client.get(f"{paths[2].split('?')[0]}?periodSeconds=0", headers=capped.a, timeout=10)
            if again.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert again.status_code == 200, again.text


def test_streams_that_end_give_their_slot_back(capped: Capped) -> None:
    once = f"/api/v1/experiments/{capped.experiment_id}/metrics-stream/metric-names?periodSeconds=0"
    with httpx.Client(base_url=capped.url) as client:
        for _ in range(CAP * 3):
            r = client.get(once, headers=capped.a, timeout=10)
            assert r.status_code == 200, r.text
            r = client.get("/api/v1/webui/changes?follow=false", headers=capped.a, timeout=10)
            assert r.status_code == 200, r.text


# ---------------------------------------------------------------- uvicorn in this process


@dataclass
class Served:
    url: str
    app: Any
    alice: Principal
    alice_headers: dict[str, str]
    bob_headers: dict[str, str]
    experiment_id: int
    trial_id: int
    trial_token: str

    def held(self, principal: Principal) -> int:
        return int(self.app.state.det.streams.held(principal))


@pytest.fixture
def start(engine: Engine, sessions: sessionmaker[Session]) -> Iterator[Callable[..., Served]]:
    servers: list[tuple[Any, threading.Thread]] = []

    def make(**security: Any) -> Served:
        url = engine.url.render_as_string(hide_password=False)
        config: MasterConfig = parse_master_config({"db": {"url": url}, "security": security}, env={})
        app = create_app(config, engine=engine)
        with transaction(sessions) as s:
            alice = seed_user(s, "alice", "alice-pw")
            seed_user(s, "bob", "bob-pw")
            experiment, trials = seed_experiment(s, alice, name="e", trials=1, points=5, state="ACTIVE")
            token = mint_trial_token(s, trials[0])
        port = free_port()
        servers.append(serve(app, port))
        base = f"http://127.0.0.1:{port}"

        def login(username: str) -> dict[str, str]:
            r = httpx.post(
                f"{base}/api/v1/auth/login", json={"username": username, "password": f"{username}-pw"}
            )
            assert r.status_code == 200, r.text
            return {"Authorization": f"Bearer {r.json()['token']}"}

        return Served(
            base,
            app,
            Principal(alice, "alice", False),
            login("alice"),
            login("bob"),
            experiment,
            trials[0],
            token,
        )

    yield make
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


def _send_get(url: str, path: str, headers: dict[str, str]) -> socket.socket:
    """A GET whose answer nobody reads: the stream stays open until the socket closes."""
    parts = httpx.URL(url)
    sock = socket.create_connection((parts.host, parts.port or 80), timeout=10)
    lines = [f"GET {path} HTTP/1.1", f"Host: {parts.host}", *(f"{k}: {v}" for k, v in headers.items())]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return sock


def test_streams_reads_never_take_the_threads_of_other_requests(
    start: Callable[..., Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    """50 streams whose reads block (more than the 40 threads of the synchronous routes): another user's
    ``/me`` still answers, and at most ``STREAM_THREADS`` reads run at once."""
    from hpc_master.services.curves.experiment import ExperimentCurves

    served = start()  # 50 streams: under the default cap (64)
    release = threading.Event()
    blocked: list[int] = []

    def stuck(self: ExperimentCurves, tx: Any) -> int:
        blocked.append(1)
        release.wait(30)
        return 0

    monkeypatch.setattr(ExperimentCurves, "refresh", stuck)
    path = f"/api/v1/experiments/{served.experiment_id}/metrics-stream/metric-names?periodSeconds=0"
    socks = [_send_get(served.url, path, served.alice_headers) for _ in range(50)]
    try:
        deadline = time.monotonic() + 10
        while len(blocked) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # any more reads that were going to start have started
        started = time.monotonic()
        me = httpx.get(f"{served.url}/api/v1/me", headers=served.bob_headers, timeout=5)
        assert me.status_code == 200
        assert time.monotonic() - started < 2

        from hpc_master.api.streams import STREAM_THREADS

        assert len(blocked) == STREAM_THREADS
    finally:
        release.set()
        for sock in socks:
            sock.close()


def test_a_stream_that_fails_gives_its_slot_back(
    start: Callable[..., Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpc_master.services import logs

    served = start()
    calls: list[int] = []

    def failing(*_args: Any, **_kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("the disk went away")
        return [], False

    monkeypatch.setattr(logs, "read_new_lines", failing)
    with httpx.stream(
        "GET", f"{served.url}/api/v1/trials/{served.trial_id}/logs?follow=true", headers=served.alice_headers
    ) as r:
        assert r.status_code == 200
        assert served.held(served.alice) == 1
        with pytest.raises(httpx.HTTPError):
            r.read()  # the server broke the stream off
    deadline = time.monotonic() + 5
    while served.held(served.alice) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.held(served.alice) == 0


def test_a_trials_long_polls_are_capped_per_trial_not_against_its_owner(
    start: Callable[..., Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpc_master.api import routes_allocations

    monkeypatch.setattr(routes_allocations, "PREEMPTION_POLL_S", 0.5)  # a poll notices its client went sooner
    served = start(max_streams_per_user=2, max_long_polls_per_trial=2)
    harness = {"Authorization": f"Bearer {served.trial_token}"}
    poll = f"/api/v1/allocations/{served.trial_id}.1/signals/preemption?timeoutSeconds=30"
    socks = [_send_get(served.url, poll, harness) for _ in range(2)]
    try:
        deadline = time.monotonic() + 10
        trial = Principal(served.alice.user_id, "alice", False, trial_id=served.trial_id)
        while served.held(trial) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = httpx.get(f"{served.url}{poll}", headers=harness, timeout=10)
        assert refused.status_code == 429
        assert "security.max_long_polls_per_trial" in refused.json()["message"]
        assert served.held(served.alice) == 0  # the owner's streams are untouched
        changes = "/api/v1/webui/changes"
        owner = [_send_get(served.url, changes, served.alice_headers) for _ in range(2)]
        socks += owner
        while served.held(served.alice) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (
            httpx.get(f"{served.url}{changes}", headers=served.alice_headers, timeout=10).status_code == 429
        )
    finally:
        for sock in socks:
            sock.close()
    deadline = time.monotonic() + 10  # a poll notices its client went when it next wakes
    while (served.held(trial) or served.held(served.alice)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert served.held(trial) == served.held(served.alice) == 0


# ---------------------------------------------------------------- the response, at the ASGI level


def _slots(cap: int = 1) -> Any:
    from hpc_master.api.streams import StreamSlots

    return StreamSlots(per_user=cap, per_trial=cap)


ALICE = Principal(user_id=7, username="alice", admin=False)


async def _serve_once(
    response: Any, spec_version: str, disconnect_after_first_chunk: bool, fail_send: bool = False
) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    first_chunk = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if disconnect_after_first_chunk:
            await first_chunk.wait()
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # the client stays
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        if fail_send and message.get("body"):
            raise OSError("connection reset")
        sent.append(message)
        if message.get("body"):
            first_chunk.set()

    scope = {"type": "http", "asgi": {"spec_version": spec_version}, "method": "GET", "headers": []}
    await response(scope, receive, send)
    return sent


def test_the_slot_is_released_when_the_stream_ends_the_client_goes_or_the_server_fails() -> None:
    from starlette.requests import ClientDisconnect

    from hpc_master.api.streams import TooManyStreamsError, open_stream

    async def finite() -> AsyncIterator[bytes]:
        yield b"one\n"

    async def endless() -> AsyncIterator[bytes]:
        while True:
            yield b"tick\n"
            await asyncio.sleep(3600)

    async def failing() -> AsyncIterator[bytes]:
        yield b"one\n"
        raise RuntimeError("the database went away")

    slots = _slots()
    # Ends: the whole body is sent, then the slot is free.
    response = open_stream(slots, ALICE, finite())
    with pytest.raises(TooManyStreamsError):
        open_stream(slots, ALICE, finite())
    sent = asyncio.run(_serve_once(response, "2.3", disconnect_after_first_chunk=False))
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert slots.held(ALICE) == 0
    # The client goes (ASGI 2.3: the disconnect message; 2.4: sending fails).
    response = open_stream(slots, ALICE, endless())
    asyncio.run(_serve_once(response, "2.3", disconnect_after_first_chunk=True))
    assert slots.held(ALICE) == 0
    response = open_stream(slots, ALICE, endless())
    with pytest.raises(ClientDisconnect):
        asyncio.run(_serve_once(response, "2.4", disconnect_after_first_chunk=False, fail_send=True))
    assert slots.held(ALICE) == 0
    # The server fails mid-stream.
    response = open_stream(slots, ALICE, failing())
    with pytest.raises(RuntimeError):
        asyncio.run(_serve_once(response, "2.3", disconnect_after_first_chunk=False))
    assert slots.held(ALICE) == 0
    # A response that is never sent (an error after the route) gives its slot back when it is collected.
    response = open_stream(slots, ALICE, finite())
    del response
    assert slots.held(ALICE) == 0


def test_caps_count_users_and_trials_apart_and_releases_are_idempotent() -> None:
    from hpc_master.api.streams import TooManyStreamsError, long_poll

    slots = _slots(cap=2)
    bob = Principal(user_id=8, username="bob", admin=False)
    harness = Principal(user_id=7, username="alice", admin=False, trial_id=3)
    first, second = slots.acquire(ALICE), slots.acquire(ALICE)
    with pytest.raises(TooManyStreamsError) as refused:
        slots.acquire(ALICE)
    assert refused.value.http_status == 429 and refused.value.retry_after_s > 0
    assert "security.max_streams_per_user: 2" in refused.value.message
    with long_poll(slots, harness), long_poll(slots, harness), long_poll(slots, bob):  # none is alice's
        assert (slots.held(harness), slots.held(bob)) == (2, 1)
        with pytest.raises(TooManyStreamsError, match="max_long_polls_per_trial"):
            slots.acquire(harness)
    assert slots.held(harness) == slots.held(bob) == 0
    first.release()
    first.release()  # twice: still one slot back, not two
    assert slots.held(ALICE) == 1
    second.release()
    assert slots.held(ALICE) == 0
