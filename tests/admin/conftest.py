"""Fixtures of the admin tests: a fresh PostgreSQL database on ``DET_TEST_PG_URL`` (created and dropped)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require
from tests.pg import new_database


def pg_server_url() -> str:
    url = os.environ.get("DET_TEST_PG_URL", "")
    require(bool(url), "PostgreSQL (DET_TEST_PG_URL)")
    return url


@pytest.fixture
def pg_database() -> Iterator[str]:
    """The SQLAlchemy URL of a new, empty database on the test server, dropped afterwards."""
    with new_database(pg_server_url(), "hpcdet_admin") as url:
        yield url


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
