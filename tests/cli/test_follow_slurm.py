"""`det e create -f` on a real Slurm cluster: the exit status says how the first trial ended.

Needs the local Slurm cluster (``det deploy local up``) and a master whose lifecycle loop submits trials. Until
the loop exists, the master never creates trials: the test then skips, saying so.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from local_cluster.cluster import is_healthy
from tests.cli.conftest import ADMIN, Det, Master, give_owner_key, running_master, unique
from tests.conftest import require

LIFECYCLE_WAIT_S = 20.0
SHARED_TEST_ROOT = Path(os.environ.get("DET_TEST_SHARED_DIR", "/var/tmp/hpc-det-tests"))

FAILING_CONFIG = """\
name: cli-follow-failing
entrypoint: python3 fail.py
max_restarts: 0
searcher:
  name: single
  metric: validation_loss
  max_length:
    batches: 1
resources:
  slots_per_trial: 0
"""


@pytest.fixture
def full_master(tmp_path: Path) -> Iterator[Master]:
    """``det-master`` itself (``hpc_master.server``): the API and, once it exists, the lifecycle loop."""
    require(shutil.which("sbatch") is not None and is_healthy(), "the local Slurm cluster")
    # Jobs run as the researcher account: their storage must be on a "shared filesystem" it can write.
    shared = SHARED_TEST_ROOT / f"cli-{uuid.uuid4().hex[:10]}"
    shared.mkdir(parents=True, mode=0o1777)
    shared.chmod(0o1777)
    env = {
        "DET_POLL_INTERVAL_S": "1",
        "DET_JOB_STORAGE_ROOT": str(shared / "jobs"),
        "DET_CHECKPOINT_ROOT": str(shared / "checkpoints"),
    }
    argv = ["hpc_master.server", "--host", "127.0.0.1", "--port", "{port}", "--log-level", "warning"]
    try:
        with running_master(tmp_path / "full", argv, env) as m:
            yield m
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.fixture
def researcher_user(det: Det, full_master: Master, tmp_path: Path) -> dict[str, str]:
    """A det user whose jobs run as the researcher Unix account (DET_TEST_USER, default `researcher`)."""
    give_owner_key(full_master, tmp_path / "config")  # the test acts as this master's owner too
    account = os.environ.get("DET_TEST_USER", "researcher")
    try:
        pwd.getpwnam(account)
    except KeyError:
        require(False, f"the researcher account {account!r}")
    name = unique("res")
    r = det("-m", full_master.url, "user", "create", name, "--password", "pw", "--unix-username", account,
            env=ADMIN)  # fmt: skip
    assert r.rc == 0, r.err
    return {"DET_USER": name, "DET_PASS": "pw"}


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_follow_first_trial_exit_status_for_a_failing_trial(
    det: Det,
    full_master: Master,
    researcher_user: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DET_MASTER", full_master.url)
    monkeypatch.setenv("DET_USER", researcher_user["DET_USER"])
    monkeypatch.setenv("DET_PASS", researcher_user["DET_PASS"])
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "fail.py").write_text("import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n")
    cfg = tmp_path / "fail.yaml"
    cfg.write_text(FAILING_CONFIG)

    # Does this master run trials at all? Probe with a real experiment first.
    probe = det("e", "create", str(cfg), str(ctx))
    assert probe.rc == 0, probe.err
    probe_id = int(probe.out.split()[-1])
    deadline = time.monotonic() + LIFECYCLE_WAIT_S
    while time.monotonic() < deadline:
        described = json.loads(det("e", "describe", str(probe_id), "--json").out)
        if described["experiment"].get("trialIds"):
            break
        time.sleep(0.5)
    else:
        det("e", "kill", str(probe_id))
        pytest.skip(
            f"the master created no trial within {LIFECYCLE_WAIT_S:.0f} s: it has no lifecycle loop yet "
            "(searcher → Slurm), so `det e create -f` has nothing to follow"
        )
    det("e", "kill", str(probe_id))

    r = det("e", "create", str(cfg), str(ctx), "-f")
    assert "Created experiment" in r.out
    assert "about to fail" in r.out
    assert r.rc == 1, r.err  # 1: the trial ended in ERROR
    assert "ended: ERROR" in r.err
