"""The web UI's change streams (``routes_ui_live``): who may open them, their bounds, and that a committed
change reaches an open stream within 2 s while nothing else does (heartbeats aside); one reader per watched
thing, no database connection held between reads, and the stream ends with its client or its session.

A real server (uvicorn on loopback, on SQLite and PostgreSQL): the test client cannot read an endless stream.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, delete, update
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.api import routes_ui_live
from hpc_master.api.app import create_app
from hpc_master.db.engine import transaction
from hpc_master.db.models import (
    CheckpointModel,
    ExperimentModel,
    SessionModel,
    TrialModel,
    TrialRunModel,
)
from hpc_master.masterconf import MasterConfig
from hpc_master.services.metrics import MetricReport, ingest_metrics
from hpc_master.services.users import mint_trial_token
from tests.webui.conftest import free_port, serve
from tests.webui.seed import seed_experiment, seed_user

LIVE_S = 2.0  # a committed change reaches an open stream within this


@dataclass
class Live:
    url: str
    app: Any
    engine: Engine
    sessions: sessionmaker[Session]
    data: dict[str, Any] = field(default_factory=dict)

    def login(self, username: str, password: str) -> dict[str, str]:
        r = httpx.post(f"{self.url}/api/v1/auth/login", json={"username": username, "password": password})
        assert r.status_code == 200, r.text
        return {"Authorization": f"Bearer {r.json()['token']}"}

    def hubs(self) -> dict[Any, Any]:
        return dict(getattr(self.app.state, "live_hubs", {}))


@pytest.fixture
def live(config: MasterConfig, engine: Engine, sessions: sessionmaker[Session]) -> Iterator[Live]:
    app = create_app(config, engine=engine)
    with transaction(sessions) as s:
        alice = seed_user(s, "alice", "alice-pw")
        bob = seed_user(s, "bob", "bob-pw")
        asha, asha_trials = seed_experiment(s, alice, name="asha", trials=4, points=50, asha=True)
        single, single_trials = seed_experiment(s, bob, name="single", trials=1, points=20, state="ACTIVE")
        trial_token = mint_trial_token(s, asha_trials[0])
    port = free_port()
    server, thread = serve(app, port)
    try:
        yield Live(
            url=f"http://127.0.0.1:{port}",
            app=app,
            engine=engine,
            sessions=sessions,
            data={
                "asha": asha,
                "asha_trials": asha_trials,
                "single": single,
                "single_trials": single_trials,
                "trial_token": trial_token,
            },
        )
    finally:
        server.should_exit = True
        thread.join(10)


class Listener:
    """Reads one change stream in a thread, on a plain socket that ``close()`` shuts at once (as a browser
    does when a page is left): ``next()`` is the stream's next message (``{}`` for a heartbeat)."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.lines: queue.Queue[dict[str, Any] | BaseException | None] = queue.Queue()
        self.status: int | None = None
        parts = httpx.URL(url)
        self._sock = socket.create_connection((parts.host, parts.port or 80), timeout=30)
        self._sock.settimeout(None)
        request = [f"GET {parts.raw_path.decode()} HTTP/1.1", f"Host: {parts.host}", "Connection: close"]
        request += [f"{k}: {v}" for k, v in headers.items()]
        self._sock.sendall(("\r\n".join(request) + "\r\n\r\n").encode())
        self._file = self._sock.makefile("rb")
        status_line = self._file.readline().decode()
        self.status = int(status_line.split()[1])
        self.headers: dict[str, str] = {}
        while (line := self._file.readline().decode().strip()) != "":
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        """Chunked transfer encoding, then newline-delimited JSON."""
        buffered = b""
        try:
            while size := int(self._file.readline().strip() or b"0", 16):
                buffered += self._file.read(size)
                self._file.readline()
                while b"\n" in buffered:
                    line, buffered = buffered.split(b"\n", 1)
                    self.lines.put(json.loads(line)["result"] if line.strip() else {})
            self.lines.put(None)  # the server ended it
        except (OSError, ValueError) as exc:  # closed by the test
            self.lines.put(exc)

    def next(self, timeout_s: float) -> dict[str, Any] | None:
        """The next message, or None when the stream ended; ``queue.Empty`` after ``timeout_s``."""
        item = self.lines.get(timeout=timeout_s)
        if isinstance(item, BaseException):
            raise item
        return item

    def quiet(self, seconds: float) -> list[dict[str, Any]]:
        """Every message in the next ``seconds`` (a heartbeat is ``{}``)."""
        got = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                item = self.next(left)
            except queue.Empty:
                break
            assert item is not None, "the stream ended"
            got.append(item)
        return got

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(5)


@pytest.fixture
def listen() -> Iterator[Any]:
    opened: list[Listener] = []

    def make(live: Live, path: str, headers: dict[str, str]) -> Listener:
        listener = Listener(f"{live.url}{path}", headers)
        opened.append(listener)
        return listener

    yield make
    for listener in opened:
        listener.close()


def paths(live: Live) -> list[str]:
    return [
        "/api/v1/webui/changes",
        f"/api/v1/webui/experiments/{live.data['asha']}/changes",
        f"/api/v1/webui/trials/{live.data['asha_trials'][0]}/changes",
    ]


def wait_for(listener: Listener, key: str, timeout_s: float = LIVE_S) -> tuple[dict[str, Any], float]:
    """The first message naming ``key`` (heartbeats skipped), and how long it took."""
    started = time.monotonic()
    while (left := started + timeout_s - time.monotonic()) > 0:
        try:
            message = listener.next(left)
        except queue.Empty:
            break
        assert message is not None, "the stream ended"
        if key in message:
            return message, time.monotonic() - started
    raise AssertionError(f"no change of {key!r} within {timeout_s} s")


# ---------------------------------------------------------------- who may open them, bounds


def test_auth_matrix(live: Live, listen: Any) -> None:
    """No token: 401; a per-trial token: 403; another user: what ``GET /experiments/{id}`` answers them
    (the team may look: 200); the session cookie, without a CSRF header (a read)."""
    trial = {"Authorization": f"Bearer {live.data['trial_token']}"}
    bob = live.login("bob", "bob-pw")
    assert httpx.get(f"{live.url}/api/v1/experiments/{live.data['asha']}", headers=bob).status_code == 200
    for path in paths(live):
        r = httpx.get(f"{live.url}{path}")
        assert r.status_code == 401 and r.json()["code"] == "unauthenticated", (path, r.text)
        r = httpx.get(f"{live.url}{path}", headers={"Authorization": "Bearer not-a-token"})
        assert r.status_code == 401, path
        r = httpx.get(f"{live.url}{path}", headers=trial)
        assert r.status_code == 403 and r.json()["code"] == "permission_denied", (path, r.text)
        stream = listen(live, path, bob)
        assert stream.status == 200 and stream.headers["content-type"] == "application/x-ndjson"
        assert stream.next(LIVE_S)  # the first message: every digest
    r = httpx.post(
        f"{live.url}/api/v1/auth/login?cookie=true", json={"username": "alice", "password": "alice-pw"}
    )
    assert r.status_code == 200
    cookie = "; ".join(f"{k}={v}" for k, v in r.cookies.items())
    stream = listen(live, paths(live)[1], {"Cookie": cookie})  # a read: no CSRF header needed
    assert stream.status == 200 and stream.headers["cache-control"] == "no-cache"
    assert stream.headers["connection"] == "close"  # an aborted stream is closed, not drained for reuse
    first = stream.next(LIVE_S)
    assert first is not None
    assert set(first) == {"experiment", "trialStates", "trials", "runs", "checkpoints", "validations"}


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/v1/webui/experiments/999/changes", 404),
        ("/api/v1/webui/trials/999/changes", 404),
        ("/api/v1/webui/experiments/0/changes", 400),
        ("/api/v1/webui/experiments/-1/changes", 400),
        ("/api/v1/webui/experiments/2147483648/changes", 400),
        ("/api/v1/webui/trials/99999999999999999999/changes", 400),
        ("/api/v1/webui/trials/abc/changes", 400),
    ],
)
def test_unknown_and_out_of_bounds_ids(live: Live, path: str, status: int) -> None:
    r = httpx.get(f"{live.url}{path}", headers=live.login("alice", "alice-pw"))
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == ("not_found" if status == 404 else "invalid_argument") and body["message"]


# ---------------------------------------------------------------- what they say, and when


@pytest.mark.storage  # the change digests' queries
def test_experiment_stream_says_what_changed_and_nothing_else(live: Live, listen: Any) -> None:
    exp, trials = live.data["asha"], live.data["asha_trials"]
    stream = listen(live, f"/api/v1/webui/experiments/{exp}/changes", live.login("alice", "alice-pw"))
    first = stream.next(LIVE_S)
    assert first is not None and all(isinstance(v, str) and v for v in first.values())
    assert stream.quiet(1.5) == []  # nothing changed: nothing said

    # A state change written without a version bump, as some writers do.
    with transaction(live.sessions) as s:
        s.execute(update(TrialModel).where(TrialModel.id == trials[1]).values(state="ERROR"))
    message, took = wait_for(stream, "trials")
    assert set(message) == {"trials", "trialStates"} and took < LIVE_S

    with transaction(live.sessions) as s:
        s.add(
            CheckpointModel(uuid="c0ffee00-0000-0000-0000-000000000001", trial_id=trials[0], trial_run_id=1)
        )
    message, _ = wait_for(stream, "checkpoints")
    assert set(message) == {"checkpoints"}

    with transaction(live.sessions) as s:
        s.execute(update(ExperimentModel).where(ExperimentModel.id == exp).values(state="PAUSED"))
    message, _ = wait_for(stream, "experiment")
    assert set(message) == {"experiment"}

    with transaction(live.sessions) as s:
        run = s.query(TrialRunModel).filter_by(trial_id=trials[2]).one()
        run.node_list = "det-node9"
    message, _ = wait_for(stream, "runs")
    assert set(message) == {"runs"}

    # A validation at a step already reported: only the metrics table changes.
    with transaction(live.sessions) as s:
        ingest_metrics(
            s, trials[0], [MetricReport(2, 10, "validation", {"avgMetrics": {"validation_loss": 9.0}})]
        )
    message, _ = wait_for(stream, "validations")
    assert set(message) == {"validations"}
    # A training report raises the trial's steps: the trials table changes, not the validations.
    with transaction(live.sessions) as s:
        ingest_metrics(s, trials[0], [MetricReport(2, 999_999, "training", {"avgMetrics": {"loss": 0.1}})])
    message, _ = wait_for(stream, "trials")
    assert "validations" not in message
    assert stream.quiet(1.0) == []


@pytest.mark.storage  # the change digests' queries
def test_trial_stream(live: Live, listen: Any) -> None:
    trial = live.data["single_trials"][0]
    stream = listen(live, f"/api/v1/webui/trials/{trial}/changes", live.login("alice", "alice-pw"))
    first = stream.next(LIVE_S)
    assert first is not None and set(first) == {"trial", "runs", "checkpoints", "metrics"}
    with transaction(live.sessions) as s:
        s.add(TrialRunModel(trial_id=trial, run_number=2, state="PENDING"))
    message, took = wait_for(stream, "runs")
    assert set(message) == {"runs"} and took < LIVE_S
    with transaction(live.sessions) as s:
        ingest_metrics(s, trial, [MetricReport(1, 25, "validation", {"avgMetrics": {"x": 1.0}})])
    message, _ = wait_for(stream, "metrics")
    assert set(message) == {"metrics"}
    with transaction(live.sessions) as s:
        ingest_metrics(
            s, live.data["asha_trials"][0], [MetricReport(2, 5, "training", {"avgMetrics": {"x": 1.0}})]
        )
    assert stream.quiet(1.2) == []  # another trial's metrics
    with transaction(live.sessions) as s:
        s.execute(update(TrialModel).where(TrialModel.id == trial).values(state="PAUSED"))
    message, _ = wait_for(stream, "trial")
    assert set(message) == {"trial"}


@pytest.mark.storage  # the change digests' queries
def test_list_stream(live: Live, listen: Any) -> None:
    stream = listen(live, "/api/v1/webui/changes", live.login("bob", "bob-pw"))
    assert set(stream.next(LIVE_S) or {}) == {"experiments", "trials"}
    with transaction(live.sessions) as s:
        s.execute(
            update(ExperimentModel).where(ExperimentModel.id == live.data["single"]).values(progress=0.9)
        )
    message, took = wait_for(stream, "experiments")
    assert set(message) == {"experiments"} and took < LIVE_S
    with transaction(live.sessions) as s:
        s.add(TrialModel(experiment_id=live.data["single"], request_id="r", hparams={}, state="ACTIVE"))
    message, _ = wait_for(stream, "trials")
    assert set(message) == {"trials"}


@pytest.mark.storage  # the change digests' queries
def test_digests_are_the_same_for_every_stream_and_reconnection(live: Live, listen: Any) -> None:
    """A browser compares what it saw before a reconnection with what it sees after."""
    path = f"/api/v1/webui/experiments/{live.data['asha']}/changes"
    headers = live.login("alice", "alice-pw")
    one = listen(live, path, headers)
    first = one.next(LIVE_S)
    two = listen(live, path, live.login("bob", "bob-pw"))
    assert two.next(LIVE_S) == first
    one.close()
    two.close()
    deadline = time.monotonic() + 5
    while live.hubs() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not live.hubs()
    assert listen(live, path, headers).next(LIVE_S) == first  # a new reader, the same digests


# ---------------------------------------------------------------- resources


def test_one_reader_per_thing_no_connection_held_and_closed_with_the_client(live: Live, listen: Any) -> None:
    path = f"/api/v1/webui/experiments/{live.data['asha']}/changes"
    streams = [listen(live, path, live.login("alice", "alice-pw")) for _ in range(3)]
    for s in streams:
        assert s.next(LIVE_S)
    (hub,) = live.hubs().values()
    assert hub.listeners == 3
    pool: Any = live.engine.pool
    held = []
    for _ in range(20):  # between reads, no connection is checked out
        held.append(pool.checkedout())
        time.sleep(0.05)
    assert held.count(0) >= 15, held
    for s in streams:
        s.close()
    deadline = time.monotonic() + 3
    while live.hubs() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not live.hubs() and hub.listeners == 0  # every stream ended, and its reader with it


def test_heartbeat(live: Live, listen: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes_ui_live, "HEARTBEAT_S", 0.3)
    stream = listen(live, "/api/v1/webui/changes", live.login("alice", "alice-pw"))
    # The stream's first message, and heartbeats ({}) every 0.3 s: under load one may come before it (CI saw
    # that), which a client ignores.
    got = stream.quiet(LIVE_S)
    assert any(got) and got.count({}) >= 2, got


def test_stream_ends_with_its_session(live: Live, listen: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes_ui_live, "SESSION_CHECK_S", 0.3)
    headers = live.login("alice", "alice-pw")
    stream = listen(live, f"/api/v1/webui/experiments/{live.data['asha']}/changes", headers)
    assert stream.next(LIVE_S)
    with transaction(live.sessions) as s:
        s.execute(delete(SessionModel))
    live.app.state.det.tokens.clear()
    deadline = time.monotonic() + 3
    while True:
        item = stream.next(max(0.01, deadline - time.monotonic()))
        if item is None:
            break  # ended by the server
    r = httpx.get(f"{live.url}/api/v1/webui/experiments/{live.data['asha']}/changes", headers=headers)
    assert r.status_code == 401


def test_follow_false_sends_every_digest_once_and_ends(live: Live) -> None:
    """For scripts and the API's fuzzing: the first message, then the end of the response."""
    alice = live.login("alice", "alice-pw")
    for path in paths(live):
        started = time.monotonic()
        r = httpx.get(f"{live.url}{path}", params={"follow": "false"}, headers=alice, timeout=10)
        assert r.status_code == 200, (path, r.text)
        lines = [line for line in r.text.splitlines() if line.strip()]
        assert len(lines) == 1 and json.loads(lines[0])["result"], (path, r.text)
        assert time.monotonic() - started < LIVE_S
