"""``det cmd`` and ``det task`` against a running master (no Slurm here: the commands stay queued; running them
is tests/e2e/test_commands.py's)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import yaml

from hpc_master.cli.command import task_config

from .conftest import Det

MakeUser = Callable[..., dict[str, str]]


def test_a_config_is_built_as_determineds_client_builds_it(tmp_path: Path) -> None:
    path = tmp_path / "cmd.yaml"
    path.write_text("resources: {slots: 2}\nslurm: {partition: batch}\nentrypoint: [from, file]\n")
    got = task_config(path, ["resources.slots=0", "slurm.time_limit=5"], ["/data:/mnt/data"], ["ignored"])
    assert got == {
        "resources": {"slots": 0},
        "slurm": {"partition": "batch", "time_limit": 5},
        "entrypoint": ["from", "file"],  # the file's entrypoint wins over the command line's, as Determined's
        "bind_mounts": [{"host_path": "/data", "container_path": "/mnt/data"}],
    }
    assert task_config(None, [], [], ["echo", "hi"])["entrypoint"] == ["echo", "hi"]


def test_run_detached_list_describe_config_kill(det: Det, make_user: MakeUser, tmp_path: Path) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "run.sh").write_text("echo hi\n")
    r = det("cmd", "run", "-d", "-c", str(ctx), "--config", "resources.slots=0", "sh", "run.sh", env=alice)
    assert r.rc == 0, r.err
    task_id = r.out.strip()
    listed = det("cmd", "list", "--json", env=alice)
    (cmd,) = json.loads(listed.out)
    assert cmd["id"] == task_id and cmd["description"] == "Command (sh run.sh)"
    assert det("cmd", "list", "-q", env=alice).out.split() == [task_id]
    assert det("cmd", "list", "-q", env=bob).out.split() == []
    described = det("cmd", "describe", task_id, env=alice)
    assert described.rc == 0 and "QUEUED" in described.out
    config = yaml.safe_load(det("cmd", "config", task_id, env=alice).out)
    assert config["entrypoint"] == ["sh", "run.sh"] and config["resources"]["slots"] == 0
    assert task_id in det("task", "list", env=alice).out
    refused = det("cmd", "kill", task_id, env=bob)
    assert refused.rc == 1 and "not found" in refused.err
    killed = det("cmd", "kill", task_id, env=alice)
    assert killed.rc == 0 and "TERMINATED" in killed.out
    assert task_id not in det("task", "list", env=alice).out


def test_a_bad_config_is_refused_before_anything_is_sent(det: Det, make_user: MakeUser) -> None:
    alice = make_user("alice")
    r = det("cmd", "run", "--config", "resources.slot=0", "true", env=alice)
    assert r.rc == 2 and "resources.slot" in r.err and "did you mean `slots`" in r.err
    r = det("cmd", "run", env=alice)
    assert r.rc == 2 and "needs something to run" in r.err
    assert det("cmd", "list", "-q", env=alice).out.split() == []


def test_a_shell_attaches_with_srun_into_the_tasks_job() -> None:
    from hpc_master.cli.shell import srun_argv

    assert srun_argv("42", "/jobs/tasks/x/work", [], tty=True)[:7] == [
        "srun", "--jobid=42", "--overlap", "--nodes=1", "--ntasks=1", "--quiet", "--pty",
    ]  # fmt: skip
    assert srun_argv("42", None, ["hostname"], tty=False) == [
        "srun", "--jobid=42", "--overlap", "--nodes=1", "--ntasks=1", "--quiet", "hostname",
    ]  # fmt: skip
