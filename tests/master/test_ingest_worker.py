"""The metrics writer's ingest worker (``hpc_master.ingest.worker``), a real child process on a real SQLite
file: it stores plain batches in one transaction per group, hands back what it does not store, and when it
dies the master stores every batch itself, loses none, and starts a new worker later."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.api.app import create_app
from hpc_master.api.deps import AppState
from hpc_master.db.engine import make_engine, make_sessionmaker, transaction
from hpc_master.db.migrate import upgrade_to_head
from hpc_master.db.models import MetricModel, TrialModel
from hpc_master.ingest.worker import FAILED, NOT_PLAIN, OK, IngestWorker
from hpc_master.ingest.writer import MetricsWriter
from hpc_master.masterconf import MasterConfig
from tests.master.helpers import create_experiment, login, seed_trial
from tests.master.test_api import bearer, make_trial


def _body(run: int, steps: range, group: str = "training") -> bytes:
    items = [
        {
            "trialRunId": run,
            "stepsCompleted": s,
            "group": group,
            "metrics": {"avgMetrics": {"loss": 1 / s}},
            "reportTime": "2026-11-23T02:50:00.123456+00:00",
        }
        for s in steps
    ]
    return json.dumps({"metrics": items}).encode()


def _count(sessions: sessionmaker[Session], trial_id: int) -> int:
    with transaction(sessions) as s:
        return int(s.scalar(select(func.count()).where(MetricModel.trial_id == trial_id)) or 0)


@pytest.fixture
def sqlite_file(tmp_path: Path) -> tuple[str, sessionmaker[Session]]:
    path = tmp_path / "master.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade_to_head(engine)
    return str(path), make_sessionmaker(engine)


def test_a_group_is_stored_in_one_transaction_and_what_is_not_plain_comes_back(
    sqlite_file: tuple[str, sessionmaker[Session]],
) -> None:
    path, sessions = sqlite_file
    trial_id = seed_trial(sessions)
    worker = IngestWorker(path)
    try:
        answers = worker.run(
            [
                (trial_id, _body(1, range(1, 101))),
                (trial_id, _body(1, range(91, 111))),  # 91-100 are duplicates
                (trial_id, b'{"metrics": [{"trial_run_id": 1, "steps_completed": 5, "metrics": {}}]}'),
                (trial_id, _body(1, range(200, 201), group="validation")),  # the master's searcher path
            ]
        )
        assert answers == [(OK, 100, 0), (OK, 10, 10), (NOT_PLAIN, 0, 0), (NOT_PLAIN, 0, 0)]
        assert _count(sessions, trial_id) == 110
        with transaction(sessions) as s:
            trial = s.get(TrialModel, trial_id)
            assert trial is not None and trial.steps_completed == 110

        # A group with a batch for a trial that does not exist is rolled back whole: nothing of it is stored,
        # and the master runs each batch again on its own.
        answers = worker.run(
            [(trial_id, _body(1, range(300, 310))), (trial_id + 1000, _body(1, range(1, 3)))]
        )
        assert answers == [(FAILED, 0, 0), (FAILED, 0, 0)]
        assert _count(sessions, trial_id) == 110
        assert worker.run([]) == []
    finally:
        worker.close()
    assert worker.proc.returncode == 0  # it ends at the end of its input


def test_a_worker_that_cannot_start_is_an_error_not_a_hang(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()  # sqlite cannot open a directory as its database
    with pytest.raises(EOFError):
        IngestWorker(str(tmp_path / "dir.db"))


@pytest.fixture
def file_client(tmp_path: Path) -> Any:
    engine: Engine = make_engine(f"sqlite:///{tmp_path / 'master.db'}")
    app = create_app(MasterConfig(), engine=engine)
    with TestClient(app) as client:
        yield client, make_sessionmaker(engine)
    engine.dispose()


def test_when_the_worker_dies_the_master_stores_every_batch_itself_then_starts_a_new_one(
    file_client: tuple[TestClient, sessionmaker[Session]], caplog: pytest.LogCaptureFixture
) -> None:
    client, sessions = file_client
    state: AppState = client.app.state.det  # type: ignore[attr-defined]
    admin = login(client)
    trial_id, token = make_trial(sessions, create_experiment(client, admin))
    url = f"/api/v1/trials/{trial_id}/metrics/batch"
    headers = {**bearer(token), "Content-Type": "application/json"}

    def post(steps: range) -> Any:
        r = client.post(url, headers=headers, content=_body(1, steps))
        assert r.status_code == 200, r.text
        return r.json()

    assert post(range(1, 11)) == {"accepted": 10, "duplicates": 0}  # the route (token not cached yet)
    assert post(range(11, 21)) == {"accepted": 10, "duplicates": 0}
    assert state.writer.worker_groups == 1
    worker = state.writer._worker
    assert worker is not None
    os.kill(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait()

    # The group that finds it dead, and the ones after it, are stored by the master.
    assert post(range(21, 31)) == {"accepted": 10, "duplicates": 0}
    assert post(range(31, 41)) == {"accepted": 10, "duplicates": 0}
    assert "metrics ingest worker failed" in caplog.text
    assert not state.writer.takes_body and state.writer.worker_groups == 1
    assert state.writer.raw_groups >= 1  # in the master's own driver SQL, not the ORM
    assert _count(sessions, trial_id) == 40

    state.writer._worker_retry_at = 0.0  # WORKER_RETRY_S later
    assert post(range(41, 51)) == {"accepted": 10, "duplicates": 0}
    assert state.writer.worker_groups == 2 and state.writer._worker is not worker
    assert _count(sessions, trial_id) == 50


def test_the_masters_own_transactions_wait_for_a_worker_group_in_the_pool_not_in_sqlite(
    sqlite_file: tuple[str, sessionmaker[Session]],
) -> None:
    """The master's other transactions never meet the child's write lock: the writer holds the master's one
    pooled connection while the child stores a group. With SQLite's busy timeout at 0 on that connection, a
    transaction that did meet it would fail at once with "database is locked"."""
    path, sessions = sqlite_file
    trial_id = seed_trial(sessions)
    engine = sessions.kw["bind"]
    pooled = engine.raw_connection()  # the pool's one connection, for the rest of the test
    pooled.driver_connection.execute("PRAGMA busy_timeout=0")
    pooled.close()
    writer = MetricsWriter(sessions, worker_db=path)
    stop = threading.Event()
    done, errors = [0], []

    def other_transactions() -> None:
        while not stop.is_set():
            try:
                with transaction(sessions) as s:
                    s.execute(update(TrialModel).where(TrialModel.id == trial_id).values(restarts=0))
                done[0] += 1
                time.sleep(0.002)  # a busy master, not a tight loop that would starve the writer of the pool
            except OperationalError as e:
                errors.append(e)
                return

    async def stream() -> list[Any]:
        results = []
        for i in range(20):
            batches = [(trial_id, _body(1 + k, range(1 + 100 * i, 101 + 100 * i))) for k in range(4)]
            results += await asyncio.gather(*(writer.run(_unused, 100, body=b) for b in batches))
        return results

    thread = threading.Thread(target=other_transactions)
    thread.start()
    try:
        results = asyncio.run(stream())
    finally:
        stop.set()
        thread.join()
        writer.close()
    assert errors == [] and done[0] > 0
    assert writer.worker_groups > 0 and results == [(100, 0)] * 80
    assert _count(sessions, trial_id) == 8_000


def _unused(_session: Session) -> Any:
    raise AssertionError("every batch here is plain: the worker stores it")
