"""The one way a config enters: strict YAML → typed model → the master's defaults → a dry run.

    checked = load_experiment_config(text, master)    # the master's create (and validate-only create)
    checked = load_experiment_config(text, None)      # `det preview` with no master config: see below
    task = admit_task(raw, TaskType.COMMAND, master, master_url=..., cluster_id=..., has_context=...)

Experiments:

1. `load_yaml`: duplicate keys refused, size, nesting and alias expansion bounded;
2. `parse_experiment_config`: the typed model; unknown keys refused with "did you mean"; the Slurm backend's
   sbatch-options policy; the node shape when the config itself sets ``slurm.slots_per_node``;
3. `complete_experiment_config`: the master's defaults merged (a GC-only ``checkpoint_storage`` into the
   master's storage), Determined's eventually-required fields checked (``searcher.metric``,
   ``records_per_epoch`` for lengths in epochs, ...), the experiment seed fixed;
4. `trialjob.dry_run_trial_job`: the first trial's job script built, not submitted, against the target pool
   (the pool must exist, its slots per node hold ``slots_per_trial``, the time limit fit its maximum, the
   user's sbatch options not clash with the pool's, an image have a runtime to run it).

Whatever submission would refuse is refused here as an `ExperimentConfigError` naming the YAML path; what is
stored is the completed config, which downstream code reads through the typed model.

Without the master's config (``master=None``), phase 3 uses the built-in master defaults and phase 4 a
stand-in pool (`trialjob.stand_in_pool`): the pool's name, slots per node and limits are then not checked
(`CheckedConfig.pool_known` is False).

Tasks (commands, notebooks, shells, TensorBoards; `admit_task`): `parse_task_config` (the task's own model,
made of the experiment config's sections), then the task's job built, not submitted, against its pool.

This module sits above the config package (`expconf` imports nothing above it) and below everything that
takes a config from a user: the API's create and launch routes, ``det preview``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpc_master.errors import ClientError
from hpc_master.expconf._errors import ExperimentConfigError
from hpc_master.expconf._yaml import load_yaml
from hpc_master.expconf.complete import complete_experiment_config
from hpc_master.expconf.experiment import ExperimentConfig, parse_experiment_config
from hpc_master.expconf.tasks import TaskConfig, TaskType, parse_task_config
from hpc_master.jobplan import DEFAULT_MAX_CONTEXT_BYTES, JobPaths, PoolSpec, pool_from_master_config
from hpc_master.masterconf import MasterConfig
from hpc_master.taskjob import TaskJobPlan, build_task_job, task_argv
from hpc_master.trialjob import TrialJobPlan, dry_run_trial_job, stand_in_pool


@dataclass(frozen=True)
class CheckedConfig:
    config: ExperimentConfig  # completed: the master's defaults merged, the seed fixed
    job: TrialJobPlan  # the dry run's job (first trial, placeholder ids and token)
    pool: PoolSpec  # the pool the job was built against
    pool_known: bool  # False: a stand-in pool, because the master's pools were not given

    @property
    def warnings(self) -> list[str]:
        return self.config.warnings


def load_experiment_config(
    source: str | bytes | Mapping[str, Any],
    master: MasterConfig | None,
    *,
    experiment_seed: int | None = None,
) -> CheckedConfig:
    """Run the four phases; raise `ExperimentConfigError` (code ``invalid_config``) naming the field."""
    if isinstance(source, str | bytes):
        try:
            source = load_yaml(source)
        except ExperimentConfigError as err:
            raise ExperimentConfigError(err.message, field=err.field or "config") from None
        if not isinstance(source, Mapping):
            raise ExperimentConfigError("the experiment config must be a YAML mapping", field="config")
    parsed = parse_experiment_config(source)
    known = master is not None
    master = master if master is not None else MasterConfig()
    config = complete_experiment_config(
        parsed,
        master.experiment_defaults(),
        defaults_field="master defaults",
        experiment_seed=experiment_seed,
    )
    try:
        if known:
            pool = pool_from_master_config(master, config.resources.resource_pool)
        else:
            pool = stand_in_pool(config)
        job = dry_run_trial_job(config, master, pool)
    except ExperimentConfigError:
        raise
    except ClientError as err:  # the builder's refusals name config fields already
        raise ExperimentConfigError(err.message, field=err.field) from None
    return CheckedConfig(config=config, job=job, pool=pool, pool_known=known)


@dataclass(frozen=True)
class AdmittedTask:
    config: TaskConfig
    job: TaskJobPlan  # the dry run's job (a placeholder task id)
    pool: PoolSpec


def admit_task(
    raw: Mapping[str, Any] | None,
    task_type: TaskType,
    master: MasterConfig,
    *,
    master_url: str,
    cluster_id: str,
    has_context: bool,
    placeholder_id: str = "00000000-0000-4000-8000-000000000000",
) -> AdmittedTask:
    """Parse a task's config and dry-run its job against its pool: whatever submission would refuse is
    refused now, naming the field (`ExperimentConfigError` or the builder's `ConfigError`)."""
    config = parse_task_config(raw, task_type)
    pool = pool_from_master_config(master, config.resources.resource_pool)
    job = build_task_job(
        config,
        task_type,
        pool,
        task_id=placeholder_id,
        argv=task_argv(config, task_type, "python3") or ["true"],
        paths=JobPaths(
            job_storage_root=str(master.job_storage_dir()),
            checkpoint_root="",
            platform_root="/hpc-det",
            python="python3",
        ),
        master_url=master_url,
        cluster_id=cluster_id,
        has_context=has_context,
        max_context_bytes=DEFAULT_MAX_CONTEXT_BYTES,
    )
    return AdmittedTask(config=config, job=job, pool=pool)
