"""Fixtures and helpers for tests against the real local Slurm cluster (`det deploy local up --create-user researcher`).

Jobs are submitted as a non-root researcher account (DET_TEST_USER, default `researcher`), never as root.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from local_cluster.cluster import is_healthy
from tests.conftest import require

REPO = Path(__file__).resolve().parents[2]
SHARED_TEST_ROOT = Path(os.environ.get("DET_TEST_SHARED_DIR", "/var/tmp/hpc-det-tests"))


@dataclass
class Researcher:
    name: str
    uid: int
    gid: int

    def run(
        self, cmd: list[str], *, timeout_s: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a command as the researcher (from a neutral directory they can read)."""
        full = ["runuser", "-u", self.name, "--", *cmd]
        proc = subprocess.run(full, capture_output=True, text=True, timeout=timeout_s, cwd="/", check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"{cmd} failed ({proc.returncode}): {proc.stderr}{proc.stdout}")
        return proc

    def sbatch(self, script: Path, *args: str) -> str:
        return self.run(["sbatch", "--parsable", *args, str(script)]).stdout.strip().split(";")[0]


@pytest.fixture(scope="session")
def cluster() -> None:
    require(
        os.geteuid() == 0 and is_healthy() and shutil.which("sbatch") is not None, "the local Slurm cluster"
    )


@pytest.fixture(scope="session")
def researcher(cluster: None) -> Researcher:
    name = os.environ.get("DET_TEST_USER", "researcher")
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        require(False, f"the researcher account {name!r}")
        raise
    assert pw.pw_uid != 0, "jobs must be submitted by a non-root account"
    return Researcher(name, pw.pw_uid, pw.pw_gid)


OTHER_RESEARCHER = "dettestother" + os.environ.get("PYTEST_XDIST_WORKER", "").removeprefix("gw")
"""One per pytest-xdist worker: a worker's session ends (and removes its account) while others still run."""


@pytest.fixture(scope="session")
def other_researcher(researcher: Researcher) -> Iterator[Researcher]:
    """A second researcher's Unix account with its own Slurm association (account `research`, as `det deploy
    local up --create-user` gives), for tests of one user against another; removed afterwards."""
    from local_cluster.accounting import LOCAL_ACCOUNT

    created = False
    try:
        pwd.getpwnam(OTHER_RESEARCHER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/bash", OTHER_RESEARCHER],
                       check=True, timeout=60)  # fmt: skip
        created = True
    add = subprocess.run(["sacctmgr", "-i", "add", "user", OTHER_RESEARCHER, f"Account={LOCAL_ACCOUNT}"],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert add.returncode == 0 or "Nothing new added" in add.stdout + add.stderr, add.stdout + add.stderr
    pw = pwd.getpwnam(OTHER_RESEARCHER)
    try:
        yield Researcher(OTHER_RESEARCHER, pw.pw_uid, pw.pw_gid)
    finally:
        subprocess.run(["scancel", "-u", OTHER_RESEARCHER], capture_output=True, check=False, timeout=60)
        subprocess.run(["sacctmgr", "-i", "delete", "user", f"name={OTHER_RESEARCHER}"],
                       capture_output=True, check=False, timeout=60)  # fmt: skip
        if created:
            subprocess.run(["userdel", OTHER_RESEARCHER], capture_output=True, check=False, timeout=60)


@pytest.fixture()
def shared_dir(researcher: Researcher) -> Iterator[Path]:
    """A directory on the 'shared filesystem' that the researcher owns, removed afterwards."""
    SHARED_TEST_ROOT.mkdir(parents=True, exist_ok=True)
    SHARED_TEST_ROOT.chmod(0o1777)
    d = SHARED_TEST_ROOT / uuid.uuid4().hex[:12]
    d.mkdir()
    os.chown(d, researcher.uid, researcher.gid)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def python_for_jobs() -> str:
    """The interpreter jobs run: the project's venv (built from Debian's python, readable by every user)."""
    return str(REPO / ".venv" / "bin" / "python")


def write_script(path: Path, text: str, owner: Researcher) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    os.chown(path, owner.uid, owner.gid)
    return path


def job_state(job_id: str) -> str:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=False
    ).stdout
    for field in out.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1]
    return "UNKNOWN"


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.5):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def wait_job_done(job_id: str, timeout_s: float = 120) -> str:
    terminal = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}
    return str(
        wait_for(lambda: job_state(job_id) in terminal and job_state(job_id), timeout_s, f"job {job_id}")
    )


def up_args(record: dict[str, Any]) -> list[str]:
    """``det deploy local up`` arguments that bring back the cluster `record` (its state file) describes."""
    from local_cluster.spec import LocalClusterSpec

    spec = LocalClusterSpec.from_json(record["spec"])
    args = [
        "deploy", "local", "up", "--no-install",
        "--nodes", str(spec.nodes), "--gpus-per-node", str(spec.gpus_per_node),
        "--cpus-per-node", str(spec.cpus_per_node), "--mem-per-node-mb", str(spec.mem_per_node_mb),
        "--gpu-type", spec.gpu_type,
    ]  # fmt: skip
    for user in record["created_users"]:
        args += ["--create-user", user]
    return args
