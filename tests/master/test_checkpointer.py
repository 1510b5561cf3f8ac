"""SQLite WAL checkpoints run on the master's own thread, not inside the metrics writer's commits."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.api.deps import AppState
from hpc_master.db.checkpointer import WalCheckpointer, sqlite_file
from hpc_master.db.engine import SQLITE_AUTOCHECKPOINT_PAGES, make_engine
from tests.master.helpers import create_experiment, login
from tests.master.test_api import bearer, make_trial


def _wal_frames(path: str) -> int:
    """Frames in the WAL that no checkpoint has copied yet (a read-only look: PASSIVE copies nothing new
    while we hold no lock, but reports the log's size and progress)."""
    with sqlite3.connect(path) as conn:
        _busy, log, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return int(log) - int(copied)


def test_the_master_checkpoints_the_wal_in_the_background(
    client: TestClient, sessions: sessionmaker[Session], engine: Engine
) -> None:
    path = sqlite_file(engine)
    if path is None:
        pytest.skip("PostgreSQL has no WAL file to checkpoint")
    state: AppState = client.app.state.det  # type: ignore[attr-defined]
    assert state.checkpointer is not None and state.checkpointer.path == path
    with engine.connect() as conn:  # the connections' own checkpoint is only a backstop now
        autockpt = conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar()
    assert autockpt == SQLITE_AUTOCHECKPOINT_PAGES
    checkpointer = state.checkpointer
    checkpointer.rows_per_checkpoint, checkpointer.max_interval_s = 4000, 3600.0
    admin = login(client)
    trial_id, token = make_trial(sessions, create_experiment(client, admin))
    url = f"/api/v1/trials/{trial_id}/metrics/batch"

    def post(start: int, rows: int) -> None:
        items = [
            {
                "trialRunId": 1,
                "stepsCompleted": s,
                "metrics": {"avgMetrics": {"loss": 1 / (s + 1), "pad": "x" * 200}},
            }
            for s in range(start, start + rows)
        ]
        assert client.post(url, headers=bearer(token), json={"metrics": items}).status_code == 200

    for start in range(0, 2000, 500):
        post(start, 500)
    time.sleep(1.0)  # four polls: too few rows yet to be worth a checkpoint (and its fsync)
    assert checkpointer.checkpoints == 0
    for start in range(2000, 5000, 500):
        post(start, 500)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and checkpointer.checkpoints == 0:
        time.sleep(0.05)
    assert checkpointer.checkpoints > 0
    # Well below the backstop's threshold, every page written is already back in the database file.
    assert Path(path + "-wal").stat().st_size < SQLITE_AUTOCHECKPOINT_PAGES * 4096
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _wal_frames(path) > 0:
        time.sleep(0.05)
    assert _wal_frames(path) == 0


def test_no_checkpointer_for_postgres_or_memory() -> None:
    assert sqlite_file(create_engine("sqlite://")) is None
    assert sqlite_file(make_engine("postgresql+psycopg://u@127.0.0.1:1/x")) is None


def test_a_pass_copies_what_the_wal_holds(tmp_path: Path) -> None:
    path = str(tmp_path / "x.db")
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")  # only our checkpointer copies pages back
    writer.execute("CREATE TABLE t (x TEXT)")
    writer.executemany("INSERT INTO t VALUES (?)", [("y" * 100,)] * 2000)
    checkpointer = WalCheckpointer(path)
    with sqlite3.connect(path, isolation_level=None) as conn:
        log, copied = checkpointer.checkpoint(conn)
    assert log > 0 and copied == log and checkpointer.checkpoints == 1
    writer.close()
