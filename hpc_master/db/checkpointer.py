"""WAL checkpoints on SQLite, off the writers' path.

In WAL mode every commit appends pages to ``master.db-wal``; a checkpoint copies them back into the
database file and fsyncs it. SQLite runs one automatically inside whichever commit takes the WAL past
``wal_autocheckpoint`` pages, so under a stream of metric batches every tenth or so group commit also
paid for a checkpoint and its fsync: a fifth of the metrics writer's time. This thread checkpoints on its
own connection instead (``PASSIVE``: it never blocks a writer or a reader), every ``interval_s`` while
there is WAL to copy; the connections' own automatic checkpoint stays as a backstop at a higher threshold
(``engine.SQLITE_AUTOCHECKPOINT_PAGES``). Durability does not change: a transaction is durable (against
a crash of the process) once its commit is in the WAL, before any checkpoint.
"""

from __future__ import annotations

import logging
import sqlite3
import threading

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
    def __init__(self, path: str, *, interval_s: float = 0.5) -> None:
        self.path = path
        self.interval_s = interval_s
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
            while not self._stop.wait(self.interval_s):
                try:
                    self.checkpoint(conn)
                except sqlite3.Error as e:  # busy or locked: the next pass (or the backstop) catches up
                    log.debug("WAL checkpoint skipped: %s", e)
        finally:
            conn.close()
