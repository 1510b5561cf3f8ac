"""Fixtures of the admin tests: a fresh PostgreSQL database on ``DET_TEST_PG_URL`` (created and dropped)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.conftest import require


def pg_server_url() -> str:
    url = os.environ.get("DET_TEST_PG_URL", "")
    require(bool(url), "PostgreSQL (DET_TEST_PG_URL)")
    return url


@pytest.fixture
def pg_database() -> Iterator[str]:
    """The SQLAlchemy URL of a new, empty database on the test server, dropped afterwards."""
    base = pg_server_url()
    name = f"hpcdet_admin_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(autouse=True)
def _isolated_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch the real user's directories, and no DET_* override of the caller's."""
    for var in list(os.environ):
        if var.startswith("DET_") and var not in ("DET_TEST_PG_URL", "DET_TEST_REQUIRE_ALL"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("DET_MASTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DET_MASTER_STATE_DIR", str(tmp_path / "state"))
