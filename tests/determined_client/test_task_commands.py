"""Determined 0.38.1's own client, unmodified, on commands and the other tasks: ``det cmd run -d`` (with a
context directory), ``det cmd list/describe/config/logs/kill``, ``det task list``, ``det notebook list``,
``det tensorboard list``, ``det shell list``. The master here runs no jobs (no lifecycle loop): tasks stay
queued; running them is tests/e2e/test_commands.py's."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.determined_client.conftest import DeterminedClient, OurApi

pytestmark = pytest.mark.determined_client

PASSWORD = "Secret123pw"
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def test_determineds_task_commands(determined: DeterminedClient, our_api: OurApi) -> None:
    user = our_api.create_user("tasks", PASSWORD)
    env = {"DET_USER": user, "DET_PASS": PASSWORD}
    context = determined.home / "ctx"
    context.mkdir()
    (context / "run.sh").write_text("echo from the context\n")
    r = determined.det("cmd", "run", "-d", "--context", str(context), "--config", "resources.slots=0",
                       "sh", "run.sh", env=env)  # fmt: skip
    assert r.rc == 0, r.err
    task_id = r.out.strip().splitlines()[-1]
    assert UUID.match(task_id), r.out
    listed = determined.det("cmd", "list", env=env)
    assert listed.rc == 0 and task_id in listed.out, listed.err
    described = determined.det("cmd", "describe", task_id, "--json", env=env)
    assert described.rc == 0 and task_id in described.out, described.err
    config = determined.det("cmd", "config", task_id, env=env)
    assert config.rc == 0, config.err
    assert yaml.safe_load(config.out)["entrypoint"] == ["sh", "run.sh"]
    tasks = determined.det("task", "list", env=env)
    assert tasks.rc == 0 and task_id in tasks.out, tasks.err
    for kind in ("notebook", "tensorboard", "shell"):
        r = determined.det(kind, "list", env=env)
        assert r.rc == 0, (kind, r.err)
    logs = determined.det("cmd", "logs", task_id, env=env)
    assert logs.rc == 0, logs.err
    killed = determined.det("cmd", "kill", task_id, env=env)
    assert killed.rc == 0, killed.err
    other = our_api.create_user("other", PASSWORD)
    refused = determined.det("cmd", "kill", task_id, env={"DET_USER": other, "DET_PASS": PASSWORD})
    assert refused.rc != 0 and "not found" in refused.out + refused.err


def test_notebook_preview_and_start_and_tensorboard_start(
    determined: DeterminedClient, our_api: OurApi
) -> None:
    """``det notebook start --preview`` prints the completed config and launches nothing; ``det notebook
    start -d`` (which sends ``preview: false``) and ``det tensorboard start -d EXP`` (``trialIds: null``) launch."""
    user = our_api.create_user("nb", PASSWORD)
    env = {"DET_USER": user, "DET_PASS": PASSWORD}
    preview = determined.det("notebook", "start", "--preview", "--config", "resources.slots=0", env=env)
    assert preview.rc == 0, preview.err
    assert yaml.safe_load(preview.out)["resources"]["slots"] == 0
    assert user not in determined.det("notebook", "list", env=env).out  # nothing launched
    started = determined.det("notebook", "start", "-d", "--config", "resources.slots=0", env=env)
    assert started.rc == 0, started.err
    notebook = started.out.strip().splitlines()[-1]
    assert UUID.match(notebook), started.out
    exp = our_api.create_experiment(our_api.login(user, PASSWORD), f"tb-{user}")
    our_api.seed_trials(exp, [{"lr": 0.01}])
    board = determined.det("tensorboard", "start", "-d", str(exp), env=env)
    assert board.rc == 0, board.err
    assert UUID.match(board.out.strip().splitlines()[-1]), board.out
    for kind, task in (("notebook", notebook), ("tensorboard", board.out.strip().splitlines()[-1])):
        assert determined.det(kind, "kill", task, env=env).rc == 0
