"""Engines and sessions: SQLite (WAL, busy timeout, foreign keys) or PostgreSQL by URL."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_MS = 10_000
SQLITE_AUTOCHECKPOINT_PAGES = 10_000
"""A backstop: the master checkpoints from its own thread (``checkpointer.WalCheckpointer``), so a commit
runs SQLite's automatic checkpoint (default: past 1,000 pages) only if that thread falls behind."""
SQLITE_WAL_SIZE_LIMIT = 64 * 1024 * 1024


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    configure_sqlite_connection(dbapi_connection)


def configure_sqlite_connection(dbapi_connection: Any) -> None:
    """The master's settings for a sqlite3 connection (also the metrics ingest worker's own)."""
    # Let SQLAlchemy's BEGIN govern transactions rather than pysqlite's implicit ones.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL mode: a committed transaction survives a crash of the process (kill -9), which is the
    # promise the API makes; only an OS crash or power loss can lose the last commits.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute(f"PRAGMA wal_autocheckpoint={SQLITE_AUTOCHECKPOINT_PAGES}")
    cursor.execute(f"PRAGMA journal_size_limit={SQLITE_WAL_SIZE_LIMIT}")  # the WAL file shrinks back
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _sqlite_on_begin(conn: Any) -> None:
    # BEGIN IMMEDIATE takes the write lock up front, so two writers wait on busy_timeout instead of failing
    # with "database is locked" when a read transaction tries to upgrade.
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def create_private_file(path: Path) -> None:
    """Create the database file 0600 before SQLite does (it holds password hashes and configs): SQLite gives
    its ``-wal`` and ``-shm`` files the main file's mode. A file this account already owns is narrowed too."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        for existing in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            with contextlib.suppress(OSError):
                if existing.stat().st_uid == os.geteuid() and existing.stat().st_mode & 0o077:
                    existing.chmod(0o600)


def make_engine(url: str, **kwargs: Any) -> Engine:
    if url.startswith("sqlite"):
        db_path = url.split("///", 1)[1] if "///" in url else ""
        if db_path and db_path != ":memory:" and not db_path.startswith("file:"):
            create_private_file(Path(db_path).expanduser())
        # One connection: SQLite has one writer at a time anyway, and waiting in the pool (a condition
        # variable) is far cheaper than SQLite's busy handler, which sleeps in 1-100 ms steps under contention.
        kwargs.setdefault("pool_size", 1)
        kwargs.setdefault("max_overflow", 0)
        kwargs.setdefault("pool_timeout", 60)
        engine = create_engine(url, connect_args={"check_same_thread": False}, **kwargs)
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
        return engine
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, **kwargs)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A short session that commits on success and rolls back on any error."""
    with factory() as session, session.begin():
        yield session
