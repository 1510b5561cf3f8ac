"""Group commit for metric batches: one writer thread, one transaction for every batch that waits.

Each ``POST .../metrics/batch`` queues its rows and awaits its future; the writer takes everything queued
while its previous transaction ran (up to ``max_rows``) and commits it at once. A request is answered only
after the commit that holds its rows, so a 2xx still means "durable" (kill -9 loses nothing acknowledged),
while the fixed cost of a transaction (pool checkout, BEGIN IMMEDIATE, COMMIT, a thread-pool hop per
request) is paid once per group instead of once per request. When a group fails (one batch names a trial
that was deleted meanwhile, say), its batches are retried one per transaction, so each request gets its own
answer and one bad batch never fails another's.

On SQLite, a batch may also come with a ``raw`` form of its work: a function of the DBAPI connection (the
plain training-metrics batch of a per-trial token, its rows already encoded by the request). A group whose
batches all have one runs on the pool's connection with driver SQL, ``BEGIN IMMEDIATE`` … ``COMMIT``, and
no ORM session: at 100 rows per batch the session's per-transaction cost was a fifth of the writer's time.
If anything in it fails, it is rolled back and the group runs again the ordinary way, which gives each
batch its own answer (the work is idempotent).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction

Apply = Callable[[Session], Any]
RawApply = Callable[[Any], Any]
"""The same work as an ``Apply``, on a SQLite DBAPI connection inside the writer's transaction."""


@dataclass
class _Job:
    apply: Apply
    rows: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    raw: RawApply | None = None


def _resolve(job: _Job, result: Any = None, error: BaseException | None = None) -> None:
    def settle() -> None:
        if job.future.done():  # the request went away (client disconnected): nothing to answer
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)

    job.loop.call_soon_threadsafe(settle)


class MetricsWriter:
    def __init__(self, sessions: sessionmaker[Session], *, max_rows: int = 5000) -> None:
        self._sessions = sessions
        bind = sessions.kw.get("bind")
        self._raw_engine: Engine | None = (
            bind if isinstance(bind, Engine) and bind.dialect.name == "sqlite" else None
        )
        self._max_rows = max_rows
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.groups = 0  # transactions committed (for tests and benchmarks)
        self.rows = 0  # metric rows in them (the WAL checkpointer's cue)
        self.raw_groups = 0  # of which on the DBAPI connection

    @property
    def takes_raw(self) -> bool:
        """Whether ``run(..., raw=...)`` can use the raw form (SQLite)."""
        return self._raw_engine is not None

    async def run(self, apply: Apply, rows: int, raw: RawApply | None = None) -> Any:
        """Run ``apply(session)`` (or ``raw(dbapi_connection)``) in a group transaction; returns its result
        once committed."""
        self._ensure_started()
        loop = asyncio.get_running_loop()
        job = _Job(apply, rows, loop, loop.create_future(), raw if self.takes_raw else None)
        self._queue.put(job)
        return await job.future

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=30)

    def _ensure_started(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="metrics-writer", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            group, rows, stop = [first], first.rows, False
            while rows < self._max_rows:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                group.append(job)
                rows += job.rows
            self._commit(group)
            if stop:
                return

    def _commit(self, group: list[_Job]) -> None:
        if self._raw_engine is not None and all(job.raw is not None for job in group):
            results = self._commit_raw(self._raw_engine, group)
            if results is not None:
                self.groups += 1
                self.raw_groups += 1
                self.rows += sum(job.rows for job in group)
                for job, result in zip(group, results, strict=True):
                    _resolve(job, result)
                return
        try:
            with transaction(self._sessions) as session:
                results = [job.apply(session) for job in group]
        except Exception as e:  # every error goes back to its own request
            if len(group) == 1:
                _resolve(group[0], error=e)
            else:
                for job in group:  # isolate the failing batch: each one in its own transaction
                    self._commit([job])
            return
        self.groups += 1
        self.rows += sum(job.rows for job in group)
        for job, result in zip(group, results, strict=True):
            _resolve(job, result)

    def _commit_raw(self, engine: Engine, group: list[_Job]) -> list[Any] | None:
        """The group on the pool's SQLite connection; None (rolled back) if anything failed."""
        pooled = engine.raw_connection()
        try:
            dbapi = pooled.driver_connection
            assert dbapi is not None
            dbapi.execute("BEGIN IMMEDIATE")
            try:
                results = [job.raw(dbapi) for job in group if job.raw is not None]
                dbapi.execute("COMMIT")
            except Exception:
                if dbapi.in_transaction:
                    dbapi.execute("ROLLBACK")
                return None
            return results
        finally:
            pooled.close()  # back to the pool
