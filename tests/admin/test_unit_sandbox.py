"""The sandbox of ``det-master.service`` does not break what a root master does for researchers: run as the
unit would confine it, a master submits a researcher's trial to the real local Slurm cluster (``runuser``,
``sbatch``, munge), gives them its run directory (``chown``), and its checkpoint GC deletes their checkpoints
as them (``runuser`` again).

PID 1 here is not systemd, so the test applies the unit's options that decide this itself: the capability
bounding set and ``NoNewPrivileges`` (``setpriv``), ``ProtectSystem=full`` (``/usr``, ``/boot``, ``/efi`` and
``/etc`` read-only) and ``PrivateTmp`` (private ``/tmp`` and ``/var/tmp``) in a mount namespace. The rest of the
sandbox (``PrivateDevices``, address families, kernel protections) only hides what the master never uses.
"""

from __future__ import annotations

import base64
import os
import pwd
import shlex
import shutil
import signal
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hpc_master.deploy import systemd_unit
from tests.conftest import require

from ._master_process import REPO, free_port, master_env, start_master

SANDBOX_ROOT = Path("/srv/hpc-det-tests")  # not under /tmp or /var/tmp, which the sandbox makes private
ADMIN_PASSWORD = "sandbox-admin-pw"


def unit_options(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


def sandbox_prefix(unit: str) -> tuple[str, ...]:
    """The unit's filesystem and privilege options, applied to a command without systemd."""
    options = unit_options(unit)
    assert options["ProtectSystem"] == "full" and options["PrivateTmp"] == "yes"
    assert options["NoNewPrivileges"] == "yes"
    caps = ",".join(
        ["-all", *(f"+{c.lower().removeprefix('cap_')}" for c in options["CapabilityBoundingSet"].split())]
    )
    # An installation lives outside /tmp and /var/tmp (PrivateTmp hides them, as the guide says). A checkout
    # under them (scripts/test.sh copies one to /var/tmp when the original is private) is put back in place
    # over the private /tmp or /var/tmp, from a bind mount made before: the test is of the unit, not of
    # where CI keeps its checkout.
    repo = shlex.quote(str(REPO.resolve()))
    before = after = ""
    if str(REPO.resolve()).startswith(("/tmp/", "/var/tmp/")):
        stash = shlex.quote(str(SANDBOX_ROOT / ".checkout"))
        before = f"mkdir -p {stash}; mount --bind {repo} {stash}; "
        after = f"mkdir -p {repo}; mount --bind {stash} {repo}; "
    mounts = (
        f"set -e; {before}for d in /usr /boot /efi /etc; do if [ -d $d ]; then mount --bind $d $d; "
        "mount -o remount,bind,ro $d; fi; done; mount -t tmpfs tmpfs /tmp; mount -t tmpfs tmpfs /var/tmp; "
        f"{after}"
        'exec setpriv --bounding-set "$0" --no-new-privs -- "$@"'
    )
    return ("unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mounts, caps)


@pytest.fixture
def sandbox_dir() -> Iterator[Path]:
    SANDBOX_ROOT.mkdir(mode=0o755, exist_ok=True)
    root = SANDBOX_ROOT / uuid.uuid4().hex[:10]
    root.mkdir(mode=0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def login(http: httpx.Client, username: str, password: str) -> dict[str, str]:
    r = http.post("/api/v1/auth/login", json={"username": username, "password": password})
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def wait(predicate, timeout_s: float, what: str, log: str = "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{log}"
        time.sleep(1)


@pytest.mark.slow
@pytest.mark.slurm
def test_a_root_master_in_the_units_sandbox_runs_a_researchers_trial_and_gc(sandbox_dir: Path) -> None:
    from local_cluster.cluster import is_healthy

    from .test_admin_guide import cluster_address

    require(
        os.geteuid() == 0 and is_healthy() and shutil.which("sbatch") is not None, "the local Slurm cluster"
    )
    require(
        shutil.which("setpriv") is not None and shutil.which("unshare") is not None, "setpriv and unshare"
    )
    researcher = pwd.getpwnam(os.environ.get("DET_TEST_USER", "researcher"))
    host, port = cluster_address(), free_port()
    db = sandbox_dir / "master.db"
    for name in ("jobs", "checkpoints"):
        (sandbox_dir / name).mkdir(mode=0o1777 if name == "checkpoints" else 0o755)
    (sandbox_dir / "checkpoints").chmod(0o1777)
    env = master_env(
        sandbox_dir, DET_DB_URL=f"sqlite:///{db}", DET_LISTEN_HOST=host, DET_EXTERNAL_URL=f"http://{host}:{port}",
        DET_ADMIN_PASSWORD=ADMIN_PASSWORD, DET_POLL_INTERVAL_S="1",
    )  # fmt: skip
    m = start_master(
        sandbox_dir, env=env, port=port, abstract_socket=True, prefix=sandbox_prefix(systemd_unit())
    )
    url = f"http://{host}:{port}"
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            admin = login(http, "admin", ADMIN_PASSWORD)
            user = {"username": researcher.pw_name, "unixUsername": researcher.pw_name}
            r = http.post("/api/v1/users", headers=admin, json={"user": user, "password": "r-pw"})
            assert r.status_code == 200, r.text
            alice = login(http, researcher.pw_name, "r-pw")
            example = REPO / "examples" / "core_api"
            body = {
                "config": (example / "2_checkpoints.yaml").read_text(),
                "modelDefinition": [
                    {
                        "path": "2_checkpoints.py",
                        "type": 48,
                        "mode": 0o644,
                        "content": base64.b64encode((example / "2_checkpoints.py").read_bytes()).decode(),
                    },
                ],
                "activate": True,
            }
            r = http.post("/api/v1/experiments", headers=alice, json=body)
            assert r.status_code == 200, r.text

        def state(sql: str) -> list[tuple[object, ...]]:
            with sqlite3.connect(db) as conn:
                return conn.execute(sql).fetchall()

        wait(
            lambda: state("SELECT state FROM experiments") == [("COMPLETED",)], 240, "the experiment", m.log()
        )
        wait(lambda: ("DELETED",) in state("SELECT state FROM checkpoints"), 120, "checkpoint GC", m.log())
        assert m.stop(signal.SIGTERM) == 0, m.log()
    finally:
        m.close()
    (exp_dir,) = (sandbox_dir / "jobs" / researcher.pw_name).glob("exp-*")
    assert exp_dir.stat().st_uid == researcher.pw_uid  # made by its owner's helper
    rows = state("SELECT uuid, state FROM checkpoints")
    deleted = [u for u, s in rows if s == "DELETED"]
    kept = [u for u, s in rows if s == "COMPLETED"]
    assert deleted and kept, rows
    assert not any((sandbox_dir / "checkpoints" / str(u)).exists() for u in deleted)
    assert all((sandbox_dir / "checkpoints" / str(u)).stat().st_uid == researcher.pw_uid for u in kept)
    assert "Traceback" not in m.log(), m.log()
