"""Checkpoints: registration (idempotent on uuid), lookup, where their directories are (deletion and GC:
``checkpoints.gc``; what their API answers show and how lists sort: ``checkpoints.views``)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from hpc_master.db.models import CheckpointModel, ExperimentModel, TrialModel, utcnow
from hpc_master.errors import ClientError, ConflictError
from hpc_master.expconf import ExperimentConfig
from hpc_master.services.checkpoints.policy import GC_FIELDS
from hpc_master.services.common import get_or_404
from hpc_master.services.stored_config import experiment_config

CHECKPOINT_STATES = {"ACTIVE", "COMPLETED", "ERROR", "DELETED", "PARTIALLY_DELETED"}
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""A checkpoint's uuid is its directory's name under the storage root: only the canonical lowercase form
(what ``str(uuid.uuid4())`` gives, and what the harness sends) is accepted, so no uuid can name a path."""


def check_checkpoint_uuid(value: str) -> str:
    """The uuid, if canonical; raises ValueError (a pydantic validator's error) otherwise."""
    if not UUID_RE.fullmatch(value):
        shown = value if len(value) <= 40 else value[:40] + "…"
        raise ValueError(f"a checkpoint uuid must be a lowercase UUID like str(uuid.uuid4()), got {shown!r}")
    return value


@dataclass(frozen=True)
class CheckpointReport:
    uuid: str
    trial_id: int
    trial_run_id: int
    steps_completed: int
    resources: dict[str, Any]
    metadata: dict[str, Any]
    state: str = "COMPLETED"
    report_time: dt.datetime | None = None


def report_checkpoint(session: Session, report: CheckpointReport) -> CheckpointModel:
    state = report.state.removeprefix("STATE_")
    if state not in CHECKPOINT_STATES:
        raise ClientError(f"unknown checkpoint state {report.state!r}", field="checkpoint.state")
    existing = session.get(CheckpointModel, report.uuid)
    if existing is not None:
        if existing.trial_id != report.trial_id:
            raise ConflictError(f"checkpoint {report.uuid} belongs to another trial", field="checkpoint.uuid")
        return existing
    trial = get_or_404(session, TrialModel, report.trial_id, "trial")
    row = CheckpointModel(
        uuid=report.uuid,
        trial_id=report.trial_id,
        trial_run_id=report.trial_run_id,
        steps_completed=report.steps_completed,
        state=state,
        resources=report.resources,
        metadata_=report.metadata,
        report_time=report.report_time or utcnow(),
        size_bytes=resources_size(report.resources),
    )
    session.add(row)
    if state == "COMPLETED":
        session.execute(
            update(TrialModel)
            .where(TrialModel.id == trial.id)
            .values(latest_checkpoint=report.uuid)
            .execution_options(synchronize_session=False)
        )
    return row


def resources_size(resources: Mapping[str, Any]) -> int:
    """Bytes of a checkpoint's ``resources`` ({path: bytes}; directories count 0)."""
    return sum(v for v in resources.values() if isinstance(v, int) and not isinstance(v, bool) and v > 0)


def get_checkpoint(session: Session, uuid: str) -> CheckpointModel:
    return get_or_404(session, CheckpointModel, uuid, "checkpoint")


def effective_storage(experiment_config: ExperimentConfig, default_root: Path) -> dict[str, Any]:
    """An experiment's checkpoint storage as its trials' jobs get it (``trialjob``): the stored section when it
    names a type; otherwise (no section, or one with only the GC fields, which a job ignores) ``shared_fs`` at
    the master's root, `default_root` (``MasterConfig.checkpoint_dir()``), with the section's GC fields."""
    storage = experiment_config.checkpoint_storage_dict()
    if isinstance(storage, Mapping) and storage.get("type") is not None:
        return dict(storage)
    gc_fields = {k: v for k, v in storage.items() if k in GC_FIELDS} if isinstance(storage, Mapping) else {}
    return {"type": "shared_fs", "host_path": str(default_root), **gc_fields}


def storage_root(experiment_config: ExperimentConfig, default_root: Path) -> Path | None:
    """Where an experiment's checkpoints live on this host, from its stored config (the master's root when it
    names no storage); None for storage the master cannot see the same way (a container-side directory)."""
    storage = effective_storage(experiment_config, default_root)
    if storage.get("type") == "shared_fs" and isinstance(storage.get("host_path"), str):
        sub = storage.get("storage_path")
        return (
            Path(storage["host_path"]) / sub if isinstance(sub, str) and sub else Path(storage["host_path"])
        )
    return None


def checkpoint_dir_map(session: Session, uuids: Iterable[str], default_root: Path) -> dict[str, Path | None]:
    """Each checkpoint's directory, from the database's record (its experiment's storage and its own uuid),
    never from a caller's string; None for a row with a non-canonical uuid (none since uuids are checked
    where they enter) or in storage the master cannot see. Unknown uuids are left out."""
    rows = session.execute(
        select(CheckpointModel.uuid, ExperimentModel)
        .join(TrialModel, TrialModel.id == CheckpointModel.trial_id)
        .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
        .where(CheckpointModel.uuid.in_(list(uuids)))
    ).all()
    out: dict[str, Path | None] = {}
    for uuid, experiment in rows:
        root = storage_root(experiment_config(experiment), default_root)
        out[uuid] = root / uuid if root is not None and UUID_RE.fullmatch(uuid) else None
    return out
