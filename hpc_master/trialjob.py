"""One trial run → one Slurm job: a pure function from the experiment config, the resource pool and the trial.

    plan = build_trial_job(config, pool, trial, paths, master_url=..., session_token=...)
    write_run_dir(plan, uid=..., gid=...)            # hpc_master.trialjob_files: the run directory's files
    job_id = SlurmCli().submit(plan.script, as_user=trial.owner)

What is a trial's own is decided here (its ``DET_*`` variables, the ClusterInfo's trial part, the run directory
``exp-E/trial-T/run-R``, the Slurm comment, the launcher's tasks per node); the job itself is built by
``hpc_master.jobplan``, as a task's is (its ``PoolSpec``, ``JobPaths``, ``pool_from_master_config`` and
``DEFAULT_MAX_CONTEXT_BYTES`` are re-exported here for the modules that import them from here). The job runs ``python -S -m harness.exec.job_entry --run-dir RUN_DIR``,
which reads the files written here (the contract is in ``harness.exec.job_plan`` and ``harness.exec.job_contract``).
The session token is only ever in ``RUN_DIR/session_token`` (0600): never in the script, the sbatch command line
or ``plan.json``.
"""

from __future__ import annotations

import getpass
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.exec import job_plan as run_files
from harness.exec.job_contract import ClusterInfoDoc, TrialInfoDoc
from hpc_master.errors import ConfigError
from hpc_master.expconf import DirectoryStorage, ExperimentConfig, SharedFSStorage
from hpc_master.jobplan import DEFAULT_MAX_CONTEXT_BYTES as DEFAULT_MAX_CONTEXT_BYTES  # (re-exported)
from hpc_master.jobplan import JobPaths as JobPaths
from hpc_master.jobplan import JobRequest, PlannedJob, job_time_limit, node_shape, plan_job, signal_lead_s
from hpc_master.jobplan import PoolSpec as PoolSpec
from hpc_master.jobplan import pool_from_master_config as pool_from_master_config
from hpc_master.masterconf import MasterConfig


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


@dataclass(frozen=True, kw_only=True)
class TrialJobPlan(PlannedJob):
    """A trial run's job: the shared parts (``hpc_master.jobplan.PlannedJob``), its trial directory (the
    job's working directory, above ``work/`` and the runs) and its session token."""

    trial_dir: str
    session_token: str = field(repr=False)

    def files(self) -> dict[str, tuple[str, int]]:
        """Run-directory file name → (text, mode); the token file is 0600."""
        return {**super().files(), run_files.TOKEN_FILE: (self.session_token + "\n", 0o600)}


CHAIN_HINT = "; a longer trial runs as a chain of jobs, each checkpointing before its time limit"


def checkpoint_root_of(config: ExperimentConfig, default_root: str) -> str:
    """The directory an experiment's trials store checkpoints (and TensorBoard files) under."""
    storage = config.checkpoint_storage
    if isinstance(storage, SharedFSStorage):
        return storage.root
    if isinstance(storage, DirectoryStorage):
        return storage.container_path
    return default_root


USER_TEMPLATE = "{unix_user}"


def user_job_root(job_storage_root: str, unix_user: str | None) -> str:
    """Where a user's runs and tasks live below the job storage root: a per-user root names the account
    (``/scratch/{unix_user}/hpc-det``); a shared root gets a directory per account (``<root>/<account>``,
    made or checked by the user's own helper); a personal master (`unix_user` None) keeps the root itself."""
    if unix_user is None:
        return job_storage_root.replace(USER_TEMPLATE, getpass.getuser())
    if USER_TEMPLATE in job_storage_root:
        return job_storage_root.replace(USER_TEMPLATE, unix_user)
    return posixpath.join(job_storage_root, unix_user)


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


def trial_env(
    trial: TrialJobInputs, trial_dir: str, run_dir: str, storage_root: str, preempt_signal: str
) -> list[tuple[str, str]]:
    """A trial run's ``DET_*`` variables (after PYTHONPATH and DET_MASTER), in the script's order."""
    env = [
        ("DET_EXPERIMENT_ID", str(trial.experiment_id)),
        ("DET_TRIAL_ID", str(trial.trial_id)),
        ("DET_TRIAL_RUN_ID", str(trial.trial_run_id)),
        ("DET_ALLOCATION_ID", f"{trial.trial_id}.{trial.trial_run_id}"),
        ("DET_CLUSTER_INFO", posixpath.join(run_dir, run_files.CLUSTER_INFO_FILE)),
        ("DET_LATEST_CHECKPOINT", trial.latest_checkpoint or ""),
        ("DET_STORAGE_ROOT", storage_root),
        ("DET_JOB_STORAGE", trial_dir),
        ("DET_RUN_DIR", run_dir),
        ("DET_RANK_EXIT_DIR", posixpath.join(run_dir, run_files.RANK_EXIT_DIR)),
        ("DET_PREEMPT_SIGNAL", preempt_signal),
        ("DET_PREEMPT_ACK_FILE", posixpath.join(run_dir, run_files.PREEMPT_ACK_FILE)),
        (
            "DET_TENSORBOARD_PATH",
            run_files.tensorboard_path(storage_root, trial.experiment_id, trial.trial_id),
        ),
    ]
    if trial.request_id:
        env.append(("DET_REQUEST_ID", trial.request_id))
    return env


def trial_cluster_info(
    config: ExperimentConfig, trial: TrialJobInputs, gpus_per_node: int, master_url: str, cluster_id: str
) -> ClusterInfoDoc:
    """Determined's ClusterInfo of a trial run (the session token is the run directory's 0600 file)."""
    return ClusterInfoDoc(
        master_url=master_url,
        cluster_id=cluster_id,
        slot_ids=list(range(gpus_per_node)),
        task_id=f"{trial.experiment_id}.{trial.trial_id}",
        allocation_id=f"{trial.trial_id}.{trial.trial_run_id}",
        task_type="TRIAL",
        latest_checkpoint=trial.latest_checkpoint,
        trial=TrialInfoDoc(
            trial_id=trial.trial_id,
            experiment_id=trial.experiment_id,
            trial_seed=trial.trial_seed,
            hparams=dict(trial.hparams),
            config=config.to_dict(),
            steps_completed=trial.steps_completed,
            trial_run_id=trial.trial_run_id,
            user_data=dict(trial.user_data if trial.user_data is not None else config.data),
        ),
    )


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
    shape = node_shape(slots, config.slurm, pool, single_node=config.resources.is_single_node)
    argv = run_files.resolve_entrypoint(config.entrypoint, slots, paths.python)
    ntasks = shape.gpus_per_node if run_files.tasks_per_slot(argv) and shape.gpus_per_node else 1
    time_limit = job_time_limit(config.slurm, pool, CHAIN_HINT)
    trial_dir, run_dir = run_dirs(paths.runs_root, trial.experiment_id, trial.trial_id, trial.trial_run_id)
    storage_root = checkpoint_root_of(config, paths.checkpoint_root)
    request = JobRequest(
        name=f"det-e{trial.experiment_id}-t{trial.trial_id}",
        comment=job_comment(cluster_id, trial.experiment_id, trial.trial_id, trial.trial_run_id),
        run_dir=run_dir,
        job_dir=trial_dir,
        workdir=posixpath.join(trial_dir, run_files.WORK_DIR),
        entrypoint=config.entrypoint,
        entrypoint_slots=slots,
        shape=shape,
        ntasks_per_node=ntasks,
        env=trial_env(trial, trial_dir, run_dir, storage_root, pool.preempt_signal),
        cluster_info=trial_cluster_info(config, trial, shape.gpus_per_node, master_url, cluster_id),
        environment=config.environment,
        bind_mounts=config.bind_mounts,
        # A `directory` storage is the image's own path: nothing to bind.
        checkpoint_root=None if isinstance(config.checkpoint_storage, DirectoryStorage) else storage_root,
        slurm=config.slurm,
        resource_priority=config.resources.priority,
        pool=pool,
        paths=paths,
        time_limit_min=time_limit,
        preempt_lead_s=signal_lead_s(pool, time_limit),
        context_archive=trial.context_archive,
        max_context_bytes=max_context_bytes,
    )
    return plan_job(request, TrialJobPlan, trial_dir=trial_dir, session_token=session_token)


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
