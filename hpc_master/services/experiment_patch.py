"""``PATCH /api/v1/experiments/{id}``: an experiment's name, description, labels, checkpoint GC policy and
resources (``priority``, ``weight``, ``max_slots``); ``PUT/DELETE /experiments/{id}/labels/{label}``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from hpc_master.db.models import ExperimentModel
from hpc_master.errors import ClientError, NotFoundError
from hpc_master.services import access
from hpc_master.services.access import Action, Principal
from hpc_master.services.checkpoints.policy import GC_FIELDS
from hpc_master.services.common import record_event
from hpc_master.services.lifecycle import request_checkpoint_gc
from hpc_master.services.stored_config import edited_config, stored_labels

RESOURCE_DEFAULTS: dict[str, Any] = {"max_slots": None, "priority": None, "weight": 1.0}
"""The config's ``resources`` fields that Determined's ``PatchExperiment`` sets, each with the value that a
``null`` restores (``expconf.resources``'s defaults)."""
MAX_LABELS = 100
MAX_LABEL_CHARS = 256


def patch_experiment(
    session: Session,
    principal: Principal,
    experiment_id: int,
    *,
    name: str | None = None,
    description: str | None = None,
    labels: Sequence[str] | None = None,
    gc_policy: Mapping[str, int] | None = None,
    resources: Mapping[str, Any] | None = None,
) -> ExperimentModel:
    """Change what is given (owner or admin only). A name, description and labels are written into the
    stored config as well (``det e config`` shows them, as Determined's does). A GC policy (any of
    ``save_experiment_best``, ``save_trial_best``, ``save_trial_latest``; the others keep their values) is
    written into the config's ``checkpoint_storage``, as Determined does, and the experiment's checkpoints
    are collected again under it (by the lifecycle loop). `resources` (``max_slots``, ``priority``,
    ``weight``; ``None`` restores the default) are stored in the config's ``resources`` and bump the row's
    version, which tells the loop to re-read them (``lifecycle.priorities``); a rename, labels or a GC
    policy leave the version alone, so they do not make the loop's step stale."""
    experiment = session.get(ExperimentModel, experiment_id, with_for_update=True)
    if experiment is None:
        raise NotFoundError(f"experiment {experiment_id} not found")
    access.experiment(principal, experiment, Action.CHANGE)
    values, set_in_config = _named_fields(name, description, labels)
    policy = _gc_policy(gc_policy)
    wanted = _resources(resources)
    merged = {k: v for k, v in (("checkpoint_storage", policy), ("resources", wanted)) if v}
    config = edited_config(experiment, set_in_config, merged)  # checked by the typed model, as stored
    if config != (experiment.config or {}):
        values["config"] = config
    if not values:
        return experiment
    if wanted:  # the loop re-reads priority and max_slots when the row's version moves (lifecycle.priorities)
        values["version"] = ExperimentModel.version + 1
    session.execute(
        update(ExperimentModel)
        .where(ExperimentModel.id == experiment_id)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    session.refresh(experiment)
    _record_settings(session, principal, experiment_id, experiment.state, policy=policy, resources=wanted)
    if policy:
        request_checkpoint_gc(session, experiment_id)
    return experiment


def _named_fields(
    name: str | None, description: str | None, labels: Sequence[str] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The row's columns and the config's keys that a name, description and labels set."""
    values: dict[str, Any] = {}
    set_in_config: dict[str, Any] = {}
    if name is not None:
        values["name"] = set_in_config["name"] = name
    if description is not None:
        values["description"] = set_in_config["description"] = description
    if labels is not None:
        set_in_config["labels"] = check_labels(labels)
    return values, set_in_config


def _gc_policy(gc_policy: Mapping[str, int] | None) -> dict[str, int]:
    """The GC policy fields given (not None), all known ones."""
    policy = {k: v for k, v in (gc_policy or {}).items() if v is not None}
    if set(policy) - set(GC_FIELDS):
        raise ClientError(f"unknown GC policy fields {sorted(set(policy) - set(GC_FIELDS))}")
    return policy


def _resources(resources: Mapping[str, Any] | None) -> dict[str, Any]:
    """The resources fields given, all known ones, each None replaced by its default."""
    wanted = {k: RESOURCE_DEFAULTS[k] if v is None else v for k, v in (resources or {}).items()}
    if set(wanted) - set(RESOURCE_DEFAULTS):
        raise ClientError(f"unknown resources fields {sorted(set(wanted) - set(RESOURCE_DEFAULTS))}")
    return wanted


def _record_settings(
    session: Session,
    principal: Principal,
    experiment_id: int,
    state: str,
    *,
    policy: Mapping[str, Any],
    resources: Mapping[str, Any],
) -> None:
    """One event per kind of setting changed (a GC policy, resources), saying what and by whom."""
    for what, changed in (("GC policy", policy), ("resources", resources)):
        if changed:
            shown = ", ".join(f"{k}: {v}" for k, v in changed.items())
            reason = f"{what} set ({shown}) by {principal.username}"
            record_event(session, "experiment", experiment_id, state, state, reason)


def check_labels(labels: Sequence[str]) -> list[str]:
    """The labels to store: each 1 to `MAX_LABEL_CHARS` characters without NUL, duplicates dropped (first
    kept), at most `MAX_LABELS`."""
    out: list[str] = []
    for label in labels:
        if not isinstance(label, str) or not 1 <= len(label) <= MAX_LABEL_CHARS or "\0" in label:
            raise ClientError(
                f"a label is 1 to {MAX_LABEL_CHARS} characters, without NUL: {str(label)[:80]!r}",
                field="labels",
            )
        if label not in out:
            out.append(label)
    if len(out) > MAX_LABELS:
        raise ClientError(f"an experiment has at most {MAX_LABELS} labels", field="labels")
    return out


def change_label(
    session: Session, principal: Principal, experiment_id: int, label: str, *, add: bool
) -> list[str]:
    """Add `label` (a no-op when it is there) or remove it (a no-op when it is not); the labels after."""
    experiment = session.get(ExperimentModel, experiment_id)
    if experiment is None:
        raise NotFoundError(f"experiment {experiment_id} not found")
    access.experiment(principal, experiment, Action.CHANGE)
    labels = stored_labels(experiment)
    wanted = [*labels, label] if add else [x for x in labels if x != label]
    if add:
        check_labels([label])
    if wanted == labels:
        return labels
    return stored_labels(patch_experiment(session, principal, experiment_id, labels=wanted))
