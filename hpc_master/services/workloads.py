"""A trial's workloads as Determined lists them (``GET /api/v1/trials/{id}/workloads``): its training and
validation reports and its checkpoints, one list in the order of the steps they were reported at.

Only ids and steps are read for the whole trial; the rows of the page asked for are loaded after slicing, so
a trial with many reports costs one narrow query per kind, not a full read.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from hpc_master.db.models import CheckpointModel, MetricModel

WORKLOAD_GROUPS = ("training", "validation")
"""The metric groups that are workloads (other groups are not, as in Determined)."""


class WorkloadFilter(enum.StrEnum):
    """Determined's ``GetTrialWorkloadsRequest.FilterOption``."""

    UNSPECIFIED = "FILTER_OPTION_UNSPECIFIED"
    CHECKPOINT = "FILTER_OPTION_CHECKPOINT"
    VALIDATION = "FILTER_OPTION_VALIDATION"
    CHECKPOINT_OR_VALIDATION = "FILTER_OPTION_CHECKPOINT_OR_VALIDATION"


@dataclass(frozen=True)
class WorkloadPage:
    items: list[MetricModel | CheckpointModel]
    total: int


@dataclass(frozen=True, order=True)
class _Key:
    """Sorts workloads by steps; at equal steps training, then the checkpoint, then validation."""

    steps: int
    kind: int
    metric_id: int = 0
    uuid: str = ""


_KIND = {"training": 0, "checkpoint": 1, "validation": 2}
_GROUPS = {
    WorkloadFilter.UNSPECIFIED: WORKLOAD_GROUPS,
    WorkloadFilter.CHECKPOINT: (),
    WorkloadFilter.VALIDATION: ("validation",),
    WorkloadFilter.CHECKPOINT_OR_VALIDATION: ("validation",),
}


def list_workloads(
    session: Session,
    trial_id: int,
    *,
    filter_option: WorkloadFilter = WorkloadFilter.UNSPECIFIED,
    offset: int = 0,
    limit: int = 0,
    descending: bool = False,
    remove_deleted: bool = False,
) -> WorkloadPage:
    """The page [`offset`, `offset` + `limit`) (`limit` 0 or less: to the end) of the trial's workloads in
    the order of ``_Key``, and how many there are in all. `remove_deleted`: leave out deleted checkpoints."""
    keys: list[_Key] = []
    groups = _GROUPS[filter_option]
    if groups:
        keys += _metric_keys(session, trial_id, groups)
    if filter_option != WorkloadFilter.VALIDATION:
        keys += _checkpoint_keys(session, trial_id, remove_deleted=remove_deleted)
    keys.sort(reverse=descending)
    page = keys[offset:] if limit <= 0 else keys[offset : offset + limit]
    return WorkloadPage(items=_workloads(session, page), total=len(keys))


def _metric_keys(session: Session, trial_id: int, groups: Sequence[str]) -> list[_Key]:
    rows = session.execute(
        select(MetricModel.id, MetricModel.steps_completed, MetricModel.group).where(
            MetricModel.trial_id == trial_id, MetricModel.group.in_(groups)
        )
    )
    return [_Key(steps, _KIND[group], metric_id=row_id) for row_id, steps, group in rows]


def _checkpoint_keys(session: Session, trial_id: int, *, remove_deleted: bool) -> list[_Key]:
    stmt = select(CheckpointModel.uuid, CheckpointModel.steps_completed).where(
        CheckpointModel.trial_id == trial_id
    )
    if remove_deleted:
        stmt = stmt.where(CheckpointModel.state != "DELETED")
    ckpts = session.execute(stmt)
    return [_Key(steps, _KIND["checkpoint"], uuid=uuid) for uuid, steps in ckpts]


def _workloads(session: Session, page: list[_Key]) -> list[MetricModel | CheckpointModel]:
    """The page's metric reports and checkpoints, in its order."""
    metric_ids = [k.metric_id for k in page if not k.uuid]
    uuids = [k.uuid for k in page if k.uuid]
    metrics = {m.id: m for m in session.scalars(select(MetricModel).where(MetricModel.id.in_(metric_ids)))}
    checkpoints = {
        c.uuid: c for c in session.scalars(select(CheckpointModel).where(CheckpointModel.uuid.in_(uuids)))
    }
    return [checkpoints[k.uuid] if k.uuid else metrics[k.metric_id] for k in page]
