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

On a SQLite file, a batch may instead come as its ``body`` (a per-trial token's batch, not yet parsed): the
writer sends those to a child process (``ingest.worker``) that parses and stores them on its own interpreter
lock, and runs the ones it did not store (not the plain form, or a failed group) the ordinary way. If the
child cannot be started or dies, the writer stores everything itself and tries a new child after
``WORKER_RETRY_S``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.ingest.worker import OK, IngestWorker

log = logging.getLogger(__name__)

WORKER_RETRY_S = 30.0
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
    body: tuple[int, bytes] | None = None
    """(trial id, request body): the batch for the ingest worker."""


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
    def __init__(
        self, sessions: sessionmaker[Session], *, max_rows: int = 5000, worker_db: str | None = None
    ) -> None:
        self._sessions = sessions
        bind = sessions.kw.get("bind")
        self._raw_engine: Engine | None = (
            bind if isinstance(bind, Engine) and bind.dialect.name in ("sqlite", "postgresql") else None
        )
        self.raw_dialect = self._raw_engine.dialect.name if self._raw_engine is not None else None
        """Which driver SQL a batch's ``raw`` form must be (``sqlite_ingest_raw`` or ``pg_ingest_raw``)."""
        self._max_rows = max_rows
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.groups = 0  # transactions committed (for tests and benchmarks)
        self.rows = 0  # metric rows in them (the WAL checkpointer's cue)
        self.raw_groups = 0  # of which on the DBAPI connection
        self.worker_groups = 0  # groups the ingest worker stored (some of their batches, at least)
        self._worker_db = worker_db
        self._worker: IngestWorker | None = None
        self._worker_retry_at = 0.0

    @property
    def takes_raw(self) -> bool:
        """Whether ``run(..., raw=...)`` can use the raw form (SQLite, PostgreSQL through psycopg)."""
        return self._raw_engine is not None

    @property
    def takes_body(self) -> bool:
        """Whether ``run(..., body=...)`` can hand the batch to the ingest worker (a SQLite file, and no
        worker failure in the last ``WORKER_RETRY_S``)."""
        return (
            self._worker_db is not None
            and self.raw_dialect == "sqlite"
            and time.monotonic() >= self._worker_retry_at
        )

    async def run(
        self, apply: Apply, rows: int, raw: RawApply | None = None, body: tuple[int, bytes] | None = None
    ) -> Any:
        """Run ``apply(session)`` (or ``raw(dbapi_connection)``, or the ingest worker on ``body``, whose
        result is ``(accepted, duplicates)``) in a group transaction; returns its result once committed."""
        self._ensure_started()
        loop = asyncio.get_running_loop()
        job = _Job(
            apply,
            rows,
            loop,
            loop.create_future(),
            raw if self.takes_raw else None,
            body if self.takes_body else None,
        )
        self._queue.put(job)
        return await job.future

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=30)
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def start(self, *, worker: bool = False) -> None:
        """Start the writer's thread now rather than at the first batch, and with ``worker``, its ingest
        worker too (the server does, so that its first batches do not wait ~0.5 s for the child to start)."""
        self._ensure_started(worker)

    def _ensure_started(self, worker: bool = False) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, args=(worker,), name="metrics-writer", daemon=True
                )
                self._thread.start()

    def _loop(self, worker: bool) -> None:
        if worker and self.takes_body:
            self._worker_run([])  # starts it
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
        if any(job.body is not None for job in group):
            group = self._commit_worker(group)
            if not group:
                return
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

    def _commit_worker(self, group: list[_Job]) -> list[_Job]:
        """The group's ``body`` batches through the ingest worker; returns the jobs still to run."""
        sent = [job for job in group if job.body is not None]
        rest = [job for job in group if job.body is None]
        answers = self._worker_run([job.body for job in sent if job.body is not None])
        if answers is None:
            return group
        done = [(job, a) for job, a in zip(sent, answers, strict=True) if a[0] == OK]
        rest += [job for job, a in zip(sent, answers, strict=True) if a[0] != OK]
        if done:  # counted before the answers go out, so a caller that got one sees it counted
            self.groups += 1
            self.worker_groups += 1
            self.rows += sum(accepted + duplicates for _, (_, accepted, duplicates) in done)
        for job, (_, accepted, duplicates) in done:
            _resolve(job, (accepted, duplicates))
        return rest

    def _worker_run(self, bodies: list[tuple[int, bytes]]) -> list[tuple[int, int, int]] | None:
        """The worker's answers, or None if it could not be started or failed (then retried later).

        Meanwhile the writer holds the master's own connection (the pool has one), as it does for its own
        groups: the master's other transactions wait for it in the pool, not in SQLite's busy handler
        against the child (sleeps of up to 100 ms, then "database is locked" after the busy timeout)."""
        assert self._worker_db is not None and self._raw_engine is not None
        try:
            pooled = self._raw_engine.raw_connection() if bodies else None
        except Exception:  # the pool timed out: the ordinary path answers each batch with its error
            return None
        try:
            if self._worker is None:
                self._worker = IngestWorker(self._worker_db)
            return self._worker.run(bodies)
        except Exception as e:  # a missing worker must never fail a batch: the writer stores it
            log.warning(
                "metrics ingest worker failed (%s); the master stores metric batches itself for %.0f s",
                e,
                WORKER_RETRY_S,
            )
            if self._worker is not None:
                self._worker.close()
                self._worker = None
            self._worker_retry_at = time.monotonic() + WORKER_RETRY_S
            return None
        finally:
            if pooled is not None:
                pooled.close()  # back to the pool

    def _commit_raw(self, engine: Engine, group: list[_Job]) -> list[Any] | None:
        """The group on a pooled connection in driver SQL; None (rolled back) if anything failed."""
        if self.raw_dialect == "postgresql":
            return self._commit_raw_pg(engine, group)
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

    def _commit_raw_pg(self, engine: Engine, group: list[_Job]) -> list[Any] | None:
        """The group on a pooled psycopg connection, in one transaction; None (rolled back) if anything
        failed (the ordinary path then answers each batch)."""
        pooled = engine.raw_connection()
        try:
            dbapi = pooled.driver_connection
            assert dbapi is not None
            try:
                results = [job.raw(dbapi) for job in group if job.raw is not None]
                dbapi.commit()
            except Exception:
                dbapi.rollback()
                return None
            return results
        finally:
            pooled.close()  # back to the pool
