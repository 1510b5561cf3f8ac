"""``GET /api/v1/master/logs`` (Determined's ``MasterLogs``, ``det master logs``): the master's recent log from
memory, admins only, Determined's offset/limit/follow semantics."""

from __future__ import annotations

import json
import logging
import threading
import time

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.master_log import MasterLog
from hpc_master.services.users import mint_trial_token
from tests.master.helpers import login, make_user, seed_trial


def _ring(capacity: int = 100) -> tuple[MasterLog, logging.Logger]:
    ring = MasterLog(capacity)
    logger = logging.getLogger(f"test-master-log-{id(ring)}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(ring)
    return ring, logger


def _entries(text: str) -> list[dict[str, object]]:
    return [json.loads(line)["result"]["logEntry"] for line in text.splitlines() if line.strip()]


def test_the_ring_keeps_the_last_entries_with_levels_and_ids() -> None:
    ring, log = _ring(capacity=3)
    for i in range(5):
        log.info("line %d", i)
    log.warning("careful")
    got = ring.read()
    assert [e.message.split(": ", 1)[1] for e in got] == ["line 3", "line 4", "careful"]
    assert [e.id for e in got] == [4, 5, 6] and got[-1].level == "LOG_LEVEL_WARNING"
    assert got[0].timestamp.endswith("Z")
    assert [e.id for e in ring.read(offset=-2)] == [5, 6]
    assert [e.id for e in ring.read(offset=1, limit=1)] == [5]
    assert [e.id for e in ring.read(after_id=5)] == [6]


def test_admins_only(client: TestClient, sessions: sessionmaker[Session]) -> None:
    admin = login(client)
    bob = make_user(client, admin, "bob")
    assert client.get("/api/v1/master/logs").status_code == 401
    r = client.get("/api/v1/master/logs", headers=bob)
    assert r.status_code == 403 and r.json()["code"] == "permission_denied"
    with sessions() as s, s.begin():
        trial_token = mint_trial_token(s, seed_trial(sessions, "carol"))
    r = client.get("/api/v1/master/logs", headers={"Authorization": f"Bearer {trial_token}"})
    assert r.status_code in (401, 403)
    for bad in ("limit=-1", "offset=-1000001", "limit=99999999999"):
        r = client.get(f"/api/v1/master/logs?{bad}", headers=admin)
        assert r.status_code == 400 and r.json()["field"] == bad.split("=")[0], r.text


def test_tail_limit_and_follow(client: TestClient) -> None:
    ring, log = _ring()
    client.app.state.master_log = ring  # type: ignore[attr-defined]
    admin = login(client)
    for i in range(10):
        log.info("entry %d", i)
    tail = _entries(client.get("/api/v1/master/logs?offset=-3", headers=admin).text)
    assert [e["message"] for e in tail] == [f"{log.name}: entry {i}" for i in (7, 8, 9)]
    assert {"id", "level", "message", "timestamp"} == set(tail[0]) and tail[0]["level"] == "LOG_LEVEL_INFO"
    assert len(_entries(client.get("/api/v1/master/logs?limit=4", headers=admin).text)) == 4

    def later() -> None:
        time.sleep(0.5)
        log.error("appeared while following")

    threading.Thread(target=later).start()
    # follow=true with a limit ends once the limit is reached: the last old entry, then the new one.
    r = client.get("/api/v1/master/logs?follow=true&offset=-1&limit=2", headers=admin)
    got = _entries(r.text)
    assert [e["message"] for e in got] == [f"{log.name}: entry 9", f"{log.name}: appeared while following"]
    assert got[1]["level"] == "LOG_LEVEL_ERROR"
