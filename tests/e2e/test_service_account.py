"""A shared master that holds no root (issue 34): started as root with a service account, it switches to that
account before it opens anything, and everything it does in a researcher's name — their run directories, sbatch,
scancel, their logs — goes through the per-user helper under the one sudoers rule `det-master --print-sudoers`
writes. The job storage is per user (``{unix_user}``) and the service account can neither write nor read it, as
on a root-squashed filesystem."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import require
from tests.e2e.conftest import Master, make_alice, new_master, started
from tests.slurm.fixtures import Researcher, wait_for

pytestmark = pytest.mark.slurm

SERVICE = "dettestsvc"
USERS = "dettestusers"
CONST = """
name: e2e-service-account
entrypoint: python3 train.py
hyperparameters: {increment_by: 2, sleep_s: 0.02}
searcher: {name: single, metric: validation_loss, max_length: {batches: 20}}
max_restarts: 0
"""
LONG = """
name: e2e-service-account-kill
entrypoint: python3 train.py
hyperparameters: {increment_by: 1, sleep_s: 2}
searcher: {name: single, metric: validation_loss, max_length: {batches: 1000}}
max_restarts: 0
"""


class ServiceMaster(Master):
    @property
    def user_jobs(self) -> Path:
        return self.root / "home" / self.researcher.name / "jobs"


@contextlib.contextmanager
def service_account(researcher: Researcher) -> Iterator[pwd.struct_passwd]:
    """The service account and the group of users it may act as (the researcher in it); removed after."""
    require(shutil.which("sudo") is not None and shutil.which("visudo") is not None, "sudo")
    made_user = made_group = False
    try:
        grp.getgrnam(USERS)
    except KeyError:
        subprocess.run(["groupadd", USERS], check=True, timeout=60)
        made_group = True
    try:
        pwd.getpwnam(SERVICE)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE],
                       check=True, timeout=60)  # fmt: skip
        made_user = True
    subprocess.run(["gpasswd", "-a", researcher.name, USERS], check=True, capture_output=True, timeout=60)
    try:
        yield pwd.getpwnam(SERVICE)
    finally:
        subprocess.run(
            ["gpasswd", "-d", researcher.name, USERS], capture_output=True, timeout=60, check=False
        )
        if made_user:
            subprocess.run(["userdel", SERVICE], capture_output=True, timeout=60, check=False)
        if made_group:
            subprocess.run(["groupdel", USERS], capture_output=True, timeout=60, check=False)


def configure(m: Master, svc: pwd.struct_passwd) -> Path:
    """The master's own directories the service account's; each user's job storage their own, out of its
    reach; the sudoers rule installed from `det-master --print-sudoers`. Returns the rule's file."""
    home = m.root / "home"
    home.mkdir(mode=0o755)
    mine = home / m.researcher.name
    mine.mkdir(mode=0o700)
    os.chown(mine, m.researcher.uid, m.researcher.gid)
    for d in ("data", "state"):
        os.chown(m.root / d, svc.pw_uid, svc.pw_gid)
    # TensorBoard's shared directories as docs/admin.md has an admin make them for a service account: its own,
    # ``experiment`` 1733 (each user's helper makes their experiment's there; no one lists or renames others').
    shared = m.root / "checkpoints" / "tensorboard"
    (shared / "experiment").mkdir(parents=True)
    for d, mode in ((shared, 0o755), (shared / "experiment", 0o1733)):
        os.chown(d, svc.pw_uid, svc.pw_gid)
        d.chmod(mode)
    m.db_url = f"sqlite:///{m.root}/data/master.db"
    text = (m.root / "master.yaml").read_text()
    text = text.replace(f"sqlite:///{m.root}/master.db", m.db_url)
    text = text.replace(f"job_storage_root: {m.root}/jobs", f"job_storage_root: {home}/{{unix_user}}/jobs")
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


def test_a_master_started_as_root_serves_as_its_service_account_and_acts_through_the_helper(
    researcher: Researcher,
) -> None:
    with service_account(researcher) as svc:
        base = new_master(researcher)
        m = ServiceMaster(base.root, researcher)
        rule = configure(m, svc)
        try:
            with started(m):
                _check(m, svc)
        finally:
            rule.unlink(missing_ok=True)


def _check(m: Master, svc: pwd.struct_passwd) -> None:
    assert m.proc is not None
    uids = next(
        x for x in Path(f"/proc/{m.proc.pid}/status").read_text().splitlines() if x.startswith("Uid:")
    )
    assert uids.split()[1:] == [str(svc.pw_uid)] * 4, (
        uids
    )  # real, effective, saved and filesystem: no way back
    assert f"serving as the service account {SERVICE}" in m.log.read_text()
    denied = subprocess.run(["runuser", "-u", SERVICE, "--", "ls", str(m.user_jobs.parent)], capture_output=True,
                            timeout=60)  # fmt: skip
    assert denied.returncode != 0  # the storage is out of the service account's reach (as root-squashed)

    alice = make_alice(m)
    exp = m.create_experiment(alice, CONST)
    assert m.wait_state(alice, exp, {"STATE_COMPLETED", "STATE_ERROR"}, 180) == "STATE_COMPLETED", m.diagnose(
        exp
    )
    (trial,) = m.trials(alice, exp)
    assert trial["stepsCompleted"] == 20 and trial["latestCheckpointUuid"]
    # Everything in the researcher's run directories is theirs: made by their helper, written by their job.
    found = [p for p in m.user_jobs.rglob("*")]
    assert any(p.name == "exit.json" for p in found) and any(p.name == "context.tar.gz" for p in found)
    strangers = [str(p) for p in [m.user_jobs, *found] if p.lstat().st_uid != m.researcher.uid]
    assert strangers == []
    # Its logs, which the service account cannot open itself, through the researcher's helper.
    logs = httpx.get(f"{m.url}/api/v1/trials/{trial['id']}/logs", headers=alice, timeout=60)
    assert logs.status_code == 200 and "done: x=40 steps=20" in logs.text, logs.text[-2000:]
    assert "could not write TensorBoard" not in logs.text  # its experiment's directory made by its helper
    tensorboard = m.root / "checkpoints" / "tensorboard" / "experiment" / str(exp)
    assert tensorboard.stat().st_uid == m.researcher.uid

    # A kill: the job is cancelled as its owner (the service account may not cancel another's job).
    exp2 = m.create_experiment(alice, LONG)
    wait_for(lambda: m.jobs_of(exp2, states="RUNNING"), 120, "the long trial's job to run")
    m.api("POST", f"/experiments/{exp2}/kill", alice)
    assert (
        m.wait_state(alice, exp2, {"STATE_CANCELED", "STATE_ERROR", "STATE_COMPLETED"}, 120)
        == "STATE_CANCELED"
    )
    wait_for(lambda: not m.jobs_of(exp2), 60, "the killed trial's job to end")
