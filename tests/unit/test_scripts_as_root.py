"""The README's commands carry no sudo: as root they just run; as another user they re-run through sudo, or
say how to run them where there is none (a fresh Debian 12 machine used as root has no sudo)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = ["scripts/quickstart.sh", "scripts/test.sh", "scripts/bootstrap.sh"]


def fake_bin(tmp_path: Path, *, uid: int, with_sudo: bool) -> Path:
    """A PATH of its own: `id -u` says `uid`; a `sudo` that only prints its arguments, if asked for."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "basename"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    if with_sudo:
        (bin_dir / "sudo").write_text('#!/bin/sh\necho "sudo $*"\n')
    for script in bin_dir.iterdir():
        if not script.is_symlink():
            script.chmod(0o755)
    return bin_dir


def run(script: str, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(bin_dir), "HOME": os.environ.get("HOME", "/root")}
    return subprocess.run(
        ["/bin/bash", str(REPO / script), "--some-arg"], env=env, capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_another_user_is_taken_through_sudo(script: str, tmp_path: Path) -> None:
    r = run(script, fake_bin(tmp_path, uid=1000, with_sudo=True))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"sudo -E {REPO / script} --some-arg"


@pytest.mark.parametrize("script", SCRIPTS)
def test_without_sudo_another_user_is_told_to_run_it_as_root(script: str, tmp_path: Path) -> None:
    r = run(script, fake_bin(tmp_path, uid=1000, with_sudo=False))
    assert r.returncode == 2
    assert "must run as root" in r.stderr and "no sudo" in r.stderr
