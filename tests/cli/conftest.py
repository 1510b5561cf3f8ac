"""A real master (``python -m hpc_master.server``) on a free loopback port, with a temp SQLite DB and data dirs.

One master serves the whole session; tests isolate themselves with their own users (unique names) and their
own CLI config directory (``XDG_CONFIG_HOME``), and run ``det`` in-process through ``main(argv)``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from hpc_master.cli.main import main
from tests.leakgate import die_with_parent

MASTER_START_TIMEOUT_S = 30.0
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Master:
    url: str
    db_url: str
    root: Path
    checkpoint_root: Path
    proc: subprocess.Popen[bytes]


@contextlib.contextmanager
def running_master(
    root: Path, module_argv: list[str], extra_env: dict[str, str] | None = None
) -> Iterator[Master]:
    """Start ``python -m MODULE ...`` with its data under `root`; wait for ``/api/v1/master``; stop it after."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DET_", "XDG_"))}
    env.update(
        HOME=str(root / "home"),
        DET_DB_URL=f"sqlite:///{root / 'master.db'}",
        DET_MASTER_DATA_DIR=str(root / "data"),
        DET_MASTER_STATE_DIR=str(root / "state"),
        DET_CHECKPOINT_ROOT=str(root / "checkpoints"),
        DET_JOB_STORAGE_ROOT=str(root / "jobs"),
    )
    env.update(extra_env or {})
    argv = [a.replace("{port}", str(port)) for a in module_argv]
    log_path = root / "master.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", *argv], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, preexec_fn=die_with_parent,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + MASTER_START_TIMEOUT_S
        try:
            while True:
                try:
                    if httpx.get(f"{url}/api/v1/master", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the master did not start: {log_path.read_text()[-2000:]}")
                time.sleep(0.1)
            yield Master(url, env["DET_DB_URL"], root, Path(env["DET_CHECKPOINT_ROOT"]), proc)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="session")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Master]:
    """The REST API without the lifecycle loop: experiments stay as the tests leave them."""
    with running_master(tmp_path_factory.mktemp("master"), ["tests.cli._api_master", "{port}"]) as m:
        yield m


@dataclass(frozen=True)
class Result:
    rc: int
    out: str
    err: str


class Det:
    """Run ``det ARGS`` in-process; each call may add environment variables (``DET_PASS``, ``DET_USER``)."""

    def __init__(self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
        self.capsys = capsys
        self.monkeypatch = monkeypatch

    def __call__(self, *argv: str, env: dict[str, str] | None = None) -> Result:
        self.capsys.readouterr()
        with self.monkeypatch.context() as m:
            for key, value in (env or {}).items():
                m.setenv(key, value)
            try:
                rc = main(list(argv))
            except SystemExit as exc:  # argparse usage errors
                rc = int(exc.code or 0)
        captured = self.capsys.readouterr()
        return Result(rc, captured.out, captured.err)


@pytest.fixture
def det(
    master: Master, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Det:
    for var in list(os.environ):
        if var.startswith("DET_") and var != "DET_TEST_REQUIRE_ALL":
            monkeypatch.delenv(var)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DET_MASTER", master.url)
    give_owner_key(master, tmp_path / "config")
    return Det(capsys, monkeypatch)


def give_owner_key(master: Master, xdg_config_home: Path) -> None:
    """The test acts as the master's owner: its CLI finds the key the master wrote to its owner's home."""
    name = f"owner-key-{httpx.URL(master.url).port}"
    key = master.root / "home" / ".config" / "hpc-det" / name
    (xdg_config_home / "hpc-det").mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copy(key, xdg_config_home / "hpc-det" / name)


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


ADMIN = {"DET_USER": "admin", "DET_PASS": ""}


@pytest.fixture
def make_user(det: Det) -> Callable[[str], dict[str, str]]:
    """``make_user("alice")`` → a new user (unique name) with password ``pw``; returns the env to act as it."""

    def _make(prefix: str = "user") -> dict[str, str]:
        name = unique(prefix)
        r = det("user", "create", name, "--password", "pw", env=ADMIN)
        assert r.rc == 0, r.err
        return {"DET_USER": name, "DET_PASS": "pw"}

    return _make
