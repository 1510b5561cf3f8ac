"""One task → one Slurm job: a pure function, as ``hpc_master.trialjob`` is for trial runs; both fill a
``hpc_master.jobplan.JobRequest`` and build the job with ``plan_job``.

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

from harness.exec import job_plan as run_files
from harness.exec.job_contract import ClusterInfoDoc
from hpc_master.errors import ConfigError
from hpc_master.expconf.tasks import TaskConfig, TaskType
from hpc_master.jobplan import (
    JobPaths,
    JobRequest,
    PlannedJob,
    PoolSpec,
    job_time_limit,
    node_shape,
    plan_job,
)

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


@dataclass(frozen=True, kw_only=True)
class TaskJobPlan(PlannedJob):
    """A task's job: the shared parts (``hpc_master.jobplan.PlannedJob``) and where its context archive goes."""

    context_path: str | None

    def files(self, service_token: str | None = None) -> dict[str, tuple[str, int]]:
        """Run-directory file name → (text, mode); a server's token file (0600) when `service_token` is given."""
        files = super().files()
        if service_token is not None:
            files[SERVICE_TOKEN_FILE] = (service_token + "\n", 0o600)
        return files


def task_env(task_id: str, task_type: TaskType, run_dir: str) -> list[tuple[str, str]]:
    """A task's ``DET_*`` variables (after PYTHONPATH and DET_MASTER), in the script's order."""
    return [
        ("DET_TASK_ID", task_id),
        ("DET_TASK_TYPE", task_type.value),
        ("DET_ALLOCATION_ID", f"{task_id}.1"),
        ("DET_CLUSTER_INFO", posixpath.join(run_dir, run_files.CLUSTER_INFO_FILE)),
        ("DET_RUN_DIR", run_dir),
    ]


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
    shape = node_shape(config.resources.slots, config.slurm, pool, single_node=True)
    time_limit = job_time_limit(config.slurm, pool)
    run_dir = task_run_dir(paths.runs_root, task_id)
    context_path = posixpath.join(run_dir, CONTEXT_FILE) if has_context else None
    request = JobRequest(
        name=f"det-{task_type.lower()}-{task_id[:8]}",
        comment=task_comment(cluster_id, task_id),
        run_dir=run_dir,
        job_dir=run_dir,
        workdir=posixpath.join(run_dir, run_files.WORK_DIR),
        entrypoint=list(argv),
        entrypoint_slots=1,  # run once, never under a launcher: the task's slots are all on its one node
        shape=shape,
        ntasks_per_node=1,
        env=task_env(task_id, task_type, run_dir),
        cluster_info=ClusterInfoDoc(
            master_url=master_url,
            cluster_id=cluster_id,
            slot_ids=list(range(shape.gpus_per_node)),
            task_id=task_id,
            allocation_id=f"{task_id}.1",
            task_type=task_type.value,
        ),
        environment=config.environment,
        bind_mounts=config.bind_mounts,
        checkpoint_root=None,
        slurm=config.slurm,
        resource_priority=config.resources.priority,
        pool=pool,
        paths=paths,
        time_limit_min=time_limit,
        preempt_lead_s=None,  # a task is not preempted to be resumed: no signal before its time limit
        context_archive=context_path,
        max_context_bytes=max_context_bytes,
    )
    return plan_job(request, TaskJobPlan, context_path=context_path)
