"""harness.exec.job_contract: plan.json, the ClusterInfo template and exit.json as records. The JSON the master
writes keeps today's keys exactly, reads back to an equal record, and a bad document is refused naming the field;
exit.json, which the job's owner can write, is read whatever it holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.exec import job_plan as run_files
from harness.exec.job_contract import (
    MAX_TEXT_CHARS,
    ClusterInfoDoc,
    ContractError,
    ExitRecord,
    JobPlan,
    TrialInfoDoc,
)
from harness.exec.job_entry import exit_record, run_job
from hpc_master.expconf import parse_experiment_config
from hpc_master.expconf.tasks import TaskType, parse_task_config
from hpc_master.jobplan import JobPaths, PoolSpec
from hpc_master.taskjob import TaskJobPlan, build_task_job
from hpc_master.trialjob import TrialJobInputs, TrialJobPlan, build_trial_job
from hpc_master.trialjob_files import write_run_dir

PATHS = JobPaths("/shared/jobs", "/shared/checkpoints", "/opt/hpc-det", "/usr/bin/python3")
POOL = PoolSpec(slots_per_node=2)
CLUSTER_INFO_KEYS = {
    *("master_url", "cluster_id", "agent_id", "slot_ids", "task_id", "allocation_id", "session_token"),
    *("task_type", "latest_checkpoint", "container_addrs", "container_rank", "trial"),
}
TRIAL_KEYS = {
    *("trial_id", "experiment_id", "trial_seed", "hparams", "config", "steps_completed", "trial_run_id"),
    "user_data",
}
EXIT_KEYS = {"exitCode", "signal", "preempted", "reason", "stage", "slurmJobId", "finishedAt"}


def trial_job(paths: JobPaths = PATHS, **config: Any) -> TrialJobPlan:
    raw = {
        "entrypoint": "python3 train.py",
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 1}},
        "hyperparameters": {"lr": 0.1},
        "data": {"url": "s3://x"},
        **config,
    }
    trial = TrialJobInputs(
        experiment_id=3, trial_id=7, trial_run_id=2, hparams={"lr": 0.1}, trial_seed=5, owner="me"
    )
    return build_trial_job(
        parse_experiment_config(raw), POOL, trial, paths, master_url="http://m:8080", session_token="tok"
    )


def task_job() -> TaskJobPlan:
    config = parse_task_config(
        {
            "entrypoint": ["python3", "run.py"],
            "resources": {"slots": 1},
            "environment": {"image": "/img.sif"},
        },
        TaskType.COMMAND,
    )
    return build_task_job(
        config,
        TaskType.COMMAND,
        POOL,
        task_id="0a1b2c3d-4e5f",
        argv=["python3", "run.py"],
        paths=PATHS,
        master_url="http://m:8080",
        cluster_id="hpc-det",
        has_context=True,
        max_context_bytes=1 << 20,
    )


def written(job: TrialJobPlan | TaskJobPlan, name: str) -> Any:
    return json.loads(job.files()[name][0])


# -- what the master writes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "job",
    [
        pytest.param(trial_job, id="trial"),
        pytest.param(lambda: trial_job(environment={"image": "docker://a/b"}), id="trial_in_image"),
        pytest.param(task_job, id="task_in_image"),
    ],
)
def test_plan_json_keys_and_round_trip(job: Any) -> None:
    planned = job()
    data = written(planned, run_files.PLAN_FILE)
    optional = {"container"} if planned.plan.container is not None else set()
    assert set(data) == set(run_files.PLAN_KEYS) | optional
    assert data == planned.plan.to_json()
    assert JobPlan.from_json(data) == planned.plan
    assert JobPlan.from_json(planned.plan.to_json()).to_json() == data


def test_cluster_info_keys_and_round_trip() -> None:
    trial, task = trial_job(), task_job()
    info = written(trial, run_files.CLUSTER_INFO_TEMPLATE_FILE)
    assert set(info) == CLUSTER_INFO_KEYS and set(info["trial"]) == TRIAL_KEYS
    assert info["trial"]["user_data"] == {"url": "s3://x"} and info["session_token"] == ""
    assert ClusterInfoDoc.from_json(info) == trial.cluster_info
    assert isinstance(trial.cluster_info.trial, TrialInfoDoc)
    task_info = written(task, run_files.CLUSTER_INFO_TEMPLATE_FILE)
    assert set(task_info) == CLUSTER_INFO_KEYS and task_info["trial"] is None
    assert task_info["task_type"] == "COMMAND" and task_info["slot_ids"] == [0]
    assert ClusterInfoDoc.from_json(task_info) == task.cluster_info
    on_nodes = trial.cluster_info.on_nodes(["10.0.0.1", "10.0.0.2"]).to_json()
    assert on_nodes == {**info, "container_addrs": ["10.0.0.1", "10.0.0.2"], "container_rank": 0}


def test_exit_record_keys_and_round_trip() -> None:
    record = exit_record(code=0, stage="entrypoint", reason="completed", preempted=False, signum=15)
    data = json.loads(json.dumps(record.to_json()))
    assert set(data) == EXIT_KEYS
    assert data["signal"] == "SIGTERM" and data["finishedAt"].endswith("Z")
    assert ExitRecord.from_json(data) == record


# -- refusals that name the field ----------------------------------------------------------------------------


def _plan_json() -> dict[str, Any]:
    return trial_job().plan.to_json()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"version": 2}, "version"),
        ({"version": True}, "version"),
        ({"slots_per_trial": "2"}, "slots_per_trial"),
        ({"slots_per_trial": False}, "slots_per_trial"),
        ({"entrypoint": ["python3", 7]}, "entrypoint[1]"),
        ({"entrypoint": {"cmd": "x"}}, "entrypoint"),
        ({"python": None}, "python"),
        ({"context_archive": 5}, "context_archive"),
        ({"env": ["A=1"]}, "env"),
        ({"env": {"A": 1}}, "env.A"),
        ({"user_env": {"B": None}}, "user_env.B"),
        ({"container": "docker://x"}, "container"),
    ],
)
def test_plan_refusals_name_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ContractError) as e:
        JobPlan.from_json({**_plan_json(), **change})
    assert e.value.field == field
    assert field in str(e.value) and str(e.value).startswith(run_files.PLAN_FILE)


def test_plan_refusals_of_missing_keys_and_non_objects() -> None:
    plan = _plan_json()
    del plan["workdir"], plan["env"]
    with pytest.raises(ContractError, match="lacks workdir, env"):
        JobPlan.from_json(plan)
    for bad in (None, [], "plan", 1):
        with pytest.raises(ContractError, match="is not a JSON object"):
            JobPlan.from_json(bad)
    assert JobPlan.from_json({**_plan_json(), "future_key": 1}) == trial_job().plan  # unknown keys: ignored


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"slot_ids": ["0"]}, "slot_ids[0]"),
        ({"container_rank": "0"}, "container_rank"),
        ({"latest_checkpoint": 3}, "latest_checkpoint"),
        ({"trial": []}, "trial"),
        ({"trial": {"trial_id": 7}}, ""),  # lacks the rest: named in the message
    ],
)
def test_cluster_info_refusals_name_the_field(change: dict[str, Any], field: str) -> None:
    info = {**trial_job().cluster_info.to_json(), **change}
    with pytest.raises(ContractError) as e:
        ClusterInfoDoc.from_json(info)
    assert e.value.field == field
    if not field:
        assert "lacks trial.experiment_id" in str(e.value)


def test_cluster_info_refuses_a_bad_trial_part() -> None:
    info = trial_job().cluster_info.to_json()
    info["trial"]["hparams"] = [1, 2]
    with pytest.raises(ContractError) as e:
        ClusterInfoDoc.from_json(info)
    assert e.value.field == "trial.hparams"


def test_job_entry_fails_its_setup_naming_the_field(tmp_path: Path) -> None:
    paths = JobPaths(str(tmp_path / "jobs"), str(tmp_path / "ck"), "/opt/hpc-det", "/usr/bin/python3")
    job = trial_job(paths)
    write_run_dir(job, paths.job_storage_root)
    plan_path = Path(job.run_dir) / run_files.PLAN_FILE
    plan_path.write_text(json.dumps({**job.plan.to_json(), "max_context_bytes": "1G"}))
    code, record = run_job(job.run_dir, {})
    assert (code, record.stage) == (1, "plan")
    assert record.reason == f"{plan_path}: max_context_bytes must be an integer, not str"

    plan_path.write_text(json.dumps(job.plan.to_json()))
    template = Path(job.run_dir) / run_files.CLUSTER_INFO_TEMPLATE_FILE
    template.write_text(json.dumps({**job.cluster_info.to_json(), "slot_ids": "0,1"}))
    env = {"SLURM_JOB_NODELIST": "localhost", "DET_RESOLVE_OVERRIDE": "localhost=10.1.2.3"}
    code, record = run_job(job.run_dir, env)
    assert (code, record.stage) == (1, "cluster_info")
    assert record.reason == f"{template}: slot_ids must be a list, not str"


# -- exit.json is the job owner's: read whatever it holds ---------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        None,
        [],
        "exit",
        3,
        {},
        {"exitCode": "0", "signal": [], "preempted": "yes", "reason": 5, "stage": {}, "slurmJobId": 42},
        {"exitCode": True, "preempted": 1, "finishedAt": None},
        {"signal": 10**30},
        {"signal": -9},
        {"signal": 0},
        {"signal": True},
        {"exitCode": 10**100},
        {1: 2, "reason": ["x"] * 1000},
        {"reason": {"nested": {"deeper": [1, {"x": None}]}}},
    ],
)
def test_exit_record_never_raises(data: object) -> None:
    record = ExitRecord.from_json(data)
    assert isinstance(record, ExitRecord)
    assert set(record.to_json()) == EXIT_KEYS
    assert record.preempted in (None, True, False) and not isinstance(record.exit_code, bool)
    for text in (record.signal, record.reason, record.stage, record.slurm_job_id, record.finished_at):
        assert text is None or isinstance(text, str)


def test_exit_record_keeps_what_it_can_and_cuts_long_texts() -> None:
    huge = "x" * (MAX_TEXT_CHARS * 1000)
    record = ExitRecord.from_json(
        {"exitCode": "1", "signal": 15, "preempted": True, "reason": huge, "stage": "entrypoint", "extra": 1}
    )
    assert record.exit_code is None and record.signal == "SIGTERM" and record.preempted is True
    assert record.reason == "x" * MAX_TEXT_CHARS and record.stage == "entrypoint"
    assert ExitRecord.from_json({"signal": "USR1"}).signal == "USR1"  # as written: the reader names it
