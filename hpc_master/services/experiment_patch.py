"""``PATCH /api/v1/experiments/{id}``: an experiment's name, description and checkpoint GC policy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from hpc_master.db.models import ExperimentModel
from hpc_master.errors import ClientError, NotFoundError
from hpc_master.services.checkpoint_policy import GC_FIELDS
from hpc_master.services.common import record_event
from hpc_master.services.experiments import can_modify
from hpc_master.services.lifecycle import request_checkpoint_gc
from hpc_master.services.users import Principal


def patch_experiment(
    session: Session,
    principal: Principal,
    experiment_id: int,
    *,
    name: str | None = None,
    description: str | None = None,
    gc_policy: Mapping[str, int] | None = None,
) -> ExperimentModel:
    """Change what is given (owner or admin only). A GC policy (any of ``save_experiment_best``,
    ``save_trial_best``, ``save_trial_latest``; the others keep their values) is written into the stored
    config's ``checkpoint_storage``, as Determined does, and the experiment's checkpoints are collected again
    under it (by the lifecycle loop). Nothing cached from the config reads these fields (the loop's parsed
    configs are for jobs), so the row's version is left alone: a rename does not make the loop's step stale."""
    experiment = session.get(ExperimentModel, experiment_id, with_for_update=True)
    if experiment is None:
        raise NotFoundError(f"experiment {experiment_id} not found")
    can_modify(principal, experiment)
    values: dict[str, Any] = {}
    if name is not None:
        values["name"] = name
    if description is not None:
        values["description"] = description
    policy = {k: v for k, v in (gc_policy or {}).items() if v is not None}
    if set(policy) - set(GC_FIELDS):
        raise ClientError(f"unknown GC policy fields {sorted(set(policy) - set(GC_FIELDS))}")
    if policy:
        config = dict(experiment.config or {})
        storage = config.get("checkpoint_storage")
        config["checkpoint_storage"] = {**(storage if isinstance(storage, dict) else {}), **policy}
        values["config"] = config
    if not values:
        return experiment
    session.execute(
        update(ExperimentModel)
        .where(ExperimentModel.id == experiment_id)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    session.refresh(experiment)
    if policy:
        shown = ", ".join(f"{k}: {v}" for k, v in policy.items())
        state = experiment.state
        record_event(
            session,
            "experiment",
            experiment_id,
            state,
            state,
            f"GC policy set ({shown}) by {principal.username}",
        )
        request_checkpoint_gc(session, experiment_id)
    return experiment
