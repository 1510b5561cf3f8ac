"""Fixtures: every storage/API test runs on SQLite and on PostgreSQL (``DET_TEST_PG_URL``).

PostgreSQL tests are skipped when ``DET_TEST_PG_URL`` is unset, unless ``DET_TEST_REQUIRE_ALL=1`` (then they
fail). Start a private server with ``scripts/postgres.sh start``.
"""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import make_engine, make_sessionmaker
from hpc_master.db.migrate import upgrade_to_head
from hpc_master.db.models import Base

warnings.filterwarnings("ignore", message=".*httpx2.*")

from fastapi.testclient import TestClient  # noqa: E402

from hpc_master.api.app import create_app  # noqa: E402
from hpc_master.masterconf import MasterConfig, parse_master_config  # noqa: E402

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(autouse=True)
def _isolated_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch the real user's directories."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DET_MASTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DET_MASTER_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("DET_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("DET_JOB_STORAGE_ROOT", str(tmp_path / "jobs"))
    for var in (
        "DET_DB_URL",
        "DET_LISTEN_HOST",
        "DET_LISTEN_PORT",
        "DET_ADMIN_PASSWORD",
        "DET_REQUIRE_PASSWORDS",
    ):
        monkeypatch.delenv(var, raising=False)


def pg_url_or_skip() -> str:
    url = os.environ.get("DET_TEST_PG_URL")
    if not url:
        if os.environ.get("DET_TEST_REQUIRE_ALL") == "1":
            pytest.fail("DET_TEST_PG_URL is unset and DET_TEST_REQUIRE_ALL=1")
        pytest.skip("DET_TEST_PG_URL is unset (scripts/postgres.sh start)")
    return url


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A fresh database for this test session on the server at DET_TEST_PG_URL, migrated once."""
    base = pg_url_or_skip()
    name = f"hpcdet_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(base).set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url)
    upgrade_to_head(engine)
    engine.dispose()
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


_PG_ENGINES: dict[str, Engine] = {}


def _truncate(engine: Engine) -> None:
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        eng = make_engine(f"sqlite:///{tmp_path / 'master.db'}")
        upgrade_to_head(eng)
        yield eng
        eng.dispose()
        return
    url = request.getfixturevalue("pg_database")
    eng = _PG_ENGINES.get(url)
    if eng is None:
        eng = _PG_ENGINES[url] = make_engine(url, pool_size=5)
    _truncate(eng)
    yield eng


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return make_sessionmaker(engine)


@pytest.fixture
def config(engine: Engine) -> MasterConfig:
    return parse_master_config({"db": {"url": engine.url.render_as_string(hide_password=False)}}, env={})


@pytest.fixture
def client(config: MasterConfig, engine: Engine) -> Iterator[TestClient]:
    app = create_app(config, engine=engine)
    with TestClient(app) as test_client:
        yield test_client


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for eng in _PG_ENGINES.values():
        eng.dispose()
