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
        assert (tmp_path / "state" / "master.pid").exists()
        assert (tmp_path / "data" / "master.db").exists()
    finally:
        stopped = subprocess.run([*cmd, "--stop"], env=env, capture_output=True, text=True)
    assert stopped.returncode == 0, stopped.stderr
    assert not (tmp_path / "state" / "master.pid").exists()


def test_bad_config_exits_with_message(tmp_path: Path) -> None:
    bad = tmp_path / "master.yaml"
    bad.write_text("listen:\n  hots: 1.2.3.4\n")
    from hpc_master.server import main

    assert main(["--config", str(bad)]) == 2
