"""Named converters from ORM rows to Determined-shaped JSON (camelCase; ``STATE_`` enum names)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from hpc_master.db.models import (
    ExperimentModel,
    MetricModel,
    ModelVersionModel,
    RegistryModel,
    TrialModel,
    TrialRunModel,
    UserModel,
)
from hpc_master.services import redact, workspaces
from hpc_master.services.access import Principal
from hpc_master.services.checkpoints import records as ckpts
from hpc_master.services.checkpoints.usage import StorageTotals
from hpc_master.services.checkpoints.views import CheckpointView
from hpc_master.services.stored_config import experiment_config, shown_config
from slurm_backend import pending

# libyaml's safe dumper when PyYAML has it (same text, ~5x faster: a page of other users' experiments dumps
# each masked config; 0.76 ms → 0.16 ms a config, measured for bench/many_users.py's list-all p99).
_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def iso(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def api_state(state: str) -> str:
    return f"STATE_{state}"


def user_to_api(user: UserModel) -> dict[str, Any]:
    return {
        "id": user.id,
        "username": user.username,
        "admin": user.admin,
        "active": user.active,
        "displayName": user.display_name or "",
        "unixUsername": user.unix_username or user.username,
        "agentUserGroup": {"agentUser": user.unix_username or user.username},
        "modifiedAt": iso(user.created_at),
    }


def unsaved_experiment() -> dict[str, Any]:
    """Determined's answer to a validate-only create (``det e create --test`` checks the config first): an
    experiment with every field at its zero value, which Determined's client reads without error."""
    return {
        "id": 0, "name": "", "description": "", "labels": [], "state": "STATE_UNSPECIFIED", "archived": False,
        "startTime": "1970-01-01T00:00:00Z", "numTrials": 0, "trialIds": [], "username": "", "userId": 0,
        "resourcePool": "", "searcherType": "", "searcherMetric": "", "config": {}, "originalConfig": "",
        "projectId": 0, "projectOwnerId": 0, "workspaceId": 0, "jobId": "", "notes": "", "progress": 0,
        "parentArchived": False,
    }  # fmt: skip


def experiment_to_api(
    experiment: ExperimentModel,
    username: str,
    trial_ids: list[int] | None = None,
    *,
    viewer: Principal,
    with_config: bool = True,
    storage: StorageTotals | None = None,
) -> dict[str, Any]:
    """`viewer`: who asks. The experiment's owner and admins see its config and original text; others see the
    config as ``redact.shown`` gives it (secret-looking values masked), and the original text as that masked
    config's YAML. `storage`: its checkpoints' totals (``checkpointSize``, ``checkpointCount``, ...), when the
    caller read them."""
    typed = shown_config(experiment)  # None: a config this master refuses, listed without what it says
    searcher = typed.searcher if typed is not None else None
    workspace, project = workspaces.names_of(typed)
    out: dict[str, Any] = {
        "id": experiment.id,
        "name": experiment.name,
        "description": experiment.description,
        "labels": list(typed.labels) if typed is not None else [],
        "state": api_state(experiment.state),
        "archived": experiment.archived,
        "startTime": iso(experiment.start_time),
        "endTime": iso(experiment.end_time),
        "userId": experiment.owner_id,
        "username": username,
        "displayName": username,
        "resourcePool": experiment.resource_pool,
        "searcherType": searcher.name if searcher is not None else "",
        "searcherMetric": (searcher.metric or "") if searcher is not None else "",
        "progress": experiment.progress,
        "forkedFrom": experiment.parent_id,
        "projectId": workspaces.DEFAULT_ID,
        "projectOwnerId": 1,  # the one default project's (Determined's client requires the field)
        "workspaceId": workspaces.DEFAULT_ID,
        # The config's `workspace` and `project` keys, stored and shown (services.workspaces).
        "workspaceName": workspace,
        "projectName": project,
        "parentArchived": False,
        "notes": "",
        "jobId": f"exp-{experiment.id}",
    }
    if trial_ids is not None:
        out["trialIds"] = trial_ids
        out["numTrials"] = len(trial_ids)
    if storage is not None:
        out.update(storage.experiment_fields())
    if with_config:
        config = redact.shown(experiment.config, viewer, experiment.owner_id)
        out["config"] = config
        # The text as submitted only with the config itself (shown unmasked); else the masked config's YAML.
        unmasked = config is experiment.config
        out["originalConfig"] = (
            experiment.config_text if unmasked else yaml.dump(config, Dumper=_YAML_DUMPER, sort_keys=False)
        )
    return out


def run_to_api(run: TrialRunModel) -> dict[str, Any]:
    return {
        "id": run.id,
        "trialRunId": run.run_number,
        "slurmJobId": run.slurm_job_id,
        "nodeList": run.node_list,
        "state": run.state,
        "exitReason": run.exit_reason,
        "exitMessage": run.exit_message,
        "runnerState": run.runner_state,
        "submitTime": iso(run.submit_time),
        "startTime": iso(run.start_time),
        "endTime": iso(run.end_time),
        # Why a PENDING run waits (Slurm's pending reason, or the master's before sbatch) and since when;
        # waitingIn: "slurm" (submitted, pending there) or "master" (held back: a submit limit, no controller).
        "pendingReason": run.pending_reason,
        "pendingSince": iso(run.pending_since),
        **pending_fields(run.pending_reason if run.state == "PENDING" else None),
        "jobsAhead": run.jobs_ahead if run.state == "PENDING" else None,
        "waitingIn": (("slurm" if run.slurm_job_id else "master") if run.state == "PENDING" else None),
    }


def pending_fields(reason: str | None) -> dict[str, Any]:
    """The class of a pending reason and whether the job is stuck (``slurm_backend.pending``)."""
    return {"pendingClass": pending.classify(reason), "stuck": pending.is_stuck(reason)}


def trial_to_api(
    trial: TrialModel,
    viewer: Principal,
    owner_id: int,
    runs: list[TrialRunModel] | None = None,
    *,
    storage: StorageTotals | None = None,
) -> dict[str, Any]:
    """`viewer`: who asks; `owner_id`: the trial's experiment's owner (``redact.shown`` of the hparams)."""
    out: dict[str, Any] = {
        "id": trial.id,
        "experimentId": trial.experiment_id,
        "requestId": trial.request_id,
        "state": api_state(trial.state),
        "restarts": trial.restarts,
        "hparams": redact.shown(trial.hparams, viewer, owner_id),
        "seed": trial.seed,
        "proposal": trial.proposal,  # ours: random | model | grid | given (searcher.proposals)
        "totalBatchesProcessed": trial.steps_completed,
        "stepsCompleted": trial.steps_completed,
        "latestCheckpointUuid": trial.latest_checkpoint,
        "searcherMetricValue": trial.searcher_metric,
        "bestValidationMetric": trial.best_validation,
        "progress": trial.progress,
        "runId": trial.run_id,
        "exitMessage": trial.exit_message,
        "startTime": iso(trial.start_time),
        "endTime": iso(trial.end_time),
    }
    if runs is not None:
        out["runs"] = [run_to_api(r) for r in runs]
        out["runnerState"] = runs[-1].runner_state if runs else None
    if storage is not None:
        out.update(storage.trial_fields())
    return out


def metric_to_api(row: MetricModel) -> dict[str, Any]:
    return {
        "id": row.id,
        "trialId": row.trial_id,
        "trialRunId": row.trial_run_id,
        "stepsCompleted": row.steps_completed,
        "group": row.group,
        "metrics": row.metrics,
        "reportTime": iso(row.report_time),
    }


def metrics_to_api(stored: dict[str, Any] | None) -> dict[str, Any] | None:
    """Determined's ``v1Metrics`` of a stored report: flat (``{"loss": 0.1}``) or Determined's own shape
    (``{"avgMetrics": ..., "batchMetrics": ...}``), as reports come."""
    if stored is None:
        return None
    avg = stored.get("avgMetrics")
    if not isinstance(avg, dict):
        return {"avgMetrics": stored}
    out: dict[str, Any] = {"avgMetrics": avg}
    if stored.get("batchMetrics") is not None:
        out["batchMetrics"] = stored["batchMetrics"]
    return out


def checkpoints_to_api(
    views: Iterable[CheckpointView], principal: Principal, default_root: Path
) -> list[dict[str, Any]]:
    """Determined's ``v1Checkpoint`` of each checkpoint, what every route that answers checkpoints gives.

    ``training`` carries what Determined's client requires: ``experimentConfig`` (the experiment's config,
    its ``checkpoint_storage`` the one its jobs used: `default_root`, ``MasterConfig.checkpoint_dir()``,
    when the config names none) and the trial's ``hparams``, both as ``redact.shown`` gives them to
    `principal` (as ``GET /experiments/{id}`` and ``GET /trials/{id}`` do), and ``validationMetrics``
    (``{"avgMetrics": ...}``, the validation at the checkpoint's steps) with ``searcherMetric``, its value of
    the searcher metric."""
    configs: dict[int, dict[str, Any]] = {}
    out = []
    for view in views:
        experiment = view.experiment
        if experiment.id not in configs:
            config = dict(experiment.config or {})
            config["checkpoint_storage"] = ckpts.effective_storage(
                experiment_config(experiment), default_root
            )
            configs[experiment.id] = redact.shown(config, principal, experiment.owner_id)
        hparams = redact.shown(view.trial.hparams, principal, experiment.owner_id)
        out.append(_checkpoint_json(view, configs[experiment.id], hparams))
    return out


def checkpoint_to_api(view: CheckpointView, principal: Principal, default_root: Path) -> dict[str, Any]:
    return checkpoints_to_api([view], principal, default_root)[0]


def _checkpoint_json(
    view: CheckpointView, experiment_config: dict[str, Any], hparams: dict[str, Any]
) -> dict[str, Any]:
    ckpt, trial = view.checkpoint, view.trial
    out: dict[str, Any] = {
        "uuid": ckpt.uuid,
        "taskId": f"{ckpt.trial_id}",
        "allocationId": f"{ckpt.trial_id}.{ckpt.trial_run_id}",
        "reportTime": iso(ckpt.report_time),
        "resources": ckpt.resources,
        "metadata": ckpt.metadata_,
        "state": api_state(ckpt.state),
        "stepsCompleted": ckpt.steps_completed,
        "size": ckpt.size_bytes or 0,
    }
    if ckpt.gc_error or ckpt.gc_retry_at is not None:
        # Its deletion is wanted and not done: why the last attempt failed, and when the next one is due.
        out["deletion"] = {
            "error": ckpt.gc_error,
            "attempts": ckpt.gc_attempts or 0,
            "retryAt": iso(ckpt.gc_retry_at),
        }
    out["training"] = {
        "trialId": ckpt.trial_id,
        "trialRunId": ckpt.trial_run_id,
        "experimentId": trial.experiment_id,
        "hparams": hparams,
        "experimentConfig": experiment_config,
        "validationMetrics": metrics_to_api(view.validation),
        "searcherMetric": view.searcher_metric,
    }
    return out


def pagination(offset: int, limit: int, total: int, returned: int) -> dict[str, int]:
    return {
        "offset": offset,
        "limit": limit,
        "startIndex": offset,
        "endIndex": offset + returned,
        "total": total,
    }


def model_to_api(model: RegistryModel, username: str, num_versions: int) -> dict[str, Any]:
    """Determined's ``v1Model``."""
    return {
        "id": model.id,
        "name": model.name,
        "description": model.description or "",
        "metadata": model.metadata_ or {},
        "creationTime": iso(model.creation_time),
        "lastUpdatedTime": iso(model.last_updated_time),
        "numVersions": num_versions,
        "labels": list(model.labels or []),
        "username": username,
        "userId": model.user_id,
        "archived": model.archived,
        "notes": model.notes or "",
        "workspaceId": model.workspace_id,
    }


def model_version_to_api(
    version: ModelVersionModel, model: dict[str, Any], checkpoint: dict[str, Any], username: str
) -> dict[str, Any]:
    """Determined's ``v1ModelVersion``: `model` and `checkpoint` as ``model_to_api`` and
    ``checkpoint_to_api`` give them."""
    return {
        "id": version.id,
        "model": model,
        "checkpoint": checkpoint,
        "version": version.version,
        "creationTime": iso(version.creation_time),
        "lastUpdatedTime": iso(version.last_updated_time),
        "name": version.name or "",
        "comment": version.comment or "",
        "notes": version.notes or "",
        "metadata": version.metadata_ or {},
        "labels": list(version.labels or []),
        "username": username,
        "userId": version.user_id,
    }
