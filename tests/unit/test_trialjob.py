"""build_trial_job: golden sbatch scripts (DET_UPDATE_GOLDEN=1 rewrites them), env, cluster info, run-dir files."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from harness.exec import job_plan as run_files
from hpc_master.errors import ClientError, ConfigError
from hpc_master.expconf import parse_experiment_config
from hpc_master.masterconf import parse_master_config
from hpc_master.trialjob import (
    JobPaths,
    PoolSpec,
    TrialJobInputs,
    TrialJobPlan,
    build_trial_job,
    job_comment,
    pool_from_master_config,
)
from hpc_master.trialjob_files import write_run_dir

GOLDEN = Path(__file__).parent / "golden" / "trialjob"
PATHS = JobPaths(
    job_storage_root="/shared/det/jobs",
    checkpoint_root="/shared/det/checkpoints",
    platform_root="/opt/hpc-det",
    python="/opt/hpc-det/.venv/bin/python",
)
GPU_POOL = PoolSpec(
    name="gpu", partition="batch", slots_per_node=2, default_time_limit_min=240, gpu_type="a100"
)
CPU_POOL = PoolSpec(
    name="cpu", partition="short", slots_per_node=0, gpu_request_style="none", mem_per_node_mb=4096
)
TOKEN = "tok-SECRET-1234"
SEARCHER = {"name": "single", "metric": "loss", "max_length": {"batches": 100}}


def config(**overrides: Any) -> Any:
    data: dict[str, Any] = {
        "entrypoint": "python3 train.py",
        "searcher": SEARCHER,
        "hyperparameters": {"lr": 0.1},
        **overrides,
    }
    return parse_experiment_config(data)


def trial(**overrides: Any) -> TrialJobInputs:
    base: dict[str, Any] = {
        "experiment_id": 3,
        "trial_id": 7,
        "trial_run_id": 2,
        "hparams": {"lr": 0.1},
        "trial_seed": 42,
        "owner": "researcher",
        "context_archive": "/shared/det/jobs/exp-3/context.tar.gz",
    }
    return TrialJobInputs(**{**base, **overrides})


def build(cfg: Any, pool: PoolSpec = GPU_POOL, **trial_overrides: Any) -> TrialJobPlan:
    return build_trial_job(
        cfg, pool, trial(**trial_overrides), PATHS, master_url="http://10.77.0.1:8080", session_token=TOKEN
    )


PLANS = {
    "one_slot": lambda: build(config()),
    "four_slots_torch_distributed": lambda: build(
        config(
            entrypoint="python3 -m determined.launch.torch_distributed python3 train.py",
            resources={"slots_per_trial": 4},
            slurm={"time_limit": "1:00:00", "sbatch_args": ["--constraint=ib", "--exclusive"]},
        ),
        latest_checkpoint="0b1c2d3e-uuid",
        steps_completed=500,
    ),
    "cpu_only_pool": lambda: build(config(resources={"slots_per_trial": 0}), CPU_POOL),
    "legacy_trial_class": lambda: build(
        config(entrypoint="model_def:MNistTrial", resources={"slots_per_trial": 2}, slurm={"qos": "high"})
    ),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_script_matches_golden(name: str) -> None:
    plan = PLANS[name]()
    golden = GOLDEN / f"{name}.sbatch"
    if os.environ.get("DET_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(plan.script)
    assert plan.script == golden.read_text()


@pytest.mark.parametrize("name", sorted(PLANS))
def test_token_never_in_script_or_plan(name: str) -> None:
    plan = PLANS[name]()
    assert TOKEN not in plan.script
    assert TOKEN not in json.dumps(plan.plan.to_json())
    assert TOKEN not in json.dumps(plan.cluster_info.to_json())
    assert TOKEN not in repr(plan)
    assert plan.files()[run_files.TOKEN_FILE] == (TOKEN + "\n", 0o600)


def test_shape_gpus_and_names() -> None:
    plan = PLANS["four_slots_torch_distributed"]()
    spec = plan.spec
    assert (spec.nodes, spec.gpus_per_node, spec.ntasks_per_node) == (2, 2, 1)
    assert spec.job_name == "det-e3-t7"
    assert spec.comment == "hpc-det:hpcdet:exp=3,trial=7,run=2"  # the default cluster id, "hpc-det"
    assert spec.output_path == "/shared/det/jobs/exp-3/trial-7/run-2/output.log"
    assert spec.time_limit_min == 60
    assert "#SBATCH --signal=B:USR1@300\n" in plan.script
    assert "#SBATCH --no-requeue\n" in plan.script
    assert plan.command == (PATHS.python, "-S", "-m", "harness.exec.job_entry", "--run-dir", plan.run_dir)


def test_job_comments_tell_masters_apart() -> None:
    """Personal masters share a cluster and all have an experiment 1: a restarted master must not adopt
    another master's job (the e2e kill -9 test once adopted a job of the previous test's master)."""
    a = job_comment("1b4e28ba-2fa1-11d2-883f-0016d3cca427", 1, 3, 1)
    b = job_comment("6fa459ea-ee8a-3ca4-894e-db77e160355e", 1, 3, 1)
    assert a == "hpc-det:1b4e28ba2fa1:exp=1,trial=3,run=1" and a != b
    assert a != job_comment("1b4e28ba-2fa1-11d2-883f-0016d3cca427", 1, 3, 2)


def test_config_slots_per_node_overrides_pool() -> None:
    plan = build(config(resources={"slots_per_trial": 4}, slurm={"slots_per_node": 4}))
    assert (plan.spec.nodes, plan.spec.gpus_per_node) == (1, 4)


def test_mpi_launcher_gets_one_task_per_slot() -> None:
    plan = build(
        config(
            entrypoint="python3 -m determined.launch.horovod python3 train.py",
            resources={"slots_per_trial": 4},
        )
    )
    assert (plan.spec.nodes, plan.spec.ntasks_per_node) == (2, 2)


def test_env_and_cluster_info() -> None:
    cfg = config(
        resources={"slots_per_trial": 4},
        environment={"environment_variables": {"cuda": ["NCCL_DEBUG=INFO"], "cpu": ["X=1"]}},
        data={"url": "s3://x"},
    )
    plan = build(cfg, latest_checkpoint="ck-1", steps_completed=10)
    env = dict(plan.env)
    assert env["PYTHONPATH"] == "/opt/hpc-det/determined_compat:/opt/hpc-det"
    assert env["DET_ALLOCATION_ID"] == "7.2"
    assert env["DET_LATEST_CHECKPOINT"] == "ck-1"
    assert env["DET_CLUSTER_INFO"] == "/shared/det/jobs/exp-3/trial-7/run-2/cluster_info.json"
    assert env["DET_JOB_STORAGE"] == "/shared/det/jobs/exp-3/trial-7"
    assert env["DET_STORAGE_ROOT"] == "/shared/det/checkpoints"
    assert plan.user_env == {"NCCL_DEBUG": "INFO"}
    info = plan.cluster_info.to_json()
    assert info["slot_ids"] == [0, 1]
    assert info["allocation_id"] == "7.2"
    assert info["trial"]["hparams"] == {"lr": 0.1}
    assert info["trial"]["steps_completed"] == 10
    assert info["trial"]["user_data"] == {"url": "s3://x"}
    assert info["trial"]["config"]["resources"]["slots_per_trial"] == 4
    assert set(plan.plan.to_json()) == set(run_files.PLAN_KEYS)
    assert plan.plan.workdir == "/shared/det/jobs/exp-3/trial-7/work"


def test_checkpoint_storage_from_config() -> None:
    cfg = config(checkpoint_storage={"type": "shared_fs", "host_path": "/lustre/ck", "storage_path": "proj"})
    assert dict(build(cfg).env)["DET_STORAGE_ROOT"] == "/lustre/ck/proj"


def test_preempt_lead_is_capped_at_half_the_time_limit() -> None:
    plan = build(config(slurm={"time_limit": 2}))
    assert "#SBATCH --signal=B:USR1@60\n" in plan.script


def test_time_limit_over_pool_max_is_refused() -> None:
    pool = PoolSpec(slots_per_node=2, max_time_limit_min=120)
    with pytest.raises(ConfigError, match="over the 'default' pool's limit of 120") as e:
        build(config(slurm={"time_limit": "3:00:00"}), pool)
    assert e.value.field == "slurm.time_limit"


@pytest.mark.parametrize(
    ("overrides", "pool", "message"),
    [
        ({"resources": {"slots_per_trial": 2}}, CPU_POOL, "CPU-only"),
        ({"resources": {"slots_per_trial": 3}}, GPU_POOL, "not a multiple"),
        ({"slurm": {"sbatch_args": ["--nodes=3"]}}, GPU_POOL, "--nodes is set by hpc-det"),
        ({"slurm": {"sbatch_args": ["--partition", "x"]}}, GPU_POOL, "use slurm.partition"),
    ],
)
def test_refusals(overrides: dict[str, Any], pool: PoolSpec, message: str) -> None:
    with pytest.raises(ClientError, match=message):
        build(config(**overrides), pool)


def test_pool_from_master_config() -> None:
    master = parse_master_config(
        {
            "resource_pools": {
                "gpu": {
                    "partition": "batch",
                    "slots_per_node": 4,
                    "default_time_limit": "2:00:00",
                    "mem_per_node": "16G",
                }
            },
            "default_resource_pool": "gpu",
            "preemption": {"signal": "USR2", "lead_time_s": 120},
        },
        env={},
    )
    pool = pool_from_master_config(master)
    assert pool == PoolSpec(
        name="gpu",
        partition="batch",
        slots_per_node=4,
        default_time_limit_min=120,
        mem_per_node_mb=16384,
        preempt_signal="SIGUSR2",
        preempt_lead_s=120,
        priority_nice_step=10,  # the default
    )
    with pytest.raises(ConfigError, match="unknown resource pool 'nope'"):
        pool_from_master_config(master, "nope")


def test_write_run_dir(tmp_path: Path) -> None:
    paths = JobPaths(str(tmp_path / "jobs"), str(tmp_path / "ck"), "/opt/hpc-det", "/usr/bin/python3")
    plan = build_trial_job(config(), GPU_POOL, trial(), paths, master_url="http://m", session_token=TOKEN)
    write_run_dir(plan, paths.job_storage_root)
    run_dir = Path(plan.run_dir)
    assert stat.S_IMODE((run_dir / run_files.TOKEN_FILE).stat().st_mode) == 0o600
    assert (run_dir / run_files.TOKEN_FILE).read_text().strip() == TOKEN
    assert json.loads((run_dir / run_files.PLAN_FILE).read_text()) == plan.plan.to_json()
    assert (
        json.loads((run_dir / run_files.CLUSTER_INFO_TEMPLATE_FILE).read_text())
        == plan.cluster_info.to_json()
    )
    assert (run_dir / run_files.SCRIPT_FILE).read_text() == plan.script
    write_run_dir(plan, paths.job_storage_root)  # a resubmission of the same run rewrites in place
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(plan.files())


@pytest.mark.parametrize(
    ("priority", "step", "line"),
    [(None, 10, "#SBATCH --nice=0"), (42, 10, "#SBATCH --nice=0"), (1, 10, "#SBATCH --nice=0"),
     (43, 10, "#SBATCH --nice=10"), (99, 10, "#SBATCH --nice=570"), (50, 1000, "#SBATCH --nice=8000"),
     (7, 0, None)],
)  # fmt: skip
def test_priority_becomes_nice(priority: int | None, step: int, line: str | None) -> None:
    """Determined's priority (1 highest … 99 lowest, 42 unset) as Slurm's --nice: the default competes as a
    plain sbatch does (0), each step below adds `step`, and nothing goes below 0 (that needs an operator)."""
    import dataclasses

    resources = {"slots_per_trial": 1} | ({"priority": priority} if priority is not None else {})
    plan = build(config(resources=resources), dataclasses.replace(GPU_POOL, priority_nice_step=step))
    nice_lines = [x for x in plan.script.splitlines() if x.startswith("#SBATCH --nice")]
    assert nice_lines == ([line] if line else [])


def test_describe_says_what_a_priority_does_on_slurm() -> None:
    from hpc_master.priority import describe

    assert describe(None) == describe(42) and "compete as plain sbatch jobs do, nice 0" in describe(None)
    assert "below plain sbatch jobs" in describe(60)
    assert "as 42, nice 0" in describe(5) and "operator" in describe(5)
