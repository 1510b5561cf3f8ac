"""One trial run → one Slurm job: a pure function from the experiment config, the resource pool and the trial.

    plan = build_trial_job(config, pool, trial, paths, master_url=..., session_token=...)
    write_run_dir(plan, uid=..., gid=...)            # hpc_master.trialjob_files: the run directory's files
    job_id = SlurmCli().submit(plan.script, as_user=trial.owner)

The job runs ``python -S -m harness.exec.job_entry --run-dir RUN_DIR``, which reads the files written here (the
contract is in ``harness.exec.job_plan``). The session token is only ever in ``RUN_DIR/session_token`` (0600):
never in the script, the sbatch command line or ``plan.json``.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from containers.images import default_cache_dir
from containers.job import container_section
from harness.exec import job_plan as run_files
from hpc_master import priority
from hpc_master.errors import ConfigError
from hpc_master.expconf import (
    BindMount,
    DirectoryStorage,
    EnvironmentConfig,
    ExperimentConfig,
    SharedFSStorage,
    SlurmConfig,
)
from hpc_master.masterconf import MasterConfig, pool_container
from slurm_backend.render import render_sbatch_script
from slurm_backend.resources import slots_to_nodes
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
    # Containers (master.yaml `container:`, per pool): trials run inside environment.image or this default image.
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
        **_pool_container_fields(master, pool_name),
    )


def _pool_container_fields(master: MasterConfig, pool_name: str) -> dict[str, Any]:
    c = pool_container(master, pool_name)
    return {
        "container_runtime": c.runtime,
        "container_command": c.command,
        "container_image": c.image,
        "image_cache_dir": c.cache_dir,
    }


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
        job_storage_root=paths.job_storage_root,
        checkpoint_root=checkpoint_root,
    )


def _container(
    config: ExperimentConfig, pool: PoolSpec, paths: JobPaths, gpus: bool
) -> dict[str, Any] | None:
    storage = config.checkpoint_storage
    root = None if isinstance(storage, DirectoryStorage) else _checkpoint_root(config, paths)
    return container_plan(config.environment, config.bind_mounts, pool, paths, gpus, root)


@dataclass(frozen=True)
class TrialJobInputs:
    experiment_id: int
    trial_id: int
    trial_run_id: int
    hparams: Mapping[str, Any]
    trial_seed: int
    owner: str  # the Unix account the job runs as
    latest_checkpoint: str | None = None  # uuid
    steps_completed: int = 0
    request_id: str | None = None
    user_data: Mapping[str, Any] | None = None  # default: the config's `data`
    context_archive: str | None = None  # .tar.gz/.zip of the model definition, on the shared filesystem


@dataclass(frozen=True)
class JobPaths:
    job_storage_root: str  # shared filesystem: <root>/exp-E/trial-T/run-R
    checkpoint_root: str  # used when the config has no checkpoint_storage
    platform_root: str  # the repository: harness/, launchers/, determined_compat/
    python: str  # interpreter with the platform's dependencies, on every node


@dataclass(frozen=True)
class TrialJobPlan:
    spec: JobSpec
    script: str  # the rendered sbatch script
    command: tuple[str, ...]  # the job body: python -S -m harness.exec.job_entry --run-dir RUN_DIR
    env: tuple[tuple[str, str], ...]  # DET_* and PYTHONPATH, exported by the script (no secrets)
    user_env: dict[str, str]  # the config's environment_variables for this device type (plan.json only)
    cluster_info: dict[str, Any]  # Determined's ClusterInfo; container_addrs filled in by the job entry
    plan: dict[str, Any]  # plan.json
    trial_dir: str
    run_dir: str
    workdir: str
    output_path: str
    session_token: str = field(repr=False)

    def files(self) -> dict[str, tuple[str, int]]:
        """Run-directory file name → (text, mode)."""
        import json

        def dump(obj: Any) -> str:
            return json.dumps(obj, indent=2, sort_keys=True) + "\n"

        return {
            run_files.PLAN_FILE: (dump(self.plan), 0o644),
            run_files.CLUSTER_INFO_TEMPLATE_FILE: (dump(self.cluster_info), 0o644),
            run_files.TOKEN_FILE: (self.session_token + "\n", 0o600),
            run_files.SCRIPT_FILE: (self.script, 0o644),
        }


CHAIN_HINT = "; a longer trial runs as a chain of jobs, each checkpointing before its time limit"


def job_time_limit(slurm: SlurmConfig, pool: PoolSpec, hint: str = "") -> int | None:
    """The job's minutes: the config's, else the pool's default; over the pool's maximum is refused."""
    limit = slurm.time_limit_min or pool.default_time_limit_min
    if limit is not None and pool.max_time_limit_min is not None and limit > pool.max_time_limit_min:
        raise ConfigError(
            f"{limit} minutes is over the {pool.name!r} pool's limit of {pool.max_time_limit_min} minutes{hint}",
            field="slurm.time_limit",
        )
    return limit


def _signal_lead_s(pool: PoolSpec, time_limit_min: int | None) -> int | None:
    """The pool's lead, at most half the time limit (a lead over the limit would preempt at once)."""
    if pool.preempt_lead_s is None:
        return None
    lead = min(pool.preempt_lead_s, MAX_SIGNAL_LEAD_S)
    if time_limit_min is not None:
        lead = min(lead, time_limit_min * 60 // 2)
    return lead


def checkpoint_root_of(config: ExperimentConfig, default_root: str) -> str:
    """The directory an experiment's trials store checkpoints (and TensorBoard files) under."""
    return _checkpoint_root(config, JobPaths("", default_root, "", ""))


def _checkpoint_root(config: ExperimentConfig, paths: JobPaths) -> str:
    storage = config.checkpoint_storage
    if isinstance(storage, SharedFSStorage):
        return storage.root
    if isinstance(storage, DirectoryStorage):
        return storage.container_path
    return paths.checkpoint_root


def run_dirs(job_storage_root: str, experiment_id: int, trial_id: int, trial_run_id: int) -> tuple[str, str]:
    """(trial directory, run directory)."""
    trial_dir = posixpath.join(job_storage_root, f"exp-{experiment_id}", f"trial-{trial_id}")
    return trial_dir, posixpath.join(trial_dir, f"run-{trial_run_id}")


def job_comment(cluster_id: str, experiment_id: int, trial_id: int, run_number: int) -> str:
    """The Slurm comment that identifies a trial run, and whose master it is: a master that restarts
    adopts a job it submitted (but never heard back about) by this comment, and several masters (every
    researcher's personal one) share a cluster, all with an experiment 1 and a trial 1."""
    master = cluster_id.replace("-", "")[:12]
    return f"hpc-det:{master}:exp={experiment_id},trial={trial_id},run={run_number}"


def build_trial_job(
    config: ExperimentConfig,
    pool: PoolSpec,
    trial: TrialJobInputs,
    paths: JobPaths,
    *,
    master_url: str,
    session_token: str,
    cluster_id: str = "hpc-det",
    max_context_bytes: int = DEFAULT_MAX_CONTEXT_BYTES,
) -> TrialJobPlan:
    if config.entrypoint is None:
        raise ConfigError("an experiment needs an entrypoint to run", field="entrypoint")
    slots = config.resources.slots_per_trial
    shape = slots_to_nodes(
        slots, config.slurm.slots_per_node or pool.slots_per_node, single_node=config.resources.is_single_node
    )
    argv = run_files.resolve_entrypoint(config.entrypoint, slots, paths.python)
    ntasks = shape.gpus_per_node if run_files.tasks_per_slot(argv) and shape.gpus_per_node else 1
    time_limit = job_time_limit(config.slurm, pool, CHAIN_HINT)
    trial_dir, run_dir = run_dirs(
        paths.job_storage_root, trial.experiment_id, trial.trial_id, trial.trial_run_id
    )
    workdir = posixpath.join(trial_dir, run_files.WORK_DIR)
    output = posixpath.join(run_dir, run_files.OUTPUT_FILE)
    allocation_id = f"{trial.trial_id}.{trial.trial_run_id}"
    root = paths.platform_root.rstrip("/") or "/"
    env: list[tuple[str, str]] = [
        ("PYTHONPATH", f"{posixpath.join(root, 'determined_compat')}:{root}"),
        ("DET_MASTER", master_url),
        ("DET_EXPERIMENT_ID", str(trial.experiment_id)),
        ("DET_TRIAL_ID", str(trial.trial_id)),
        ("DET_TRIAL_RUN_ID", str(trial.trial_run_id)),
        ("DET_ALLOCATION_ID", allocation_id),
        ("DET_CLUSTER_INFO", posixpath.join(run_dir, run_files.CLUSTER_INFO_FILE)),
        ("DET_LATEST_CHECKPOINT", trial.latest_checkpoint or ""),
        ("DET_STORAGE_ROOT", _checkpoint_root(config, paths)),
        ("DET_JOB_STORAGE", trial_dir),
        ("DET_RUN_DIR", run_dir),
        ("DET_RANK_EXIT_DIR", posixpath.join(run_dir, run_files.RANK_EXIT_DIR)),
        ("DET_PREEMPT_SIGNAL", pool.preempt_signal),
        ("DET_PREEMPT_ACK_FILE", posixpath.join(run_dir, run_files.PREEMPT_ACK_FILE)),
        (
            "DET_TENSORBOARD_PATH",
            run_files.tensorboard_path(_checkpoint_root(config, paths), trial.experiment_id, trial.trial_id),
        ),
    ]
    if trial.request_id:
        env.append(("DET_REQUEST_ID", trial.request_id))
    # -S: the job entry is standard library plus this repository (on PYTHONPATH), so it skips site-packages
    # and their .pth files (a third of its start-up, in every job).
    command = (paths.python, "-S", "-m", "harness.exec.job_entry", "--run-dir", run_dir)
    spec = JobSpec(
        job_name=f"det-e{trial.experiment_id}-t{trial.trial_id}",
        comment=job_comment(cluster_id, trial.experiment_id, trial.trial_id, trial.trial_run_id),
        commands=(command,),
        output_path=output,
        workdir=trial_dir,
        partition=config.slurm.partition or pool.partition,
        account=config.slurm.account or pool.account,
        qos=config.slurm.qos or pool.qos,
        time_limit_min=time_limit,
        nodes=shape.nodes,
        ntasks_per_node=ntasks,
        gpus_per_node=shape.gpus_per_node,
        gpu_type=config.slurm.gpu_type or pool.gpu_type,
        gpu_request_style=pool.gpu_request_style,
        mem_per_node_mb=pool.mem_per_node_mb,
        preempt_signal=pool.preempt_signal,
        preempt_lead_s=_signal_lead_s(pool, time_limit),
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
        "task_id": f"{trial.experiment_id}.{trial.trial_id}",
        "allocation_id": allocation_id,
        "session_token": "",  # DET_SESSION_TOKEN, from the run directory's 0600 token file
        "task_type": "TRIAL",
        "latest_checkpoint": trial.latest_checkpoint,
        "container_addrs": [],
        "container_rank": 0,
        "trial": {
            "trial_id": trial.trial_id,
            "experiment_id": trial.experiment_id,
            "trial_seed": trial.trial_seed,
            "hparams": dict(trial.hparams),
            "config": config.to_dict(),
            "steps_completed": trial.steps_completed,
            "trial_run_id": trial.trial_run_id,
            "user_data": dict(trial.user_data if trial.user_data is not None else config.data),
        },
    }
    plan = {
        "version": run_files.PLAN_VERSION,
        "entrypoint": config.entrypoint,
        "slots_per_trial": slots,
        "python": paths.python,
        "context_archive": trial.context_archive,
        "max_context_bytes": max_context_bytes,
        "workdir": workdir,
        "env": dict(env),
        "user_env": user_env,
        "preempt_signal": pool.preempt_signal,
    }
    container = _container(config, pool, paths, bool(shape.gpus_per_node))
    if container is not None:
        plan["container"] = container
    return TrialJobPlan(
        spec=spec,
        script=render_sbatch_script(spec),
        command=command,
        env=tuple(env),
        user_env=user_env,
        cluster_info=cluster_info,
        plan=plan,
        trial_dir=trial_dir,
        run_dir=run_dir,
        workdir=workdir,
        output_path=output,
        session_token=session_token,
    )


# ---- the dry run at create ------------------------------------------------------------------------------------

DRY_RUN_TRIAL = TrialJobInputs(
    experiment_id=0, trial_id=0, trial_run_id=1, hparams={}, trial_seed=0, owner="dry-run"
)


def stand_in_pool(config: ExperimentConfig) -> PoolSpec:
    """A pool for checking a config where the master's pools are unknown (``det preview`` without
    ``--master-config``): named as the config asks, every slot on one node unless ``slurm.slots_per_node``
    says otherwise, no time or memory limits."""
    return PoolSpec(
        name=config.resources.resource_pool or "default",
        slots_per_node=config.slurm.slots_per_node or max(config.resources.slots_per_trial, 1),
    )


def dry_run_trial_job(
    config: ExperimentConfig, master: MasterConfig, pool: PoolSpec | None = None
) -> TrialJobPlan:
    """Build (never submit) the job of the config's first trial, against `pool` or else the master's pool that
    ``resources.resource_pool`` names: whatever submission would refuse raises here, at create, as a
    ClientError naming the config field. Pure: no file is written and Slurm is not asked."""
    if pool is None:
        pool = pool_from_master_config(master, config.resources.resource_pool)
    paths = JobPaths(
        job_storage_root=str(master.job_storage_dir()),
        checkpoint_root=str(master.checkpoint_dir()),
        platform_root="/hpc-det",
        python="python3",
    )
    return build_trial_job(
        config, pool, DRY_RUN_TRIAL, paths, master_url=master.master_url(), session_token="dry-run"
    )
