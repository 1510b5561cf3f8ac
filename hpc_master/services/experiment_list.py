"""Determined's experiment list (``GET /api/v1/experiments``): its filters and sort keys, as SQL.

Every filter Determined's ``GetExperiments`` takes is applied or refused by name; none is accepted and ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Select, exists, func, literal_column, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from hpc_master.db.models import ExperimentModel, TrialModel, UserModel
from hpc_master.errors import ClientError
from hpc_master.services.experiments import normalise_states

_TRIALS = (
    select(func.count(TrialModel.id))
    .where(TrialModel.experiment_id == ExperimentModel.id)
    .correlate(ExperimentModel)
    .scalar_subquery()
)
SORT_KEYS: dict[str, Any] = {
    "SORT_BY_UNSPECIFIED": ExperimentModel.id,
    "SORT_BY_ID": ExperimentModel.id,
    "SORT_BY_DESCRIPTION": ExperimentModel.description,
    "SORT_BY_START_TIME": ExperimentModel.start_time,
    "SORT_BY_END_TIME": ExperimentModel.end_time,
    "SORT_BY_STATE": ExperimentModel.state,
    "SORT_BY_NUM_TRIALS": _TRIALS,
    "SORT_BY_PROGRESS": ExperimentModel.progress,
    "SORT_BY_USER": UserModel.username,
    "SORT_BY_NAME": ExperimentModel.name,
    "SORT_BY_FORKED_FROM": ExperimentModel.parent_id,
    "SORT_BY_RESOURCE_POOL": ExperimentModel.resource_pool,
    "SORT_BY_PROJECT_ID": ExperimentModel.id,  # one project: its experiments in id order
}
"""Determined's ``sortBy`` values this master sorts by; the checkpoint and searcher-metric sorts are refused."""


def _sort_key(sort_by: str | None) -> Any:
    key = (sort_by or "SORT_BY_UNSPECIFIED").upper()
    if not key.startswith("SORT_BY_"):
        key = f"SORT_BY_{key}"
    if key not in SORT_KEYS:
        raise ClientError(
            f"sortBy {sort_by!r} is not supported; this master sorts by "
            + ", ".join(k for k in SORT_KEYS if k != "SORT_BY_UNSPECIFIED"),
            code="not_supported",
            field="sortBy",
        )
    return SORT_KEYS[key]


def _has_label(session: Session, label: str) -> ColumnElement[bool]:
    """The experiment's config lists `label` under ``labels`` (a JSON list, on SQLite and PostgreSQL)."""
    labels = ExperimentModel.config["labels"]
    if session.get_bind().dialect.name == "postgresql":
        return labels.cast(JSONB).op("?")(label)
    each = func.json_each(ExperimentModel.config, "$.labels").table_valued("value")
    return exists(select(literal_column("1")).select_from(each).where(each.c.value == label))


def _contains(text: str) -> str:
    """A case-insensitive LIKE pattern for `text` anywhere (its own % and _ taken literally)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def list_experiments(
    session: Session,
    *,
    archived: bool | None = None,
    users: Sequence[str] = (),
    user_ids: Sequence[int] = (),
    states: Sequence[str] = (),
    name: str | None = None,
    description: str | None = None,
    labels: Sequence[str] = (),
    sort_by: str | None = None,
    order_desc: bool = False,
    offset: int = 0,
    limit: int = 100,
) -> tuple[list[tuple[ExperimentModel, str]], int]:
    """A page of experiments (each with its owner's name) and how many match: `name` and `description` match
    anywhere, case aside (Determined's); `labels`: experiments that carry every one of them."""
    stmt = select(ExperimentModel, UserModel.username).join(
        UserModel, UserModel.id == ExperimentModel.owner_id
    )
    if archived is not None:
        stmt = stmt.where(ExperimentModel.archived.is_(archived))
    if users:
        stmt = stmt.where(UserModel.username.in_(list(users)))
    if user_ids:
        stmt = stmt.where(ExperimentModel.owner_id.in_(list(user_ids)))
    if states:
        stmt = stmt.where(ExperimentModel.state.in_(normalise_states(states)))
    if name:
        stmt = stmt.where(ExperimentModel.name.ilike(_contains(name), escape="\\"))
    if description:
        stmt = stmt.where(ExperimentModel.description.ilike(_contains(description), escape="\\"))
    for label in labels:
        stmt = stmt.where(_has_label(session, label))
    key = _sort_key(sort_by)
    total = session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    stmt = _page(stmt, key, order_desc=order_desc, offset=offset, limit=limit)
    rows = [(exp, username) for exp, username in session.execute(stmt).all()]
    return rows, total


def _page(
    stmt: Select[ExperimentModel, str], key: Any, *, order_desc: bool, offset: int, limit: int
) -> Select[ExperimentModel, str]:
    """`stmt` sorted by `key` (missing values last, ties by id) and cut to a page (`limit` ≤ 0: the rest)."""
    if order_desc:
        stmt = stmt.order_by(key.desc().nulls_last(), ExperimentModel.id.desc())
    else:
        stmt = stmt.order_by(key.asc().nulls_last(), ExperimentModel.id)
    stmt = stmt.offset(max(offset, 0))
    if limit > 0:
        stmt = stmt.limit(limit)
    return stmt
