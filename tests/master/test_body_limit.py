"""The body limit (``api.app.BodyLimit``): bodies are counted while they arrive, and no large or chunked body is
read before its bearer token is checked.

Against a real uvicorn master in a subprocess (the test client does not stream, and the point is the server's
memory), with the limit lowered to 1 MiB so the tests need not send 140 MB; then in-process, at the ASGI
level, for the readers a real server cannot be made to overrun (a body longer than its declared length).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.api.app import ANONYMOUS_BODY_BYTES, create_app
from hpc_master.db.engine import transaction
from hpc_master.masterconf import MasterConfig
from hpc_master.services.users import mint_trial_token
from tests.cli.conftest import running_master
from tests.master.helpers import CONFIG, admin_token, context_file, seed_trial

LIMIT = 1 << 20
"""The lowered ``MAX_BODY_BYTES`` of the subprocess master."""
PASSWORD = "limit-test-pw"
MiB = 1 << 20


@dataclass(frozen=True)
class Master:
    url: str
    pid: int
    token: str

    def peak_rss_mib(self) -> float:
        """The server's peak resident memory so far (VmHWM)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM")

    def headers(self, token: str | None = "own") -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if token is not None:
            headers["authorization"] = f"Bearer {self.token if token == 'own' else token}"
        return headers


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Master]:
    argv = ["tests.master._limited_master", "{port}", str(LIMIT)]
    env = {"DET_ADMIN_PASSWORD": PASSWORD}
    with running_master(tmp_path_factory.mktemp("limited"), argv, env) as m:
        # A login body is small: it needs no token.
        r = httpx.post(f"{m.url}/api/v1/auth/login", json={"username": "admin", "password": PASSWORD})
        assert r.status_code == 200, r.text
        yield Master(m.url, m.proc.pid, r.json()["token"])


class Chunks:
    """A chunked body of `total` bytes, 1 MiB at a time, counting what the client got to send."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.sent = 0
        self._chunk = b" " * MiB

    def __iter__(self) -> Iterator[bytes]:
        while self.sent < self.total:
            self.sent += len(self._chunk)
            yield self._chunk


def _post_chunked(master: Master, path: str, body: Chunks, token: str | None = "own") -> httpx.Response:
    return httpx.post(f"{master.url}{path}", content=iter(body), headers=master.headers(token), timeout=30)


@pytest.mark.parametrize("token", [None, "not-a-token"], ids=["no-token", "bad-token"])
def test_a_chunked_body_without_a_valid_token_is_refused_before_it_is_read(
    master: Master, token: str | None
) -> None:
    before = master.peak_rss_mib()
    body = Chunks(200 * MiB)
    start = time.monotonic()
    r = _post_chunked(master, "/api/v1/experiments", body, token)
    elapsed = time.monotonic() - start
    assert r.status_code == 401, r.text
    assert r.json()["code"] == "unauthenticated" and set(r.json()) == {"code", "message", "field"}
    assert r.headers["connection"] == "close"  # the rest of the body is never read
    assert elapsed < 5
    assert body.sent < 50 * MiB  # what the sockets' buffers took before the server closed
    assert master.peak_rss_mib() - before < 50


def test_a_large_declared_body_without_a_token_is_refused_small_ones_are_read(master: Master) -> None:
    big = b" " * (ANONYMOUS_BODY_BYTES + 1)
    r = httpx.post(f"{master.url}/api/v1/auth/login", content=big, headers=master.headers(None))
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
    small = json.dumps({"username": "admin", "password": "wrong"})
    r = httpx.post(f"{master.url}/api/v1/auth/login", content=small, headers=master.headers(None))
    assert r.status_code == 401 and r.json()["message"] == "invalid credentials"  # read and judged


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/experiments",  # FastAPI's body parsing reads it
        "/api/v1/trials/1/metrics/batch",  # the route reads it (a chunked batch skips the fast path)
        "/api/v1/auth/login",
    ],
)
def test_an_authenticated_chunked_body_over_the_limit_gets_413_while_it_is_read(
    master: Master, path: str
) -> None:
    before = master.peak_rss_mib()
    body = Chunks(40 * LIMIT)
    r = _post_chunked(master, path, body)
    assert r.status_code == 413, r.text
    assert r.json() == {
        "code": "payload_too_large",
        "message": "request body is larger than 1 MB",
        "field": None,
    }
    assert r.headers["connection"] == "close"
    assert body.sent < 20 * LIMIT
    assert master.peak_rss_mib() - before < 50


def test_a_body_declared_over_the_limit_is_refused_unread(master: Master) -> None:
    r = httpx.post(
        f"{master.url}/api/v1/experiments", content=b" " * (LIMIT + 1), headers=master.headers(), timeout=30
    )
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"


def test_authenticated_bodies_under_the_limit_still_work(master: Master) -> None:
    create = {"config": CONFIG, "modelDefinition": [context_file("train.py", b"x" * 300_000)]}
    payload = json.dumps(create).encode()
    assert ANONYMOUS_BODY_BYTES < len(payload) < LIMIT
    r = httpx.post(f"{master.url}/api/v1/experiments", content=payload, headers=master.headers())
    assert r.status_code == 200, r.text

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(payload), 65_536):
            yield payload[start : start + 65_536]

    r = httpx.post(f"{master.url}/api/v1/experiments", content=chunks(), headers=master.headers())
    assert r.status_code == 200, r.text
    assert r.json()["experiment"]["id"] >= 2


# In-process, at the ASGI level: a body longer than its declared length (which a real server never hands
# over) is how the readers before the route (the metrics fast path) meet a limit while reading.


async def _asgi(
    app: Any, path: str, headers: dict[str, str], chunks: list[bytes]
) -> tuple[int, dict[str, Any]]:
    messages = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
    }
    await app(scope, receive, send)
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert len(starts) == 1, sent
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return starts[0]["status"], json.loads(body)


@pytest.mark.parametrize(
    "reader",
    ["fast-path", "route-after-fast-path", "fastapi-body-parsing"],
)
def test_a_limit_met_by_any_reader_is_a_413(
    config: MasterConfig, engine: Engine, sessions: sessionmaker[Session], reader: str
) -> None:
    app = create_app(config, engine=engine)
    trial_id = seed_trial(sessions)
    with transaction(sessions) as s:
        trial_token = mint_trial_token(s, trial_id)
    over = b" " * (ANONYMOUS_BODY_BYTES + 1)
    if reader == "fast-path":  # its own read of the body passes the limit
        path, token, chunks = f"/api/v1/trials/{trial_id}/metrics/batch", trial_token, [over]
    elif reader == "route-after-fast-path":  # it hands over what it read; the route's read passes the limit
        path, token, chunks = f"/api/v1/trials/{trial_id}/metrics/batch", trial_token, [b" " * 1000, over]
    else:  # FastAPI turns any error while it reads into a 400 of its own
        path, token, chunks = "/api/v1/experiments", admin_token(sessions), [b" " * 1000, over]
    headers = {
        "content-type": "application/json",
        "content-length": "100",
        "authorization": f"Bearer {token}",
    }
    try:
        status, body = asyncio.run(_asgi(app, path, headers, chunks))
    finally:
        app.state.det.close()
    assert status == 413, body
    assert body == {
        "code": "payload_too_large",
        "message": "request body is larger than 64 KiB",
        "field": None,
    }
