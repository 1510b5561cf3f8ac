"""Commands (``/api/v1/commands``, ``/api/v1/tasks``) against the real API and database and a scripted Slurm.

Every Slurm behaviour here has its twin on the local cluster (tests/e2e/test_commands.py): a command's output
and exit code, a kill, a refused job. The auth matrix and the bad inputs are this file's alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from harness.exec import serve_door
from hpc_master.asuser import AsUser, RunFiles
from hpc_master.db.engine import transaction
from hpc_master.db.models import TaskModel
from hpc_master.lifecycle.job_host import PLATFORM_ROOT
from hpc_master.lifecycle.loop import LifecycleLoop
from hpc_master.lifecycle.slurm_jobs import SlurmJobs
from hpc_master.masterconf import MasterConfig
from hpc_master.services.lifecycle import mint_trial_token
from hpc_master.tasks import service as task_svc
from hpc_master.tasks.driver import TaskDriver
from slurm_backend import Poller, SlurmCli
from slurm_backend.fake import FakeCluster
from tests.master.helpers import context_file, login, make_user, seed_trial

POLL_S = 10.0


class World:
    def __init__(self, client: TestClient, sessions: sessionmaker[Session], config: MasterConfig) -> None:
        self.client, self.sessions, self.config = client, sessions, config
        self.cluster = FakeCluster(sleep=lambda _s: None)
        self.admin = login(client)
        self.restart()

    def restart(self) -> None:
        """A new master's loop on the same database (what survives is what was committed)."""
        cli = SlurmCli(runner=self.cluster, sleep=lambda _s: None)
        poller = Poller(cli, interval_s=POLL_S, clock=self.cluster.monotonic)
        self.driver = TaskDriver(
            self.sessions, self.config, cli, poller,
            job_storage_root=str(self.config.job_storage_dir()), platform_root=PLATFORM_ROOT,
            python="/usr/bin/python3", master_url="http://master:8080", cluster_id="test-cluster",
            as_user=AsUser(
                RunFiles(str(self.config.job_storage_dir())), SlurmJobs(cli, poller, clock=self.cluster.monotonic)
            ),
        )  # fmt: skip
        self.driver.acts_for_users = False  # jobs run as the master's account (tests may run as root)
        self.client.app.state.det.acts_for_users = False  # type: ignore[attr-defined]
        self.loop = LifecycleLoop(self.sessions, None, tasks=self.driver)

    def tick(self, times: int = 1) -> None:
        for _ in range(times):
            self.cluster.advance(POLL_S)
            self.loop.tick()

    def run(self, headers: dict[str, str], entrypoint: Any = "echo hi", **body: Any) -> dict[str, Any]:
        config = body.pop("config", {})
        r = self.client.post(
            "/api/v1/commands", headers=headers, json={"config": {"entrypoint": entrypoint, **config}, **body}
        )
        assert r.status_code == 200, r.text
        return dict(r.json()["command"])

    def task(self, task_id: str) -> TaskModel:
        with transaction(self.sessions) as s:
            task = s.get(TaskModel, task_id)
            assert task is not None
            s.expunge(task)
            return task

    def job_id(self, task_id: str) -> str:
        job_id = self.task(task_id).slurm_job_id
        assert job_id is not None
        return job_id

    def write_exit(self, task_id: str, code: int, reason: str) -> None:
        run_dir = Path(self.task(task_id).run_dir)
        (run_dir / "exit.json").write_text(
            json.dumps({"exitCode": code, "reason": reason, "stage": "entrypoint"})
        )


@pytest.fixture
def world(client: TestClient, sessions: sessionmaker[Session], config: MasterConfig) -> World:
    return World(client, sessions, config)


def test_a_command_runs_as_one_job_in_its_context_and_ends_with_its_exit_code(world: World) -> None:
    files = [context_file("data/input.txt", b"42\n")]
    cmd = world.run(world.admin, ["python3", "-c", "import sys; sys.exit(3)"], files=files)
    assert cmd["state"] == "STATE_QUEUED" and cmd["jobId"] == ""
    world.tick()
    job_id = world.job_id(cmd["id"])
    job = world.cluster.job(job_id)
    run_dir = Path(world.task(cmd["id"]).run_dir)
    assert run_dir.parent == world.config.job_storage_dir() / "tasks"
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["entrypoint"] == ["python3", "-c", "import sys; sys.exit(3)"]
    assert (
        plan["context_archive"] == str(run_dir / "context.tar.gz") and (run_dir / "context.tar.gz").exists()
    )
    assert plan["env"]["DET_TASK_ID"] == cmd["id"] and plan["env"]["DET_TASK_TYPE"] == "COMMAND"
    assert "--signal" not in job.script  # a command is never asked to checkpoint
    assert f"task={cmd['id']}" in job.comment
    assert "--gres=gpu:1" in job.script  # Determined's default: a command gets one slot

    world.cluster.start(job_id, nodes="node2")
    world.tick()
    running = world.client.get(f"/api/v1/commands/{cmd['id']}", headers=world.admin).json()["command"]
    assert running["state"] == "STATE_RUNNING" and running["nodeList"] == "node2"

    world.write_exit(cmd["id"], 3, "the entrypoint exited with code 3")
    world.cluster.fail(job_id, exit_code=3)
    world.tick()
    ended = world.client.get(f"/api/v1/commands/{cmd['id']}", headers=world.admin).json()["command"]
    assert ended["state"] == "STATE_TERMINATED" and ended["exitCode"] == 3
    assert "exited with code 3" in ended["exitStatus"] and ended["endTime"]
    assert world.cluster.count("sbatch") == 1
    with transaction(world.sessions) as s:  # the archive was written out: the row no longer holds it
        assert s.scalar(select(TaskModel.context_archive).where(TaskModel.id == cmd["id"])) is None


def test_one_word_is_a_shell_command_line_and_slots_zero_asks_for_no_gpu(world: World) -> None:
    cmd = world.run(world.admin, ["echo $HOSTNAME; exit 4"], config={"resources": {"slots": 0}})
    world.tick()
    job = world.cluster.job(world.job_id(cmd["id"]))
    plan = json.loads((Path(world.task(cmd["id"]).run_dir) / "plan.json").read_text())
    assert plan["entrypoint"] == ["/bin/sh", "-c", "echo $HOSTNAME; exit 4"]
    assert "gpu" not in job.script


def test_kill_cancels_the_job_and_the_command_ends_killed(world: World) -> None:
    cmd = world.run(world.admin, "sleep 600")
    world.tick()
    job_id = world.job_id(cmd["id"])
    world.cluster.start(job_id)
    world.tick()
    r = world.client.post(f"/api/v1/commands/{cmd['id']}/kill", headers=world.admin)
    assert r.status_code == 200 and r.json()["command"]["state"] == "STATE_TERMINATING"
    world.tick(2)
    assert world.cluster.job(job_id).state == "CANCELLED"
    ended = world.task(cmd["id"])
    assert ended.state == "STATE_TERMINATED" and "killed by the user" in (ended.exit_status or "")
    again = world.client.post(f"/api/v1/commands/{cmd['id']}/kill", headers=world.admin)
    assert again.status_code == 200 and again.json()["command"]["state"] == "STATE_TERMINATED"


def test_a_command_killed_before_its_job_was_asked_for_ends_at_once_and_never_reaches_slurm(
    world: World,
) -> None:
    cmd = world.run(world.admin, "sleep 600")
    r = world.client.post(f"/api/v1/commands/{cmd['id']}/kill", headers=world.admin)
    assert r.json()["command"]["state"] == "STATE_TERMINATED"
    world.tick(2)
    assert world.cluster.count("sbatch") == 0


def test_a_refused_job_ends_the_command_with_slurms_words(world: World) -> None:
    cmd = world.run(world.admin, "true", config={"slurm": {"partition": "nosuch"}})
    world.tick()
    ended = world.task(cmd["id"])
    assert ended.state == "STATE_TERMINATED" and ended.slurm_job_id is None
    assert "Invalid partition" in (ended.exit_status or "")


@pytest.mark.storage  # counting and adoption queries
def test_a_lost_sbatch_answer_is_adopted_by_its_comment_not_submitted_twice(world: World) -> None:
    comment = "hpc-det:testcluster:task={}"
    # The answer is lost, and Slurm has the job: it is adopted at once.
    first = world.run(world.admin, "true")
    world.cluster.lose_next_submit_answer()
    world.tick()
    assert world.job_id(first["id"]) == world.cluster.by_comment(comment.format(first["id"]))[0].job_id
    # The answer is lost and the controller stops answering: the task waits, marked as maybe submitted.
    cmd = world.run(world.admin, "true")
    world.cluster.lose_next_submit_answer(then_controller_down=True)
    world.tick()
    task = world.task(cmd["id"])
    assert task.slurm_job_id is None and task.submit_attempted
    assert task.pending_reason == "SlurmControllerUnavailable"
    world.restart()  # a master restart in between changes nothing: the mark was committed
    world.cluster.restart_controller()
    world.tick()
    assert world.cluster.count("sbatch") == 2  # one per command: neither was submitted twice
    assert world.job_id(cmd["id"]) == world.cluster.by_comment(comment.format(cmd["id"]))[0].job_id


def test_queued_tasks_wait_out_an_outage_behind_the_masters_backoff(world: World) -> None:
    """The trials' backoff, for tasks: while the controller does not answer, one sbatch finds that out and
    the other tasks wait without asking; each is submitted once it is back."""
    world.cluster.kill_controller()
    cmds = [world.run(world.admin, "true") for _ in range(3)]
    world.tick()
    # One task's try, not one per task (a refusal that never reached the controller is tried twice by
    # slurm_backend.cli: 2 sbatch runs; without the gate, 6).
    one_try = world.cluster.count("sbatch")
    assert one_try == 2
    assert {world.task(c["id"]).pending_reason for c in cmds} == {"SlurmControllerUnavailable"}
    world.tick(3)  # 30 s: the backoff (5 s doubling) lets one try through now and then, never one per task
    assert world.cluster.count("sbatch") <= 3 * one_try
    world.cluster.restart_controller()
    world.tick(3)
    jobs = [world.job_id(c["id"]) for c in cmds]
    assert len(set(jobs)) == 3
    assert sum(1 for c in world.cluster.calls if "sbatch" in c.argv and c.returncode == 0) == 3


def _by_comment_queries(cluster: FakeCluster) -> int:
    return sum(1 for c in cluster.calls if "--format=%A|%k" in c.argv)


def test_tasks_maybe_submitted_before_a_restart_are_looked_for_with_one_squeue(world: World) -> None:
    """After a crash between the committed mark and sbatch's answer, every marked task is looked for by its
    comment: one squeue for all of them (per Unix account), not one per task."""
    cmds = [world.run(world.admin, "true") for _ in range(3)]
    with transaction(world.sessions) as s:
        for c in cmds:
            task = s.get(TaskModel, c["id"])
            assert task is not None
            task.submit_attempted = True
    # The first one's sbatch had reached Slurm before the crash.
    comment = f"hpc-det:testcluster:task={cmds[0]['id']}"
    SlurmCli(runner=world.cluster).submit(f"#!/bin/bash\n#SBATCH --comment={comment}\ntrue\n")
    world.restart()
    world.tick()
    assert _by_comment_queries(world.cluster) == 1
    assert world.job_id(cmds[0]["id"]) == world.cluster.by_comment(comment)[0].job_id  # adopted
    assert world.cluster.count("sbatch") == 3  # the one before the crash, and one for each other task
    assert len({world.job_id(c["id"]) for c in cmds}) == 3


def test_task_logs_stream_the_jobs_output(world: World) -> None:
    cmd = world.run(world.admin, "echo hi")
    world.tick()
    run_dir = Path(world.task(cmd["id"]).run_dir)
    (run_dir / "output.log").write_text("[job_entry] running echo hi\nhi\nthere\n")
    r = world.client.get(f"/api/v1/tasks/{cmd['id']}/logs", headers=world.admin)
    lines = [json.loads(x)["result"] for x in r.text.splitlines()]
    assert [x["log"] for x in lines] == ["[job_entry] running echo hi", "hi", "there"]
    assert {x["taskId"] for x in lines} == {cmd["id"]}
    world.write_exit(cmd["id"], 0, "completed")
    world.cluster.complete(world.job_id(cmd["id"]))
    world.tick()
    followed = world.client.get(f"/api/v1/tasks/{cmd['id']}/logs?follow=true", headers=world.admin)
    assert len(followed.text.splitlines()) == 3  # the stream ends: the task has ended
    summaries = world.client.get("/api/v1/tasks", headers=world.admin).json()["allocationIdToSummary"]
    assert summaries == {}  # `det task list`: only tasks that have not ended


def test_auth_matrix(world: World) -> None:
    alice = make_user(world.client, world.admin, "alice")
    bob = make_user(world.client, world.admin, "bob")
    mine = world.run(alice, "echo alice")
    trial_id = seed_trial(world.sessions, "carol")
    with transaction(world.sessions) as s:
        trial_headers = {"Authorization": f"Bearer {mint_trial_token(s, trial_id)}"}
    routes = [
        ("POST", "/api/v1/commands", {"config": {"entrypoint": "true"}}),
        ("GET", "/api/v1/commands", None),
        ("GET", f"/api/v1/commands/{mine['id']}", None),
        ("POST", f"/api/v1/commands/{mine['id']}/kill", None),
        ("GET", "/api/v1/tasks", None),
        ("GET", f"/api/v1/tasks/{mine['id']}", None),
        ("GET", f"/api/v1/tasks/{mine['id']}/logs", None),
    ]
    for method, path, body in routes:
        assert world.client.request(method, path, json=body).status_code == 401, path
        assert world.client.request(method, path, json=body, headers=trial_headers).status_code == 403, path
    for method, path, body in routes[2:4] + routes[5:]:
        r = world.client.request(method, path, json=body, headers=bob)
        assert r.status_code == 404 and "not found" in r.json()["message"], path
    assert world.client.get("/api/v1/commands", headers=bob).json()["commands"] == []
    assert [c["id"] for c in world.client.get("/api/v1/commands", headers=alice).json()["commands"]] == [
        mine["id"]
    ]
    assert world.client.get("/api/v1/tasks", headers=bob).json()["allocationIdToSummary"] == {}
    assert world.task(mine["id"]).state == "STATE_QUEUED"  # bob's kill did nothing
    # An admin reaches everyone's; `users` narrows the list.
    assert world.client.get(f"/api/v1/commands/{mine['id']}", headers=world.admin).status_code == 200
    listed = world.client.get("/api/v1/commands", params={"users": "alice"}, headers=world.admin).json()
    assert [c["username"] for c in listed["commands"]] == ["alice"]
    assert world.client.get("/api/v1/commands/not-a-uuid", headers=alice).status_code == 400


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"config": {"entrypoint": "true", "resources": {"slot": 1}}}, "resources.slot", "did you mean `slots`"),
        ({"config": {"entrypoint": "true", "slurm": {"partiton": "x"}}}, "slurm.partiton", "`partition`"),
        ({"config": {"resources": {"slots": 0}}}, "entrypoint", "needs something to run"),
        ({"config": {"entrypoint": ["  "]}}, "entrypoint", "empty"),
        ({"config": {"entrypoint": "true", "resources": {"resource_pool": "gpus"}}}, "resources.resource_pool", "unknown resource pool"),
        ({"config": {"entrypoint": "true"}, "templateName": "t"}, "templateName", "no config templates"),
        ({"config": {"entrypoint": "true"}, "files": [context_file("../escape.py")]}, None, ".."),
        ({"config": {"entrypoint": "true", "slurm": {"sbatch_args": ["--uid=0"]}}}, "slurm.sbatch_args", ""),
    ],
)  # fmt: skip
def test_bad_input_is_refused_with_the_field_and_stores_nothing(
    world: World, body: dict[str, Any], field: str | None, words: str
) -> None:
    r = world.client.post("/api/v1/commands", headers=world.admin, json=body)
    assert r.status_code == 400, r.text
    answer = r.json()
    assert words in answer["message"]
    if field is not None:
        assert answer.get("field", "").startswith(field) or field in answer["message"]
    with transaction(world.sessions) as s:
        assert s.scalar(select(TaskModel.id)) is None
    assert not (world.config.job_storage_dir() / "tasks").exists()


@pytest.mark.storage  # counting and adoption queries
def test_one_user_has_at_most_so_many_live_tasks(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(task_svc, "MAX_LIVE_TASKS_PER_USER", 2)
    first = world.run(world.admin, "true")
    world.run(world.admin, "true")
    r = world.client.post("/api/v1/commands", headers=world.admin, json={"config": {"entrypoint": "true"}})
    assert r.status_code == 400 and "most one user may have" in r.json()["message"]
    world.client.post(f"/api/v1/commands/{first['id']}/kill", headers=world.admin)
    world.run(world.admin, "true")  # an ended task frees its place


def _experiment_with_trial(world: World, headers: dict[str, str]) -> tuple[int, int]:
    from tests.master.helpers import create_experiment

    exp_id = create_experiment(world.client, headers)
    with transaction(world.sessions) as s:
        from hpc_master.services.lifecycle import create_trial

        trial = create_trial(s, exp_id, "r1", {"lr": 0.1})
        return exp_id, trial.id


def test_a_tensorboard_serves_the_trials_directories_from_the_records(world: World) -> None:
    alice = make_user(world.client, world.admin, "alice")
    exp_id, trial_id = _experiment_with_trial(world, alice)
    r = world.client.post("/api/v1/tensorboards", headers=alice, json={"experimentIds": [exp_id]})
    assert r.status_code == 200, r.text
    tb = r.json()["tensorboard"]
    assert tb["description"] == f"TensorBoard (experiment {exp_id})" and not tb["isReady"]
    world.tick()
    run_dir = Path(world.task(tb["id"]).run_dir)
    plan = json.loads((run_dir / "plan.json").read_text())
    storage = world.config.checkpoint_dir()
    assert plan["entrypoint"][1:] == [
        "-m", "harness.exec.serve", "tensorboard",
        f"--logdir_spec=exp-{exp_id}/trial-{trial_id}:{storage}/tensorboard/experiment/{exp_id}/trial/{trial_id}",
    ]  # fmt: skip
    token = run_dir / "service_token"
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text().strip()) >= 32
    assert token.read_text().strip() == world.task(tb["id"]).service_token  # the proxy's copy is the record
    assert "gpu" not in world.cluster.job(world.job_id(tb["id"])).script  # a TensorBoard needs no GPU
    bob = make_user(world.client, world.admin, "bob")
    for body, status in [
        ({"experimentIds": [exp_id]}, 404),  # not bob's
        ({"trialIds": [trial_id]}, 404),
        ({"experimentIds": [99999]}, 404),
        ({}, 400),
    ]:
        refused = world.client.post("/api/v1/tensorboards", headers=bob, json=body)
        assert refused.status_code == status, (body, refused.text)
    assert world.client.post("/api/v1/commands", headers=bob, json={"config": {"entrypoint": "x"},
                             "experimentIds": [1]}).status_code == 400  # fmt: skip


def test_a_server_is_ready_once_its_door_proves_the_token_and_an_idle_one_is_ended(
    world: World, tmp_path: Path
) -> None:
    import datetime as dt
    import socket

    r = world.client.post(
        "/api/v1/tensorboards", headers=world.admin,
        json={"experimentIds": [_experiment_with_trial(world, world.admin)[0]], "config": {"idle_timeout": "5m"}},
    )  # fmt: skip
    task_id = r.json()["tensorboard"]["id"]
    world.tick()
    job_id = world.job_id(task_id)
    world.cluster.start(job_id, nodes="localhost")  # the node Slurm placed the job on
    world.tick()
    assert not world.client.get(f"/api/v1/tensorboards/{task_id}", headers=world.admin).json()["tensorboard"][
        "isReady"
    ]
    run_dir = Path(world.task(task_id).run_dir)

    def announce(port: int) -> None:
        # The job's file names a host of the user's choosing: only its port counts, on Slurm's node.
        (run_dir / "service.json").write_text(json.dumps({"host": "203.0.113.9", "port": port, "pid": 1}))
        world.tick()

    with socket.socket() as listener:  # something answers on the port, but not the task's server
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        announce(listener.getsockname()[1])
    impostor = serve_door.open_door("not-the-token", f"/proxy/{task_id}/", str(tmp_path / "none.sock"))
    announce(impostor)
    assert world.task(task_id).service_address is None  # neither proved it holds the task's token
    token = world.task(task_id).service_token
    assert token
    port = serve_door.open_door(token, f"/proxy/{task_id}/", str(tmp_path / "none.sock"))
    announce(port)
    tb = world.client.get(f"/api/v1/tensorboards/{task_id}", headers=world.admin).json()["tensorboard"]
    assert tb["isReady"] and tb["serviceAddress"] == f"/proxy/{task_id}/"
    assert world.task(task_id).service_address == f"localhost:{port}"
    now = world.task(task_id).last_activity
    assert now is not None
    assert world.driver.end_idle(now + dt.timedelta(seconds=299)) == 0
    assert world.driver.end_idle(now + dt.timedelta(seconds=301)) == 1
    world.tick(2)
    ended = world.task(task_id)
    assert ended.state == "STATE_TERMINATED" and world.cluster.job(job_id).state == "CANCELLED"
    assert (ended.exit_status or "").startswith("idle for 301 s, over its idle timeout of 300 s")
