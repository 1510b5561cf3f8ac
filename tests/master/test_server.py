"""det-master: a real uvicorn in a subprocess, and the --daemon / --stop pair."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_up(url: str, timeout_s: float = 20.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return dict(httpx.get(url, timeout=1).json())
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not come up")


@pytest.mark.slow
def test_daemon_start_and_stop(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [sys.executable, "-m", "hpc_master.server"]
    started = subprocess.run([*cmd, "--daemon", "--port", str(port)], env=env, capture_output=True, text=True)
    assert started.returncode == 0, started.stderr
    try:
        info = wait_up(f"http://127.0.0.1:{port}/api/v1/master")
        assert info["clusterName"] == "hpc-det"
        # A personal master prints its web UI's login link: the owner key, which logs in as determined.
        (link,) = [line.split("Web UI: ", 1)[1] for line in started.stdout.splitlines() if "Web UI: " in line]
        assert link.startswith(f"http://127.0.0.1:{port}/login#key=")
        key = link.split("#key=", 1)[1]
        assert key not in (tmp_path / "state" / "master.log").read_text()  # a secret is never logged
        body = {"username": "determined", "password": "", "ownerKey": key}
        assert httpx.post(f"http://127.0.0.1:{port}/api/v1/auth/login", json=body).status_code == 200
        body["ownerKey"] = key[:-1] + ("a" if key[-1] != "a" else "b")
        assert httpx.post(f"http://127.0.0.1:{port}/api/v1/auth/login", json=body).status_code == 401
        assert (tmp_path / "state" / "master.pid").exists()
        assert (tmp_path / "data" / "master.db").exists()
        # A job's calls are often more than uvicorn's default 5 s apart: the master keeps them alive longer.
        from harness._http import MasterSession

        session = MasterSession(f"http://127.0.0.1:{port}", "")
        session.get("/api/v1/master")
        conn = session._local.conn
        assert conn is not None and conn.sock is not None
        first = conn.sock.getsockname()
        time.sleep(6)
        session.get("/api/v1/master")
        assert session._local.conn is conn and conn.sock is not None and conn.sock.getsockname() == first
    finally:
        stopped = subprocess.run([*cmd, "--stop"], env=env, capture_output=True, text=True)
    assert stopped.returncode == 0, stopped.stderr
    assert not (tmp_path / "state" / "master.pid").exists()


def test_bad_config_exits_with_message(tmp_path: Path) -> None:
    bad = tmp_path / "master.yaml"
    bad.write_text("listen:\n  hots: 1.2.3.4\n")
    from hpc_master.server import main

    assert main(["--config", str(bad)]) == 2


def test_the_open_files_limit_is_raised_to_the_hard_limit() -> None:
    code = (
        "import resource; from hpc_master.server import raise_open_files_limit as r; "
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE); "
        "print(soft, r(), resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)"
    )
    out = subprocess.run(
        ["bash", "-c", f'ulimit -Sn 256 && exec "{sys.executable}" -c "{code}"'],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    before, returned, after, hard = (int(x) for x in out.stdout.split())
    assert before == 256 and hard > 256
    assert returned == after == hard


def test_only_a_personal_master_has_a_login_link(tmp_path: Path) -> None:
    from hpc_master.masterconf import parse_master_config
    from hpc_master.server import login_link

    db = {"url": f"sqlite:///{tmp_path / 'm.db'}"}
    shared = parse_master_config({"db": db, "security": {"require_passwords": True}}, env={})
    assert login_link(shared) is None
    personal = parse_master_config({"db": db, "listen": {"port": free_port()}}, env={})
    assert login_link(personal) is None  # no key written yet: the master writes one when it starts
