"""The shipped ``det-master.service``: what ``det-master --print-systemd-unit`` prints for this installation,
that systemd accepts it (``systemd-analyze verify``), and that its timeouts fit the master's stop."""

from __future__ import annotations

import importlib.resources
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hpc_master import server
from hpc_master.deploy import systemd_unit

from ._master_process import REPO


def options(unit: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))


def print_unit(config: Path) -> str:
    return subprocess.run(
        [sys.executable, "-m", "hpc_master.server", "--config", str(config), "--print-systemd-unit"],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip


def test_print_systemd_unit_names_this_installation_and_config(tmp_path: Path) -> None:
    config = tmp_path / "etc" / "master.yaml"
    got = options(print_unit(config))
    det_master = Path(sys.executable).with_name("det-master")
    assert det_master.is_file()
    assert got["ExecStart"] == f"{det_master} --config {config}"
    assert got["EnvironmentFile"] == f"-{tmp_path / 'etc' / 'master.env'}"
    assert (
        systemd_unit("/etc/hpc-det/master.yaml", ["/opt/a b/det-master"]).count(
            "ExecStart='/opt/a b/det-master' --config /etc/hpc-det/master.yaml"
        )
        == 1
    )


def test_the_unit_is_notify_restarts_on_failure_and_waits_for_the_stop() -> None:
    got = options(systemd_unit())
    assert got["Type"] == "notify" and got["Restart"] == "on-failure"
    assert got["RestartPreventExitStatus"] == "2"  # a configuration error: det-master exits 2
    assert got["KillMode"] == "mixed"  # SIGTERM to the master only; it stops its ingest worker itself
    assert int(got["TimeoutStopSec"]) > server.GRACEFUL_SHUTDOWN_S + server.LOOP_STOP_S + 10
    assert "User" not in got  # root: it runs each researcher's jobs as them (docs/admin.md)


def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    path = tmp_path / "det-master.service"
    path.write_text(print_unit(tmp_path / "master.yaml"))
    r = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr


def test_the_unit_ships_in_the_package() -> None:
    assert (importlib.resources.files("hpc_master.deploy") / "det-master.service").is_file()
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "*.service" in data["hpc_master.deploy"]
