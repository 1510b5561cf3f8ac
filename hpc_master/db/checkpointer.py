"""WAL checkpoints on SQLite, off the writers' path.

In WAL mode every commit appends pages to ``master.db-wal``; a checkpoint copies them back into the
database file and fsyncs it. SQLite runs one automatically inside whichever commit takes the WAL past
``wal_autocheckpoint`` pages, so under a stream of metric batches every tenth or so group commit also
paid for a checkpoint and its fsync: a fifth of the metrics writer's time. This thread checkpoints on its
own connection instead (``PASSIVE``: it never blocks a writer or a reader): as soon as the metrics writer has
committed ``rows_per_checkpoint`` rows since the last one (about SQLite's own cadence of 1,000 pages), else
every ``max_interval_s`` (a checkpoint fsyncs the database, and a master with little to write should not
fsync twice a second). The connections' own automatic checkpoint stays as a backstop at a higher threshold
(``engine.SQLITE_AUTOCHECKPOINT_PAGES``). Durability does not change: a transaction is durable (against
a crash of the process) once its commit is in the WAL, before any checkpoint.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine

from hpc_master.db.engine import SQLITE_BUSY_TIMEOUT_MS

log = logging.getLogger(__name__)


def sqlite_file(engine: Engine) -> str | None:
    """The database file of a SQLite engine (None for other databases and in-memory SQLite)."""
    if engine.dialect.name != "sqlite":
        return None
    path = engine.url.database
    return path if path and path != ":memory:" and not path.startswith("file:") else None


class WalCheckpointer:
    def __init__(
        self,
        path: str,
        rows_written: Callable[[], int] = lambda: 0,
        *,
        rows_per_checkpoint: int = 20_000,
        max_interval_s: float = 30.0,
        poll_s: float = 0.25,
    ) -> None:
        self.path = path
        self.rows_written = rows_written
        self.rows_per_checkpoint = rows_per_checkpoint
        self.max_interval_s = max_interval_s
        self.poll_s = poll_s
        self.checkpoints = 0  # passes that copied pages (for tests)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="wal-checkpointer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def checkpoint(self, conn: sqlite3.Connection) -> tuple[int, int]:
        """One PASSIVE checkpoint: (pages in the WAL, pages copied so far)."""
        _busy, wal_pages, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if copied > 0:
            self.checkpoints += 1
        return int(wal_pages), int(copied)

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            log.warning("WAL checkpointer disabled: cannot open %s: %s", self.path, e)
            return
        try:
            conn.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            rows_then, time_then = self.rows_written(), time.monotonic()
            while not self._stop.wait(self.poll_s):
                rows, now = self.rows_written(), time.monotonic()
                if rows - rows_then < self.rows_per_checkpoint and now - time_then < self.max_interval_s:
                    continue
                rows_then, time_then = rows, now
                try:
                    self.checkpoint(conn)
                except sqlite3.Error as e:  # busy or locked: the next pass (or the backstop) catches up
                    log.debug("WAL checkpoint skipped: %s", e)
        finally:
            conn.close()
