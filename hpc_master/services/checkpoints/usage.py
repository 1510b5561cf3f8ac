"""Storage accounting: checkpoint counts and bytes per trial and per experiment, kept and freed.

Each checkpoint's size is the sum of its ``resources`` (recorded as it is reported, ``size_bytes``). Kept:
every checkpoint not DELETED (a PARTIALLY_DELETED one still holds files); freed: the DELETED ones, by the GC
policy or by hand. The API names follow Determined: an experiment's ``checkpointSize``/``checkpointCount``,
a trial's ``totalCheckpointSize``/``checkpointCount``; the freed totals are ours
(``deletedCheckpointSize``/``deletedCheckpointCount``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from hpc_master.db.models import CheckpointModel, TrialModel


@dataclass(frozen=True)
class StorageTotals:
    count: int = 0
    size_bytes: int = 0
    deleted_count: int = 0
    deleted_bytes: int = 0

    def experiment_fields(self) -> dict[str, Any]:
        return {
            "checkpointSize": self.size_bytes,
            "checkpointCount": self.count,
            "deletedCheckpointSize": self.deleted_bytes,
            "deletedCheckpointCount": self.deleted_count,
        }

    def trial_fields(self) -> dict[str, Any]:
        return {
            "totalCheckpointSize": self.size_bytes,
            "checkpointCount": self.count,
            "deletedCheckpointSize": self.deleted_bytes,
            "deletedCheckpointCount": self.deleted_count,
        }


def _totals(session: Session, key: Any, where: Any) -> dict[int, StorageTotals]:
    deleted = case((CheckpointModel.state == "DELETED", 1), else_=0)
    rows = session.execute(
        select(key, deleted, func.count(), func.coalesce(func.sum(CheckpointModel.size_bytes), 0))
        .select_from(CheckpointModel)
        .join(TrialModel, TrialModel.id == CheckpointModel.trial_id)
        .where(where)
        .group_by(key, deleted)
    ).all()
    acc: dict[int, list[int]] = {}
    for owner_id, is_deleted, count, size in rows:
        item = acc.setdefault(int(owner_id), [0, 0, 0, 0])
        offset = 2 if is_deleted else 0
        item[offset] += int(count)
        item[offset + 1] += int(size)
    return {k: StorageTotals(*v) for k, v in acc.items()}


def experiment_totals(session: Session, experiment_ids: Iterable[int]) -> dict[int, StorageTotals]:
    """{experiment id: totals}; experiments with no checkpoint are absent (their totals are zeros)."""
    ids = list(experiment_ids)
    if not ids:
        return {}
    return _totals(session, TrialModel.experiment_id, TrialModel.experiment_id.in_(ids))


def trial_totals(session: Session, trial_ids: Iterable[int]) -> dict[int, StorageTotals]:
    ids = list(trial_ids)
    if not ids:
        return {}
    return _totals(session, CheckpointModel.trial_id, CheckpointModel.trial_id.in_(ids))


def trial_totals_of_experiment(session: Session, experiment_id: int) -> dict[int, StorageTotals]:
    """{trial id: totals} for every trial of the experiment that has checkpoints."""
    return _totals(session, CheckpointModel.trial_id, TrialModel.experiment_id == experiment_id)
