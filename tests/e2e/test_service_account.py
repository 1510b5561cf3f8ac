"""A shared master that holds no root (issue 34): started as root with a service account, it switches to that
account before it opens anything, and everything it does in a researcher's name — their run directories, sbatch,
scancel, their logs — goes through the per-user helper under the one sudoers rule `det-master --print-sudoers`
writes. The job storage is per user (``{unix_user}``) and the service account can neither write nor read it, as
on a root-squashed filesystem."""

from __future__ import annotations

import pwd
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Master, make_alice, new_master, started
from tests.e2e.service import SERVICE, move_to_service_account, own_database, service_account, service_master
from tests.slurm.fixtures import Researcher, wait_for

pytestmark = pytest.mark.slurm


def _single(name: str, *, increment_by: int, sleep_s: float, batches: int) -> str:
    """A one-trial experiment of the e2e context's counter (`train.py`), never restarted."""
    return f"""
name: {name}
entrypoint: python3 train.py
hyperparameters: {{increment_by: {increment_by}, sleep_s: {sleep_s}}}
searcher: {{name: single, metric: validation_loss, max_length: {{batches: {batches}}}}}
max_restarts: 0
"""


CONST = _single("e2e-service-account", increment_by=2, sleep_s=0.02, batches=20)
LONG = _single("e2e-service-account-kill", increment_by=1, sleep_s=2, batches=1000)
ACROSS = _single("e2e-across-the-move", increment_by=1, sleep_s=0.5, batches=60)


def test_a_master_started_as_root_serves_as_its_service_account_and_acts_through_the_helper(
    researcher: Researcher,
) -> None:
    with service_master(researcher) as m:
        _check(m, service_account(researcher))


def test_a_root_master_moved_to_its_service_account_adopts_the_jobs_running_across_the_move(
    researcher: Researcher,
) -> None:
    """docs/admin.md's one step from a root master to the service account, with a trial running meanwhile: the
    same Slurm job ends the trial (adopted, not run again), its logs are read through the researcher's helper,
    and the job storage stays root's (the service account cannot write it)."""
    svc = service_account(researcher)
    m = new_master(researcher)
    own_database(m)
    rule: Path | None = None
    try:
        with started(m, settle_s=0) as root_master:
            alice = make_alice(root_master)
            exp = root_master.create_experiment(alice, ACROSS)
            (job,) = wait_for(
                lambda: root_master.jobs_of(exp, states="RUNNING"), 120, "the trial's job to run"
            )
            root_master.stop()  # the admin stops the master; `started` cancels nothing of a live job below
            rule = move_to_service_account(m, svc)
            root_master.start()
            assert root_master.proc is not None
            uids = next(
                x for x in Path(f"/proc/{root_master.proc.pid}/status").read_text().splitlines()
                if x.startswith("Uid:")
            )  # fmt: skip
            assert uids.split()[1:] == [str(svc.pw_uid)] * 4, uids
            state = root_master.wait_state(alice, exp, {"STATE_COMPLETED", "STATE_ERROR"}, 240)
            assert state == "STATE_COMPLETED", root_master.diagnose(exp)
            (trial,) = root_master.trials(alice, exp)
            assert trial["stepsCompleted"] == 60 and trial["restarts"] == 0, trial
            assert root_master.job_ids() == [job]  # the one job, adopted: nothing submitted again
            logs = httpx.get(f"{root_master.url}/api/v1/trials/{trial['id']}/logs", headers=alice, timeout=60)
            assert logs.status_code == 200 and "done: x=60 steps=60" in logs.text, logs.text[-2000:]
            may_write = subprocess.run(["runuser", "-u", SERVICE, "--", "test", "-w", str(m.root / "jobs")],
                                       timeout=60)  # fmt: skip
            assert may_write.returncode == 1
    finally:
        if rule is not None:
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
