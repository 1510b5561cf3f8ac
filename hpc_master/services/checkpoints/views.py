"""What a checkpoint's API answer is made of, for every route that answers checkpoints (``GET
/api/v1/checkpoints/{uuid}``, ``/experiments/{id}/checkpoints``, ``/trials/{id}/checkpoints`` and the model
registry's versions: ``api.convert.checkpoint_to_api`` turns a `CheckpointView` into Determined's
``v1Checkpoint``), and how checkpoint lists are filtered, sorted and paged, with Determined's parameters.

A checkpoint's validation is the one its trial reported at the checkpoint's ``steps_completed`` (the latest
run's, when a trial ran the same steps again); its searcher metric is that validation's value of the
experiment's ``searcher.metric`` (None when there is none, or it is not a finite number).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, and_, select
from sqlalchemy.orm import Session

from hpc_master.db.models import CheckpointModel, ExperimentModel, MetricModel, TrialModel
from hpc_master.errors import ClientError, NotFoundError
from hpc_master.expconf import ExperimentConfig
from hpc_master.services.common import get_or_404
from hpc_master.services.experiments import searcher_metric
from hpc_master.services.metrics import metric_value
from hpc_master.services.stored_config import experiment_config, shown_config

SORT_ATTRS = (
    "SORT_BY_UNSPECIFIED",
    "SORT_BY_UUID",
    "SORT_BY_TRIAL_ID",
    "SORT_BY_BATCH_NUMBER",
    "SORT_BY_END_TIME",
    "SORT_BY_STATE",
    "SORT_BY_SEARCHER_METRIC",
)
"""Determined's ``checkpointv1SortBy``."""
ORDERS = ("ORDER_BY_UNSPECIFIED", "ORDER_BY_ASC", "ORDER_BY_DESC")
STATE_ORDER = {
    "UNSPECIFIED": 0,
    "ACTIVE": 1,
    "COMPLETED": 2,
    "ERROR": 3,
    "DELETED": 4,
    "PARTIALLY_DELETED": 5,
}
"""Determined's ``checkpointv1State`` numbers: the order ``SORT_BY_STATE`` sorts in."""
UUID_CHUNK = 1000


@dataclass(frozen=True)
class CheckpointView:
    checkpoint: CheckpointModel
    trial: TrialModel
    experiment: ExperimentModel
    validation: dict[str, Any] | None
    """The validation report at the checkpoint's steps, as stored (flat, or Determined's ``avgMetrics``)."""
    searcher_metric: float | None


@dataclass(frozen=True)
class CheckpointQuery:
    """Determined's ``GetExperimentCheckpoints``/``GetTrialCheckpoints`` parameters, spelled as they come
    (``SORT_BY_END_TIME`` or ``end_time``; ``ORDER_BY_DESC`` or ``desc``; ``STATE_COMPLETED`` or
    ``COMPLETED``). `normalized` checks them."""

    sort_by_attr: str | None = None
    sort_by_metric: str | None = None
    order_by: str | None = None
    states: Collection[str] = field(default_factory=tuple)
    offset: int = 0
    limit: int = 0

    def normalized(self) -> CheckpointQuery:
        attr = _enum(self.sort_by_attr, "SORT_BY_", SORT_ATTRS, "sortByAttr")
        order = _enum(self.order_by, "ORDER_BY_", ORDERS, "orderBy")
        states = []
        for value in self.states:
            name = value.upper().removeprefix("STATE_")
            if name not in STATE_ORDER:
                known = ", ".join(f"STATE_{s}" for s in STATE_ORDER)
                raise ClientError(f"unknown checkpoint state {value!r} (known: {known})", field="states")
            states.append(name)
        metric = self.sort_by_metric or None
        return CheckpointQuery(attr, metric, order, tuple(states), self.offset, self.limit)


def _enum(value: str | None, prefix: str, allowed: Sequence[str], name: str) -> str:
    if not value:
        return allowed[0]
    spelled = value.upper()
    spelled = spelled if spelled.startswith(prefix) else prefix + spelled
    if spelled not in allowed:
        raise ClientError(f"unknown {name} {value!r} (known: {', '.join(allowed)})", field=name)
    return spelled


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _views(session: Session, where: ColumnElement[bool]) -> list[CheckpointView]:
    """The checkpoints `where` selects, in report order, each with its trial, experiment and validation."""
    stmt = (
        select(CheckpointModel, TrialModel, MetricModel.metrics)
        .join(TrialModel, TrialModel.id == CheckpointModel.trial_id)
        .outerjoin(
            MetricModel,
            and_(
                MetricModel.trial_id == CheckpointModel.trial_id,
                MetricModel.steps_completed == CheckpointModel.steps_completed,
                MetricModel.group == "validation",
            ),
        )
        .where(where)
        .order_by(CheckpointModel.report_time, CheckpointModel.uuid, MetricModel.trial_run_id, MetricModel.id)
    )
    rows: dict[str, tuple[CheckpointModel, TrialModel, dict[str, Any] | None]] = {}
    for ckpt, trial, metrics in session.execute(stmt).all():
        rows[ckpt.uuid] = (ckpt, trial, metrics)  # rows come by run: the latest run's validation wins
    experiment_ids = sorted({trial.experiment_id for _, trial, _ in rows.values()})
    experiments = {
        e.id: e
        for e in session.scalars(select(ExperimentModel).where(ExperimentModel.id.in_(experiment_ids)))
    }
    metric_names = {i: searcher_metric(shown_config(e))[0] for i, e in experiments.items()}
    out = []
    for ckpt, trial, metrics in rows.values():
        name = metric_names[trial.experiment_id]
        value = _finite(metric_value(metrics, name)) if metrics and name else None
        out.append(CheckpointView(ckpt, trial, experiments[trial.experiment_id], metrics, value))
    return out


def get_view(session: Session, uuid: str) -> CheckpointView:
    views = _views(session, CheckpointModel.uuid == uuid)
    if not views:
        raise NotFoundError(f"checkpoint {uuid} not found")
    return views[0]


def views_by_uuid(session: Session, uuids: Iterable[str]) -> dict[str, CheckpointView]:
    wanted = sorted(set(uuids))
    out: dict[str, CheckpointView] = {}
    for start in range(0, len(wanted), UUID_CHUNK):
        for view in _views(session, CheckpointModel.uuid.in_(wanted[start : start + UUID_CHUNK])):
            out[view.checkpoint.uuid] = view
    return out


@dataclass(frozen=True)
class CheckpointPage:
    views: list[CheckpointView]
    total: int
    """How many checkpoints matched, before offset and limit."""


def experiment_checkpoints(session: Session, experiment_id: int, query: CheckpointQuery) -> CheckpointPage:
    experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
    query = query.normalized()
    views = _views(session, TrialModel.experiment_id == experiment_id)
    return _page(views, query, experiment_config(experiment))


def trial_checkpoints(session: Session, trial_id: int, query: CheckpointQuery) -> CheckpointPage:
    trial = get_or_404(session, TrialModel, trial_id, "trial")
    experiment = get_or_404(session, ExperimentModel, trial.experiment_id, "experiment")
    query = query.normalized()
    views = _views(session, CheckpointModel.trial_id == trial_id)
    return _page(views, query, experiment_config(experiment))


def _page(views: list[CheckpointView], query: CheckpointQuery, config: ExperimentConfig) -> CheckpointPage:
    if query.states:
        views = [v for v in views if v.checkpoint.state in query.states]
    ordered = sort_views(views, query, config)
    page = ordered[query.offset :]
    return CheckpointPage(page[: query.limit] if query.limit > 0 else page, len(ordered))


def sort_views(
    views: Sequence[CheckpointView], query: CheckpointQuery, config: ExperimentConfig
) -> list[CheckpointView]:
    """Determined's order (`query` normalized; `config`: the experiment's, for its searcher metric):

    - ``sortByMetric`` (a validation metric's name), ``SORT_BY_SEARCHER_METRIC``, or no sort at all (this
      master's default, best first): by that metric, checkpoints without it last in either order; with no
      ``orderBy``, best first (``smaller_is_better`` for the searcher metric, ascending for another metric);
      ties by report time;
    - ``SORT_BY_UUID``, ``_TRIAL_ID``, ``_BATCH_NUMBER`` (steps), ``_END_TIME`` (report time), ``_STATE``:
      ascending unless ``ORDER_BY_DESC``.
    """
    by_time = sorted(views, key=lambda v: (v.checkpoint.report_time, v.checkpoint.uuid))
    descending = query.order_by == "ORDER_BY_DESC"
    if query.sort_by_metric or query.sort_by_attr in ("SORT_BY_UNSPECIFIED", "SORT_BY_SEARCHER_METRIC"):
        return _sort_by_metric(by_time, query, config, descending=descending)
    return sorted(by_time, key=_ATTR_KEYS[query.sort_by_attr or "SORT_BY_UUID"], reverse=descending)


_ATTR_KEYS: dict[str, Callable[[CheckpointView], tuple[Any, ...]]] = {
    "SORT_BY_UUID": lambda v: (v.checkpoint.uuid,),
    "SORT_BY_TRIAL_ID": lambda v: (v.checkpoint.trial_id, v.checkpoint.steps_completed),
    "SORT_BY_BATCH_NUMBER": lambda v: (v.checkpoint.steps_completed, v.checkpoint.trial_id),
    "SORT_BY_END_TIME": lambda v: (v.checkpoint.report_time,),
    "SORT_BY_STATE": lambda v: (STATE_ORDER.get(v.checkpoint.state, 0),),
}
"""The sort keys of ``sort_by_attr`` (ascending)."""


def _sort_by_metric(
    by_time: list[CheckpointView], query: CheckpointQuery, config: ExperimentConfig, *, descending: bool
) -> list[CheckpointView]:
    """`by_time` (sorted by report time) sorted by the metric `query` names (else the searcher's), stably;
    checkpoints without it last, by time."""
    name, descending = _metric_order(query, config, descending=descending)
    values = {
        v.checkpoint.uuid: _finite(metric_value(v.validation, name)) if v.validation and name else None
        for v in by_time
    }
    present = [v for v in by_time if values[v.checkpoint.uuid] is not None]
    absent = [v for v in by_time if values[v.checkpoint.uuid] is None]
    present.sort(key=lambda v: values[v.checkpoint.uuid] or 0.0, reverse=descending)  # stable: ties by time
    return present + absent


def _metric_order(
    query: CheckpointQuery, config: ExperimentConfig, *, descending: bool
) -> tuple[str | None, bool]:
    """The metric to sort by and whether descending: with no ``orderBy``, best first (``smaller_is_better``
    for the searcher metric, ascending for another metric)."""
    searcher_name, smaller_is_better = searcher_metric(config)
    name = query.sort_by_metric or searcher_name
    if query.sort_by_metric and query.sort_by_metric != searcher_name:
        smaller_is_better = True
    if query.order_by == "ORDER_BY_UNSPECIFIED":
        descending = not smaller_is_better
    return name, descending
