"""A master serving as its service account, for the tests that need one (tests/e2e/test_service_account.py,
the attacks of tests/e2e/test_user_controlled_files.py): the account and its users' group, the master's
directories and per-user job storage, and the sudoers rule `det-master --print-sudoers` writes."""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import require
from tests.e2e.conftest import Master, new_master, started
from tests.slurm.fixtures import SHARED_TEST_ROOT, Researcher

SERVICE = "dettestsvc"
USERS = "dettestusers"


class ServiceMaster(Master):
    @property
    def user_jobs(self) -> Path:
        return self.root / "home" / self.researcher.name / "jobs"


def service_account(researcher: Researcher) -> pwd.struct_passwd:
    """The service account and the group of users it may act as, with the researcher in it. Made once and
    kept, as `det deploy local up` keeps the researcher's account: tests on other workers may be serving as it
    (a removed account's master could no longer run sudo). A lock keeps two workers from adding it at once."""
    require(shutil.which("sudo") is not None and shutil.which("visudo") is not None, "sudo")
    SHARED_TEST_ROOT.mkdir(parents=True, exist_ok=True)
    with open(SHARED_TEST_ROOT / ".service-account.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            grp.getgrnam(USERS)
        except KeyError:
            subprocess.run(["groupadd", USERS], check=True, timeout=60)
        try:
            pwd.getpwnam(SERVICE)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE],
                           check=True, timeout=60)  # fmt: skip
        if researcher.name not in grp.getgrnam(USERS).gr_mem:
            subprocess.run(
                ["gpasswd", "-a", researcher.name, USERS], check=True, capture_output=True, timeout=60
            )
    return pwd.getpwnam(SERVICE)


def configure(m: Master, svc: pwd.struct_passwd) -> Path:
    """The master's own directories the service account's; each user's job storage their own, out of its
    reach; the sudoers rule installed from `det-master --print-sudoers`. Returns the rule's file."""
    home = m.root / "home"
    home.mkdir(mode=0o755)
    mine = home / m.researcher.name
    mine.mkdir(mode=0o700)
    os.chown(mine, m.researcher.uid, m.researcher.gid)
    own_database(m)
    text = (m.root / "master.yaml").read_text()
    text = text.replace(f"job_storage_root: {m.root}/jobs", f"job_storage_root: {home}/{{unix_user}}/jobs")
    (m.root / "master.yaml").write_text(text)
    return move_to_service_account(m, svc)


def own_database(m: Master) -> None:
    """The master's SQLite database in its data directory (which the service account will own), not in its
    root (which it will not)."""
    m.db_url = f"sqlite:///{m.root}/data/master.db"
    text = (m.root / "master.yaml").read_text()
    (m.root / "master.yaml").write_text(text.replace(f"sqlite:///{m.root}/master.db", m.db_url))


def move_to_service_account(m: Master, svc: pwd.struct_passwd) -> Path:
    """docs/admin.md's "A service account" for this master (stopped): its state the service account's,
    TensorBoard's shared directories as the admin makes them, `service_account` set, the sudoers rule
    installed. Returns the rule's file."""
    subprocess.run(["chown", "-R", f"{svc.pw_uid}:{svc.pw_gid}", str(m.root / "data"), str(m.root / "state")],
                   check=True, timeout=60)  # fmt: skip
    # TensorBoard's shared directories: the service account's, ``experiment`` 1733 (each user's helper makes
    # their experiment's there; no one lists or renames others').
    shared = m.root / "checkpoints" / "tensorboard"
    (shared / "experiment").mkdir(parents=True, exist_ok=True)
    for d, mode in ((shared, 0o755), (shared / "experiment", 0o1733)):
        os.chown(d, svc.pw_uid, svc.pw_gid)
        d.chmod(mode)
    text = (m.root / "master.yaml").read_text()
    (m.root / "master.yaml").write_text(text + f"service_account: {SERVICE}\n")
    rule = subprocess.run(
        [sys.executable, "-m", "hpc_master.server", "--config", str(m.root / "master.yaml"), "--print-sudoers",
         "--users-group", USERS],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    draft = m.root / "sudoers"
    draft.write_text(rule)
    subprocess.run(["visudo", "-cf", str(draft)], check=True, capture_output=True, timeout=60)
    installed = Path(f"/etc/sudoers.d/hpc-det-e2e-{uuid.uuid4().hex[:8]}")
    shutil.copyfile(draft, installed)
    installed.chmod(0o440)
    return installed


@contextlib.contextmanager
def service_master(researcher: Researcher) -> Iterator[ServiceMaster]:
    """A new master started as root that serves as the service account; its sudoers rule removed after."""
    svc = service_account(researcher)
    base = new_master(researcher)
    m = ServiceMaster(base.root, researcher)
    rule = configure(m, svc)
    try:
        with started(m):
            yield m
    finally:
        rule.unlink(missing_ok=True)
