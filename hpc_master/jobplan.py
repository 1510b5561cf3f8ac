"""One run → one Slurm job, for trials and tasks alike: a typed request in, a planned job out. Pure.

    request = JobRequest(...)                       # hpc_master.trialjob / hpc_master.taskjob fill it
    job = plan_job(request, TrialJobPlan, ...)       # the JobSpec, the rendered script, the run directory's files

What a trial's or a task's job has in common lives here: the resource pool (:class:`PoolSpec`) and the master's
paths (:class:`JobPaths`), the job's node shape and time limit, the container section, the job entry's command
line, the Slurm ``JobSpec``, ``plan.json`` and ``cluster_info.template.json`` (the records of
``harness.exec.job_contract``, which the job entry reads back). What differs stays with the caller: the
``DET_*`` variables, the ClusterInfo's trial part, the run directory's place and the Slurm comment.

Every job runs ``python -S -m harness.exec.job_entry --run-dir RUN_DIR``, which reads the files written from
:meth:`PlannedJob.files` (the run directory's layout is in ``harness.exec.job_plan``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from containers.images import default_cache_dir
from containers.job import container_section
from harness.exec import job_plan as run_files
from harness.exec.job_contract import ClusterInfoDoc, JobPlan
from hpc_master import priority
from hpc_master.errors import ConfigError
from hpc_master.expconf import BindMount, EnvironmentConfig, SlurmConfig
from hpc_master.masterconf import MasterConfig, pool_container
from slurm_backend.render import render_sbatch_script
from slurm_backend.resources import NodeShape, slots_to_nodes
from slurm_backend.spec import GpuRequestStyle, JobSpec

DEFAULT_MAX_CONTEXT_BYTES = 1 << 30
MAX_SIGNAL_LEAD_S = 65535


@dataclass(frozen=True)
class PoolSpec:
    """What a resource pool decides about a job (from ``master.yaml``'s ``resource_pools`` and ``preemption``)."""

    name: str = "default"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    slots_per_node: int = 1
    gpu_type: str | None = None
    gpu_request_style: GpuRequestStyle = "gres"
    default_time_limit_min: int | None = None
    max_time_limit_min: int | None = None
    mem_per_node_mb: int | None = None
    preempt_signal: str = "SIGUSR1"
    preempt_lead_s: int | None = 300  # None: no --signal
    priority_nice_step: int = 0  # --nice per step of resources.priority (hpc_master.priority); 0: none
    # Containers (master.yaml `container:`, per pool): jobs run inside environment.image or this default image.
    container_runtime: str = "apptainer"  # apptainer | singularity | none
    container_command: str | None = None  # the runtime's executable, when not the runtime's name on PATH
    container_image: str | None = None
    image_cache_dir: str | None = None


def pool_from_master_config(master: MasterConfig, name: str | None = None) -> PoolSpec:
    pool_name = name or master.default_resource_pool
    pool = master.resource_pools.get(pool_name)
    if pool is None:
        known = ", ".join(sorted(master.resource_pools))
        raise ConfigError(
            f"unknown resource pool {pool_name!r} (known: {known})", field="resources.resource_pool"
        )
    container = pool_container(master, pool_name)
    # Times and sizes were parsed and checked when the master config loaded.
    return PoolSpec(
        name=pool_name,
        partition=pool.partition,
        account=pool.account,
        qos=pool.qos,
        slots_per_node=pool.slots_per_node,
        gpu_type=pool.gpu_type,
        gpu_request_style=pool.gpu_request_style,
        default_time_limit_min=pool.default_time_limit_min,
        max_time_limit_min=pool.max_time_limit_min,
        mem_per_node_mb=pool.mem_per_node_mb,
        preempt_signal=master.preemption.signal,
        preempt_lead_s=master.preemption.lead_time_s,
        priority_nice_step=pool.priority_nice_step,
        container_runtime=container.runtime,
        container_command=container.command,
        container_image=container.image,
        image_cache_dir=container.cache_dir,
    )


@dataclass(frozen=True)
class JobPaths:
    job_storage_root: str  # shared filesystem: the master's root (its image cache's default parent)
    checkpoint_root: str  # used when the config has no checkpoint_storage
    platform_root: str  # the repository: harness/, launchers/, determined_compat/
    python: str  # interpreter with the platform's dependencies, on every node
    user_root: str = (
        ""  # the owner's directory (trialjob.user_job_root): <it>/exp-E/trial-T/run-R, <it>/tasks/<id>
    )

    @property
    def runs_root(self) -> str:
        """Where the owner's run and task directories are: their own directory, else the root itself."""
        return self.user_root or self.job_storage_root


def node_shape(slots: int, slurm: SlurmConfig, pool: PoolSpec, *, single_node: bool) -> NodeShape:
    """Nodes × GPUs per node for `slots`, at the config's slots per node, else the pool's."""
    return slots_to_nodes(slots, slurm.slots_per_node or pool.slots_per_node, single_node=single_node)


def job_time_limit(slurm: SlurmConfig, pool: PoolSpec, hint: str = "") -> int | None:
    """The job's minutes: the config's, else the pool's default; over the pool's maximum is refused."""
    limit = slurm.time_limit_min or pool.default_time_limit_min
    if limit is not None and pool.max_time_limit_min is not None and limit > pool.max_time_limit_min:
        raise ConfigError(
            f"{limit} minutes is over the {pool.name!r} pool's limit of {pool.max_time_limit_min} minutes{hint}",
            field="slurm.time_limit",
        )
    return limit


def signal_lead_s(pool: PoolSpec, time_limit_min: int | None) -> int | None:
    """The pool's lead, at most half the time limit (a lead over the limit would preempt at once)."""
    if pool.preempt_lead_s is None:
        return None
    lead = min(pool.preempt_lead_s, MAX_SIGNAL_LEAD_S)
    if time_limit_min is not None:
        lead = min(lead, time_limit_min * 60 // 2)
    return lead


def container_plan(
    environment: EnvironmentConfig,
    bind_mounts: Sequence[BindMount],
    pool: PoolSpec,
    paths: JobPaths,
    gpus: bool,
    checkpoint_root: str | None,
) -> dict[str, Any] | None:
    """plan.json's `container` section when the job runs in an image (see containers.job), else None: a trial's
    or a task's, from its `environment` and `bind_mounts` and the pool's container settings."""
    image = environment.image_for("cuda" if gpus else "cpu") or pool.container_image
    if not image:
        return None
    if pool.container_runtime == "none":
        raise ConfigError(
            f"the {pool.name!r} pool runs no container runtime (container.runtime: none), so the image "
            f"{image!r} cannot be used",
            field="environment.image",
        )
    return container_section(
        runtime=pool.container_runtime,
        command=pool.container_command,
        image=image,
        cache_dir=pool.image_cache_dir or default_cache_dir(paths.job_storage_root),
        force_pull=environment.force_pull_image,
        gpus=gpus,
        binds=[(b.host_path, b.container_path, b.read_only) for b in bind_mounts],
        platform_root=paths.platform_root.rstrip("/") or "/",
        job_storage_root=paths.runs_root,
        checkpoint_root=checkpoint_root,
    )


@dataclass(frozen=True, kw_only=True)
class JobRequest:
    """Everything one run's job is built from, with the trial- or task-specific parts already decided."""

    name: str  # the Slurm job name
    comment: str  # the Slurm comment: which run of which master (a restarted master adopts its jobs by it)
    run_dir: str  # the plan's files, the job's output.log and exit.json
    job_dir: str  # the job's working directory (sbatch --chdir)
    workdir: str  # the entrypoint's working directory (plan.json's workdir; the context is unpacked there)
    entrypoint: str | list[str]  # as plan.json holds it (the job entry resolves it)
    entrypoint_slots: int  # plan.json's slots_per_trial: the entrypoint runs under a launcher when over 1
    shape: NodeShape  # nodes × GPUs per node (node_shape)
    ntasks_per_node: int
    env: Sequence[tuple[str, str]]  # the run's DET_* variables (PYTHONPATH and DET_MASTER come first)
    cluster_info: ClusterInfoDoc  # its master_url is DET_MASTER
    environment: EnvironmentConfig  # the config's: environment_variables and the image
    bind_mounts: Sequence[BindMount]
    checkpoint_root: str | None  # bound into the image when there is one (None: not bound)
    slurm: SlurmConfig  # the config's slurm section
    resource_priority: int | None  # the config's resources.priority
    pool: PoolSpec
    paths: JobPaths
    time_limit_min: int | None  # job_time_limit
    preempt_lead_s: int | None  # --signal's lead (signal_lead_s); None: no signal before the time limit
    context_archive: str | None
    max_context_bytes: int


@dataclass(frozen=True, kw_only=True)
class PlannedJob:
    """A built job: what is submitted and what is written into its run directory first."""

    spec: JobSpec
    script: str  # the rendered sbatch script
    command: tuple[str, ...]  # the job body: python -S -m harness.exec.job_entry --run-dir RUN_DIR
    env: tuple[tuple[str, str], ...]  # DET_* and PYTHONPATH, exported by the script (no secrets)
    user_env: dict[str, str]  # the config's environment_variables for this device type (plan.json only)
    cluster_info: ClusterInfoDoc  # Determined's ClusterInfo; container_addrs filled in by the job entry
    plan: JobPlan  # plan.json
    run_dir: str
    workdir: str
    output_path: str

    def files(self) -> dict[str, tuple[str, int]]:
        """Run-directory file name → (text, mode)."""
        return {
            run_files.PLAN_FILE: (dump_json(self.plan.to_json()), 0o644),
            run_files.CLUSTER_INFO_TEMPLATE_FILE: (dump_json(self.cluster_info.to_json()), 0o644),
            run_files.SCRIPT_FILE: (self.script, 0o644),
        }


def dump_json(obj: Any) -> str:
    """A run-directory JSON file's text: indented, keys sorted."""
    import json

    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def platform_env(paths: JobPaths, master_url: str) -> list[tuple[str, str]]:
    """What every job exports first: the platform's code (and its ``determined`` package) on PYTHONPATH."""
    root = paths.platform_root.rstrip("/") or "/"
    return [
        ("PYTHONPATH", f"{posixpath.join(root, 'determined_compat')}:{root}"),
        ("DET_MASTER", master_url),
    ]


def job_entry_command(python: str, run_dir: str) -> tuple[str, ...]:
    # -S: the job entry is standard library plus this repository (on PYTHONPATH), so it skips site-packages
    # and their .pth files (a third of its start-up, in every job).
    return (python, "-S", "-m", "harness.exec.job_entry", "--run-dir", run_dir)


Planned = TypeVar("Planned", bound=PlannedJob)


def plan_job(request: JobRequest, kind: type[Planned], **extra: Any) -> Planned:
    """The job `request` describes, as a `kind` (PlannedJob or a subclass, whose own fields are `extra`).
    Refusals (the pool's or Slurm's limits, ``slurm.sbatch_args``, an image without a runtime) raise a
    ClientError naming the config field."""
    r = request
    env = (*platform_env(r.paths, r.cluster_info.master_url), *r.env)
    command = job_entry_command(r.paths.python, r.run_dir)
    output = posixpath.join(r.run_dir, run_files.OUTPUT_FILE)
    spec = JobSpec(
        job_name=r.name,
        comment=r.comment,
        commands=(command,),
        output_path=output,
        workdir=r.job_dir,
        partition=r.slurm.partition or r.pool.partition,
        account=r.slurm.account or r.pool.account,
        qos=r.slurm.qos or r.pool.qos,
        time_limit_min=r.time_limit_min,
        nodes=r.shape.nodes,
        ntasks_per_node=r.ntasks_per_node,
        gpus_per_node=r.shape.gpus_per_node,
        gpu_type=r.slurm.gpu_type or r.pool.gpu_type,
        gpu_request_style=r.pool.gpu_request_style,
        mem_per_node_mb=r.pool.mem_per_node_mb,
        preempt_signal=r.pool.preempt_signal,
        preempt_lead_s=r.preempt_lead_s,
        env=env,
        extra_sbatch_args=tuple(r.slurm.sbatch_args),
        nice=priority.nice(r.resource_priority, r.pool.priority_nice_step),
    )
    gpus = bool(r.shape.gpus_per_node)
    user_env = r.environment.environment_variables.for_device("cuda" if gpus else "cpu")
    plan = JobPlan(
        entrypoint=r.entrypoint if isinstance(r.entrypoint, str) else list(r.entrypoint),
        slots_per_trial=r.entrypoint_slots,
        python=r.paths.python,
        context_archive=r.context_archive,
        max_context_bytes=r.max_context_bytes,
        workdir=r.workdir,
        env=dict(env),
        user_env=user_env,
        preempt_signal=r.pool.preempt_signal,
        container=container_plan(r.environment, r.bind_mounts, r.pool, r.paths, gpus, r.checkpoint_root),
    )
    return kind(
        spec=spec,
        script=render_sbatch_script(spec),
        command=command,
        env=env,
        user_env=user_env,
        cluster_info=r.cluster_info,
        plan=plan,
        run_dir=r.run_dir,
        workdir=r.workdir,
        output_path=output,
        **extra,
    )
