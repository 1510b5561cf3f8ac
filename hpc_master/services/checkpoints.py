"""Checkpoints: registration (idempotent on uuid), lookup, where their directories are, and best-N listing
(deletion and GC: ``checkpoint_gc``)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import and_, select, update
from sqlalchemy.orm import Session

from hpc_master.db.models import CheckpointModel, ExperimentModel, MetricModel, TrialModel, utcnow
from hpc_master.errors import ClientError, ConflictError
from hpc_master.services.common import get_or_404
from hpc_master.services.experiments import searcher_metric
from hpc_master.services.metrics import metric_value

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


def storage_root(experiment_config: Mapping[str, Any], default_root: Path) -> Path | None:
    """Where an experiment's checkpoints live on this host, from its stored config (the master's root when it
    names no storage); None for storage the master cannot see the same way (a container-side directory)."""
    storage = experiment_config.get("checkpoint_storage")
    if not isinstance(storage, Mapping):
        return default_root
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
        select(CheckpointModel.uuid, ExperimentModel.config)
        .join(TrialModel, TrialModel.id == CheckpointModel.trial_id)
        .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
        .where(CheckpointModel.uuid.in_(list(uuids)))
    ).all()
    out: dict[str, Path | None] = {}
    for uuid, config in rows:
        root = storage_root(config or {}, default_root)
        out[uuid] = root / uuid if root is not None and UUID_RE.fullmatch(uuid) else None
    return out


@dataclass(frozen=True)
class RankedCheckpoint:
    checkpoint: CheckpointModel
    experiment_id: int
    validation: dict[str, Any] | None
    metric: float | None


def list_experiment_checkpoints(
    session: Session,
    experiment_id: int,
    *,
    sort_by_metric: str | None = None,
    order_by: str | None = None,
    limit: int = 0,
    offset: int = 0,
    states: list[str] | None = None,
) -> list[RankedCheckpoint]:
    """Checkpoints of an experiment, best first by the searcher metric (or `sort_by_metric`).

    A checkpoint's metric is the validation reported by its trial at the same ``steps_completed``.
    """
    experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
    searcher_name, smaller_is_better = searcher_metric(experiment.config)
    metric_name = sort_by_metric or searcher_name
    if sort_by_metric and sort_by_metric != searcher_name:
        smaller_is_better = True
    stmt = (
        select(CheckpointModel, MetricModel.metrics)
        .join(TrialModel, TrialModel.id == CheckpointModel.trial_id)
        .outerjoin(
            MetricModel,
            and_(
                MetricModel.trial_id == CheckpointModel.trial_id,
                MetricModel.steps_completed == CheckpointModel.steps_completed,
                MetricModel.group == "validation",
            ),
        )
        .where(TrialModel.experiment_id == experiment_id)
        .order_by(CheckpointModel.report_time, MetricModel.trial_run_id)
    )
    wanted = {s.removeprefix("STATE_") for s in states} if states else None
    ranked: dict[str, RankedCheckpoint] = {}
    for ckpt, metrics in session.execute(stmt).all():
        if wanted is not None and ckpt.state not in wanted:
            continue
        value = metric_value(metrics, metric_name) if metrics and metric_name else None
        # The latest run's validation at these steps wins (rows are ordered by trial_run_id).
        ranked[ckpt.uuid] = RankedCheckpoint(ckpt, experiment_id, metrics, value)
    items = list(ranked.values())
    descending = order_by is not None and order_by.upper() in ("ORDER_BY_DESC", "DESC")
    if order_by is None or order_by.upper() in ("", "ORDER_BY_UNSPECIFIED"):
        descending = not smaller_is_better
    present = [c for c in items if c.metric is not None]
    absent = [c for c in items if c.metric is None]
    present.sort(key=lambda c: (c.metric, c.checkpoint.report_time), reverse=descending)
    result = present + absent
    result = result[max(offset, 0) :]
    return result[:limit] if limit > 0 else result
