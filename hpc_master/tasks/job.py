"""One task → one Slurm job: a pure function, as ``hpc_master.trialjob`` is for trial runs.

The job runs the same job entry as a trial (``python -S -m harness.exec.job_entry --run-dir RUN_DIR``: it
unpacks the context into ``RUN_DIR/work``, enters the image when there is one, runs the task's command there
and records its exit in ``exit.json``), so a task honours ``environment``, ``bind_mounts`` and the container
runtime exactly as an experiment's trials do. A task runs once, on one node (as Determined's tasks run in one
container): no preemption signal is asked for and nothing is restarted.

Run directory ``<job_storage_root>/tasks/<task id>/``: ``plan.json``, ``cluster_info.template.json``,
``job.sbatch``, ``context.tar.gz`` (when the task has a context), ``output.log``, ``exit.json`` and ``work/``.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

from harness.exec import job_plan as run_files
from hpc_master import priority
from hpc_master.errors import ConfigError
from hpc_master.tasks.config import TaskConfig, TaskType
from hpc_master.trialjob import JobPaths, PoolSpec, container_plan, job_time_limit
from slurm_backend.render import render_sbatch_script
from slurm_backend.resources import slots_to_nodes
from slurm_backend.spec import JobSpec

CONTEXT_FILE = "context.tar.gz"
TASKS_DIR = "tasks"


SERVICE_FILE = "service.json"  # harness.exec.serve writes it: {"host", "port", "pid"}
SERVICE_TOKEN_FILE = "service_token"  # the master writes it (0600): the server requires it, the proxy adds it
SERVICE_TYPES = frozenset({TaskType.NOTEBOOK, TaskType.TENSORBOARD})


def task_argv(
    config: TaskConfig, task_type: TaskType, python: str, service_args: list[str] | None = None
) -> list[str]:
    """What the task's job runs: a command's entrypoint, or the server of a notebook or TensorBoard."""
    if task_type is TaskType.NOTEBOOK:
        return [python, "-m", "harness.exec.serve", "notebook", *(service_args or [])]
    if task_type is TaskType.TENSORBOARD:
        return [python, "-m", "harness.exec.serve", "tensorboard", *(service_args or [])]
    if task_type is TaskType.SHELL:  # holds the allocation; `det shell open` attaches with srun --overlap
        return ["/bin/sh", "-c", "echo 'shell ready: det shell open ID'; exec sleep infinity"]
    return config.argv()


def task_run_dir(job_storage_root: str, task_id: str) -> str:
    return posixpath.join(job_storage_root, TASKS_DIR, task_id)


def task_comment(cluster_id: str, task_id: str) -> str:
    """The Slurm comment that names the task and its master (see ``trialjob.job_comment``)."""
    return f"hpc-det:{cluster_id.replace('-', '')[:12]}:task={task_id}"


@dataclass(frozen=True)
class TaskJobPlan:
    spec: JobSpec
    script: str
    plan: dict[str, Any]
    cluster_info: dict[str, Any]
    run_dir: str
    output_path: str
    context_path: str | None

    def files(self, service_token: str | None = None) -> dict[str, tuple[str, int]]:
        import json

        def dump(obj: Any) -> str:
            return json.dumps(obj, indent=2, sort_keys=True) + "\n"

        files = {
            run_files.PLAN_FILE: (dump(self.plan), 0o644),
            run_files.CLUSTER_INFO_TEMPLATE_FILE: (dump(self.cluster_info), 0o644),
            run_files.SCRIPT_FILE: (self.script, 0o644),
        }
        if service_token is not None:
            files[SERVICE_TOKEN_FILE] = (service_token + "\n", 0o600)
        return files


def build_task_job(
    config: TaskConfig,
    task_type: TaskType,
    pool: PoolSpec,
    *,
    task_id: str,
    argv: list[str],
    paths: JobPaths,
    master_url: str,
    cluster_id: str,
    has_context: bool,
    max_context_bytes: int,
) -> TaskJobPlan:
    """`argv` is what the task runs on its node (the command, or the notebook or TensorBoard server)."""
    if not argv:
        raise ConfigError("the task has nothing to run", field="entrypoint")
    shape = slots_to_nodes(
        config.resources.slots, config.slurm.slots_per_node or pool.slots_per_node, single_node=True
    )
    time_limit = job_time_limit(config.slurm, pool)
    run_dir = task_run_dir(paths.job_storage_root, task_id)
    workdir = posixpath.join(run_dir, run_files.WORK_DIR)
    output = posixpath.join(run_dir, run_files.OUTPUT_FILE)
    context_path = posixpath.join(run_dir, CONTEXT_FILE) if has_context else None
    root = paths.platform_root.rstrip("/") or "/"
    env: list[tuple[str, str]] = [
        ("PYTHONPATH", f"{posixpath.join(root, 'determined_compat')}:{root}"),
        ("DET_MASTER", master_url),
        ("DET_TASK_ID", task_id),
        ("DET_TASK_TYPE", task_type.value),
        ("DET_ALLOCATION_ID", f"{task_id}.1"),
        ("DET_CLUSTER_INFO", posixpath.join(run_dir, run_files.CLUSTER_INFO_FILE)),
        ("DET_RUN_DIR", run_dir),
    ]
    command = (paths.python, "-S", "-m", "harness.exec.job_entry", "--run-dir", run_dir)
    spec = JobSpec(
        job_name=f"det-{task_type.lower()}-{task_id[:8]}",
        comment=task_comment(cluster_id, task_id),
        commands=(command,),
        output_path=output,
        workdir=run_dir,
        partition=config.slurm.partition or pool.partition,
        account=config.slurm.account or pool.account,
        qos=config.slurm.qos or pool.qos,
        time_limit_min=time_limit,
        nodes=1,
        ntasks_per_node=1,
        gpus_per_node=shape.gpus_per_node,
        gpu_type=config.slurm.gpu_type or pool.gpu_type,
        gpu_request_style=pool.gpu_request_style,
        mem_per_node_mb=pool.mem_per_node_mb,
        preempt_signal=pool.preempt_signal,
        preempt_lead_s=None,
        env=tuple(env),
        extra_sbatch_args=tuple(config.slurm.sbatch_args),
        nice=priority.nice(config.resources.priority, pool.priority_nice_step),
    )
    user_env = config.environment.environment_variables.for_device("cuda" if shape.gpus_per_node else "cpu")
    cluster_info: dict[str, Any] = {
        "master_url": master_url,
        "cluster_id": cluster_id,
        "agent_id": "",
        "slot_ids": list(range(shape.gpus_per_node)),
        "task_id": task_id,
        "allocation_id": f"{task_id}.1",
        "session_token": "",
        "task_type": task_type.value,
        "latest_checkpoint": None,
        "container_addrs": [],
        "container_rank": 0,
        "trial": None,
    }
    plan: dict[str, Any] = {
        "version": run_files.PLAN_VERSION,
        "entrypoint": list(argv),
        "slots_per_trial": 1,  # run once, never under a launcher: the task's slots are all on its one node
        "python": paths.python,
        "context_archive": context_path,
        "max_context_bytes": max_context_bytes,
        "workdir": workdir,
        "env": dict(env),
        "user_env": user_env,
        "preempt_signal": pool.preempt_signal,
    }
    container = container_plan(
        config.environment, config.bind_mounts, pool, paths, bool(shape.gpus_per_node), checkpoint_root=None
    )
    if container is not None:
        plan["container"] = container
    return TaskJobPlan(
        spec=spec,
        script=render_sbatch_script(spec),
        plan=plan,
        cluster_info=cluster_info,
        run_dir=run_dir,
        output_path=output,
        context_path=context_path,
    )
