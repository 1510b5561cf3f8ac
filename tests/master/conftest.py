"""Fixtures: the master's database and app, on SQLite; the storage contract on PostgreSQL too.

A test marked ``storage`` (what depends on the database: storage functions, migrations, concurrency, ingest,
listing queries) runs on SQLite and on PostgreSQL (``DET_TEST_PG_URL``); every other test runs on SQLite only,
since a route's checks and answers do not change with the database under it. PostgreSQL tests are skipped when
``DET_TEST_PG_URL`` is unset, unless ``DET_TEST_REQUIRE_ALL=1`` (then they fail). Start a private server with
``scripts/postgres.sh start``.
"""

from __future__ import annotations

import os
import shutil
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


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def blank_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database (no tables yet) on each backend: for the migration tests."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    from tests.pg import new_database

    with new_database(pg_url_or_skip(), "hpcdet_mig") as url:
        yield url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An SQLite database migrated to head once; each test's database starts as a copy of it (the migrations
    took about a third of a route test's time). The migrations themselves are tested in test_storage.py."""
    path = tmp_path_factory.mktemp("template") / "master.db"
    eng = make_engine(f"sqlite:///{path}")
    upgrade_to_head(eng)
    eng.dispose()  # the last connection closes: the WAL is checkpointed into the file, which is then whole
    assert not path.with_name("master.db-wal").exists()
    return path


_PG_ENGINES: dict[str, Engine] = {}


def _truncate(engine: Engine) -> None:
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "db_backend" in metafunc.fixturenames and metafunc.definition.get_closest_marker("storage"):
        metafunc.parametrize("db_backend", BACKENDS, indirect=True)


@pytest.fixture
def db_backend(request: pytest.FixtureRequest) -> str:
    """`sqlite`, or each of BACKENDS for a test marked ``storage``."""
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture
def engine(db_backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if db_backend == "sqlite":
        shutil.copyfile(request.getfixturevalue("sqlite_template"), tmp_path / "master.db")
        eng = make_engine(f"sqlite:///{tmp_path / 'master.db'}")
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
