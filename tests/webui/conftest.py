"""The web UI under a real browser: Debian's chromium driven by Playwright, against a master (the real
FastAPI app under uvicorn, on loopback) whose database the tests seed directly, on SQLite and PostgreSQL.

``DET_TEST_REQUIRE_ALL=1`` (CI) turns a missing chromium or Playwright into a failure, not a skip.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from hpc_master.db.engine import make_engine, transaction
from hpc_master.masterconf import parse_master_config
from slurm_backend.cli import SlurmCli
from slurm_backend.cluster_view import CachedClusterView
from tests.conftest import require
from tests.unit.test_cluster_view import CountingRunner
from tests.webui.seed import seed_experiment, seed_searched_experiment, seed_user

CHROMIUM = os.environ.get("DET_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
ADMIN_PASSWORD = "admin-pw"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class UiMaster:
    url: str
    engine: Any
    data: dict[str, Any] = field(default_factory=dict)
    app: Any = None

    def login(self, username: str, password: str) -> dict[str, str]:
        r = httpx.post(f"{self.url}/api/v1/auth/login", json={"username": username, "password": password})
        assert r.status_code == 200, r.text
        return {"Authorization": f"Bearer {r.json()['token']}"}


def serve(app: Any, port: int) -> tuple[Any, threading.Thread]:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    return server, thread


def _database(kind: str, tmp: Path) -> tuple[str, Any]:
    if kind == "sqlite":
        return f"sqlite:///{tmp / 'master.db'}", None
    base = os.environ.get("DET_TEST_PG_URL")
    require(bool(base), "PostgreSQL (DET_TEST_PG_URL)")
    assert base is not None
    name = f"hpcdet_ui_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    return make_url(base).set(database=name).render_as_string(hide_password=False), (admin, name)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The pages on SQLite; a module marked ``storage`` on PostgreSQL too (what the pages show is the same on
    both, and the queries under them are tested on both by tests/master)."""
    if "ui_backend" in metafunc.fixturenames and metafunc.definition.get_closest_marker("storage"):
        backends = [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]
        metafunc.parametrize("ui_backend", backends, indirect=True, scope="module")


@pytest.fixture(scope="module")
def ui_backend(request: pytest.FixtureRequest) -> str:
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture(scope="module")
def ui_master(ui_backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiMaster]:
    """A master with passwords required (admin, alice, bob) and seeded experiments: alice's ASHA search
    (12 trials), alice's active one-trial experiment, bob's completed one."""
    from hpc_master.api.app import create_app

    tmp = tmp_path_factory.mktemp(f"ui-{ui_backend}")
    saved = {k: os.environ.get(k) for k in ("HOME", "DET_MASTER_DATA_DIR", "DET_MASTER_STATE_DIR")}
    os.environ.update(
        HOME=str(tmp / "home"), DET_MASTER_DATA_DIR=str(tmp / "data"), DET_MASTER_STATE_DIR=str(tmp / "state")
    )
    url, pg = _database(ui_backend, tmp)
    port = free_port()
    config = parse_master_config(
        {
            "db": {"url": url},
            "listen": {"host": "127.0.0.1", "port": port},
            "security": {"require_passwords": True, "admin_password": ADMIN_PASSWORD},
            "job_storage_root": str(tmp / "jobs"),
        },
        env={},
    )
    engine = make_engine(url)
    app = create_app(config, engine=engine)
    # The cluster page reads a scripted Slurm (the captured answer; the real one is tests/e2e's).
    app.state.cluster_view = CachedClusterView(SlurmCli(runner=CountingRunner()))
    from sqlalchemy.orm import sessionmaker

    sessions = sessionmaker(engine, expire_on_commit=False)
    data: dict[str, Any] = {}
    with transaction(sessions) as s:
        alice = seed_user(s, "alice", "alice-pw")
        bob = seed_user(s, "bob", "bob-pw")
        data["asha"], data["asha_trials"] = seed_experiment(
            s, alice, name="digits-asha", trials=12, points=300, asha=True
        )
        data["single"], data["single_trials"] = seed_experiment(
            s, alice, name="digits-single", trials=1, points=200, state="ACTIVE"
        )
        data["bob"], data["bob_trials"] = seed_experiment(s, bob, name="bobs-run", trials=3, points=100)
        # An ASHA search on a larger-is-better metric, its snapshot the real searcher's.
        data["accuracy"], data["accuracy_trials"] = seed_searched_experiment(
            s, alice, name="rungs-accuracy", metric="validation_accuracy", smaller_is_better=False,
            values=[0.9611, 0.9694, 0.8, 0.9],
        )  # fmt: skip
    server, thread = serve(app, port)
    try:
        yield UiMaster(url=f"http://127.0.0.1:{port}", engine=engine, data=data, app=app)
    finally:
        server.should_exit = True
        thread.join(10)
        engine.dispose()
        if pg is not None:
            admin, name = pg
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for one test module. Not for the session: while Playwright's sync API is open, its event loop
    counts as running in the main thread, and every later test that calls ``asyncio.run`` fails."""
    require(shutil.which(CHROMIUM) is not None or Path(CHROMIUM).exists(), f"chromium ({CHROMIUM})")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require(False, "playwright (pip install playwright)")
        raise
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Page:
    """A browser page that records JavaScript errors; ``assert_clean()`` fails the test on any."""

    def __init__(self, browser: Any, base_url: str) -> None:
        # A master beyond loopback serves browsers over HTTPS with the certificate it generated (issue 35).
        self.context = browser.new_context(
            viewport={"width": 1400, "height": 900}, base_url=base_url, ignore_https_errors=True
        )
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        self.page.on(
            "console",
            lambda msg: (
                self.errors.append(f"console.{msg.type}: {msg.text}") if msg.type == "error" else None
            ),
        )

    def login(self, username: str, password: str) -> None:
        p = self.page
        p.goto("/login")
        p.fill("input[name=username]", username)
        p.fill("input[name=password]", password)
        p.click("button[type=submit]")
        p.wait_for_url("**/experiments*")

    def assert_clean(self, allow: tuple[str, ...] = ()) -> None:
        bad = [e for e in self.errors if not any(a in e for a in allow)]
        assert not bad, "JavaScript errors:\n" + "\n".join(bad)

    def close(self) -> None:
        self.context.close()


@pytest.fixture()
def page_factory(browser: Any, ui_master: UiMaster) -> Iterator[Any]:
    pages: list[Page] = []

    def make() -> Page:
        page = Page(browser, ui_master.url)
        pages.append(page)
        return page

    yield make
    for p in pages:
        p.close()
