"""`det cmd` on the real local cluster: a command is a Slurm job run as its owner's Unix account, in the
uploaded context, on the GPUs it asked for; its output streams back and `det cmd run` exits with its code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Master
from tests.slurm.fixtures import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def det(
    master: Master, *args: str, cwd: Path | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DET_MASTER=master.url, DET_USER="alice", DET_PASS="alice-pw")
    return subprocess.run(
        [sys.executable, "-m", "hpc_master.cli.main", *args],
        capture_output=True, text=True, env=env, timeout=timeout_s, check=False, cwd=cwd,
    )  # fmt: skip


def command(master: Master, headers: dict[str, str], task_id: str) -> dict[str, Any]:
    return dict(master.api("GET", f"/commands/{task_id}", headers)["command"])


def sacct_user(job_id: str) -> str:
    def ask() -> str | None:
        out = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-a", "--format=User,State", "-j", job_id],
            capture_output=True, text=True, check=False,
        ).stdout.strip()  # fmt: skip
        user, _, job_state = out.partition("|")
        return user if user and user != "root" and job_state and job_state != "PENDING" else None

    return str(wait_for(ask, timeout_s=30, what=f"sacct's record of job {job_id}"))


def test_a_command_runs_in_its_context_as_its_owner_and_exits_with_its_code(
    master: Master, alice: dict[str, str], tmp_path: Path
) -> None:
    ctx = tmp_path / "ctx"
    (ctx / "data").mkdir(parents=True)
    (ctx / "data" / "input.txt").write_text("forty-two\n")
    (ctx / "secret.key").write_text("do not upload\n")
    (ctx / ".detignore").write_text("secret.key\n")
    line = "cat data/input.txt; ls; echo user=$(id -un) host=$(hostname) gpus=$CUDA_VISIBLE_DEVICES; exit 3"
    started = time.monotonic()
    proc = det(master, "cmd", "run", "-c", str(ctx), line)
    took = time.monotonic() - started
    assert proc.returncode == 3, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    assert "forty-two" in out and "data" in out and "secret.key" not in out
    facts = dict(word.split("=", 1) for word in next(x for x in out if x.startswith("user=")).split())
    assert facts["user"] == master.researcher.name
    assert re.fullmatch(r"node\d+", facts["host"]) and facts["gpus"] not in ("", None)
    assert "[job_entry]" not in proc.stdout  # the job's own lines go to stderr
    listed = master.api("GET", "/commands", alice)["commands"]
    (cmd,) = listed
    assert cmd["exitCode"] == 3 and cmd["state"] == "STATE_TERMINATED" and cmd["nodeList"] == facts["host"]
    assert sacct_user(cmd["slurmJobId"]) == master.researcher.name
    print(f"det cmd run, submit to exit code: {took:.1f} s")


def test_kill_ends_a_running_command_and_its_job(master: Master, alice: dict[str, str]) -> None:
    proc = det(master, "cmd", "run", "-d", "--config", "resources.slots=0", "echo started; sleep 600")
    assert proc.returncode == 0, proc.stderr
    task_id = proc.stdout.strip()
    wait_for(
        lambda: command(master, alice, task_id)["state"] == "STATE_RUNNING" or None,
        timeout_s=60, what="the command to run",
    )  # fmt: skip
    wait_for(
        lambda: "started" in det(master, "cmd", "logs", task_id).stdout or None, timeout_s=30, what="output"
    )
    job_id = command(master, alice, task_id)["slurmJobId"]
    killed = det(master, "cmd", "kill", task_id)
    assert killed.returncode == 0, killed.stderr
    ended = wait_for(
        lambda: ((c := command(master, alice, task_id))["state"] == "STATE_TERMINATED" and c) or None,
        timeout_s=60, what="the command to end",
    )  # fmt: skip
    assert "killed by the user" in ended["exitStatus"]
    queue = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout
    assert queue.strip() in ("", "COMPLETING")
    assert task_id not in det(master, "task", "list").stdout  # only tasks that have not ended


def test_a_job_slurm_refuses_ends_the_command_with_slurms_reason(
    master: Master, alice: dict[str, str]
) -> None:
    proc = det(master, "cmd", "run", "--config", "slurm.partition=nosuch", "true")
    assert proc.returncode == 1
    assert "Invalid partition" in proc.stderr


def test_another_user_cannot_see_or_kill_a_command(master: Master, alice: dict[str, str]) -> None:
    admin = master.login("admin", "admin-pw")
    user = {"username": "mallory", "admin": False, "active": True, "unixUsername": master.researcher.name}
    master.api("POST", "/users", admin, json={"user": user, "password": "mallory-pw"})
    mallory = master.login("mallory", "mallory-pw")
    proc = det(master, "cmd", "run", "-d", "--config", "resources.slots=0", "sleep 600")
    task_id = proc.stdout.strip()
    for method, path in [("GET", f"/commands/{task_id}"), ("POST", f"/commands/{task_id}/kill"),
                         ("GET", f"/tasks/{task_id}/logs")]:  # fmt: skip
        r = master._http().request(method, f"{master.url}/api/v1{path}", headers=mallory)
        assert r.status_code == 404, (path, r.text)
    assert command(master, alice, task_id)["state"] in ("STATE_QUEUED", "STATE_RUNNING")
    assert det(master, "cmd", "kill", task_id).returncode == 0


def test_a_shell_is_srun_into_the_tasks_job_as_its_owner(master: Master, alice: dict[str, str]) -> None:
    proc = det(master, "shell", "start", "-d", "--config", "resources.slots=0")
    assert proc.returncode == 0, proc.stderr
    task_id = proc.stdout.strip()
    shell = wait_for(
        lambda: ((s := master.api("GET", f"/shells/{task_id}", alice)["shell"])["isReady"] and s) or None,
        timeout_s=60, what="the shell's job to run",
    )  # fmt: skip
    home = Path(tempfile.mkdtemp(prefix="det-shell-home-"))  # not under pytest's root-only tmp_path
    os.chown(home, master.researcher.uid, master.researcher.gid)
    env = [
        f"DET_MASTER={master.url}",
        "DET_USER=alice",
        "DET_PASS=alice-pw",
        f"HOME={home}",
        f"PATH={os.environ['PATH']}",
    ]
    opened = master.researcher.run(
        ["env", *env, sys.executable, "-m", "hpc_master.cli.main", "shell", "open", task_id,
         "sh", "-c", "echo $(hostname) $(id -un) $SLURM_JOB_ID $(pwd)"],
        timeout_s=60, check=False,
    )  # fmt: skip
    assert opened.returncode == 0, opened.stdout + opened.stderr
    host, user, job_id, cwd = opened.stdout.split()
    assert (host, user, job_id) == (shell["nodeList"], master.researcher.name, shell["slurmJobId"])
    assert cwd == shell["workDir"]
    assert det(master, "shell", "kill", task_id).returncode == 0
    ended = wait_for(
        lambda: ((s := master.api("GET", f"/shells/{task_id}", alice)["shell"])["state"] == "STATE_TERMINATED"
                 and s) or None,
        timeout_s=60, what="the shell's job to end",
    )  # fmt: skip
    assert "killed by the user" in ended["exitStatus"]
