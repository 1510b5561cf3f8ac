"""Metric reports: idempotent batch ingest (the hot path) and queries."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_json
from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from hpc_master.db.models import MetricModel, TrialModel, utcnow


@dataclass(frozen=True)
class MetricReport:
    trial_run_id: int
    steps_completed: int
    group: str
    metrics: dict[str, Any]
    report_time: dt.datetime | None = None


def _insert_ignore(session: Session) -> Any:
    dialect = session.get_bind().dialect.name
    table: Any = MetricModel.__table__
    if dialect == "postgresql":
        return pg_insert(table).on_conflict_do_nothing(constraint="uq_metrics_report")
    if dialect == "sqlite":
        return sqlite_insert(table).on_conflict_do_nothing()
    raise NotImplementedError(f"metrics ingest does not support {dialect}")


def ingest_metrics(session: Session, trial_id: int, reports: list[MetricReport]) -> tuple[int, int]:
    """Insert a batch in the caller's transaction; duplicates of (trial, run, group, steps) are skipped.

    Returns (accepted, ignored): ignored are duplicates, and reports of an older run of the trial (a job
    that was replaced after a failure may still flush metrics the new run has rolled back and redone).
    One multi-row statement plus one trial read and update per batch.
    """
    if not reports:
        return 0, 0
    if session.get_bind().dialect.name == "sqlite":
        return _sqlite_ingest(session, trial_id, reports)
    current_run = session.scalar(select(TrialModel.run_id).where(TrialModel.id == trial_id)) or 0
    fresh = [r for r in reports if r.trial_run_id >= current_run]
    if len(fresh) != len(reports):
        accepted, _ = ingest_metrics(session, trial_id, fresh) if fresh else (0, 0)
        return accepted, len(reports) - accepted
    now = utcnow()
    rows = [
        {
            "trial_id": trial_id,
            "trial_run_id": r.trial_run_id,
            "group": r.group,
            "steps_completed": r.steps_completed,
            "metrics": r.metrics,
            "report_time": r.report_time or now,
        }
        for r in reports
    ]
    # RETURNING yields only the rows actually inserted (conflicts return nothing) on SQLite and PostgreSQL
    # alike; SQLAlchemy batches the rows into multi-row INSERTs ("insertmanyvalues").
    stmt = _insert_ignore(session).returning(MetricModel.__table__.c.id)
    accepted = len(session.connection().execute(stmt, rows).all())
    _bump_steps(session, trial_id, reports)
    return accepted, len(rows) - accepted


_SQLITE_INSERT_ROWS = 256
"""Rows per multi-row INSERT: one statement step (one GIL release) per chunk instead of one per row, as an
``executemany`` does; 256 × 6 parameters stay far below SQLite's limit of 32,766."""


@functools.lru_cache(maxsize=16)
def _sqlite_insert(rows: int) -> str:
    values = ", ".join(["(?, ?, ?, ?, ?, ?)"] * rows)
    return (
        'INSERT INTO metrics (trial_id, trial_run_id, "group", steps_completed, metrics, report_time) '
        f"VALUES {values} ON CONFLICT DO NOTHING"
    )


def _sqlite_insert_chunks(rows: list[tuple[Any, ...]]) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """(statement, flat parameters) covering ``rows``: chunks of 256, the rest in powers of two, so a
    handful of statement texts serve every batch size (sqlite3 caches prepared statements by text)."""
    i = 0
    while i < len(rows):
        n = min(_SQLITE_INSERT_ROWS, 1 << ((len(rows) - i).bit_length() - 1))
        yield _sqlite_insert(n), tuple(v for row in rows[i : i + n] for v in row)
        i += n


_SQLITE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S.%f"  # how SQLAlchemy's DateTime stores values in SQLite


def sqlite_time(value: dt.datetime) -> str:
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value.strftime(_SQLITE_TIME_FORMAT)


def _json_text(value: Any) -> str:
    return to_json(value).decode()


def _sqlite_ingest(session: Session, trial_id: int, reports: list[MetricReport]) -> tuple[int, int]:
    """The hot path on SQLite, in driver SQL (the ORM's per-statement cost is as large as the insert's):
    read the trial's current run, insert the fresh rows, raise ``steps_completed``."""
    conn = session.connection()
    current_run = conn.exec_driver_sql(_SQLITE_RUN, (trial_id,)).scalar() or 0
    fresh = [r for r in reports if r.trial_run_id >= current_run]
    if not fresh:
        return 0, len(reports)
    accepted = _sqlite_insert_ignore(session, trial_id, fresh)
    max_steps = max(r.steps_completed for r in fresh)
    conn.exec_driver_sql(_SQLITE_STEPS, (max_steps, trial_id, max_steps))
    return accepted, len(reports) - accepted


_SQLITE_RUN = "SELECT run_id FROM trials WHERE id = ?"
_SQLITE_STEPS = "UPDATE trials SET steps_completed = ? WHERE id = ? AND steps_completed < ?"


def sqlite_rows(trial_id: int, reports: list[MetricReport]) -> list[tuple[Any, ...]]:
    """The rows of ``_sqlite_insert`` for a batch (encoded by the request, not the writer)."""
    now = sqlite_time(utcnow())
    dumps = _json_text
    return [
        (
            trial_id,
            r.trial_run_id,
            r.group,
            r.steps_completed,
            dumps(r.metrics),
            sqlite_time(r.report_time) if r.report_time else now,
        )
        for r in reports
    ]


def sqlite_ingest_raw(dbapi: Any, trial_id: int, rows: list[tuple[Any, ...]]) -> tuple[int, int]:
    """`ingest_metrics` for SQLite on a DBAPI connection inside the caller's transaction (the metrics
    writer's raw group): the same run filter, insert and ``steps_completed`` update, in driver SQL."""
    found = dbapi.execute(_SQLITE_RUN, (trial_id,)).fetchone()
    if found is None:
        raise LookupError(f"trial {trial_id} not found")  # the ordinary path gives the API's answer
    current_run = found[0] or 0
    fresh = [r for r in rows if r[1] >= current_run]
    if not fresh:
        return 0, len(rows)
    # rowcount of one INSERT … ON CONFLICT DO NOTHING counts only the rows it inserted.
    accepted = sum(int(dbapi.execute(sql, params).rowcount) for sql, params in _sqlite_insert_chunks(fresh))
    max_steps = max(r[3] for r in fresh)
    dbapi.execute(_SQLITE_STEPS, (max_steps, trial_id, max_steps))
    return accepted, len(rows) - accepted


_PG_RUN = "SELECT run_id FROM trials WHERE id = %s"
_PG_STEPS = "UPDATE trials SET steps_completed = %s WHERE id = %s AND steps_completed < %s"
_PG_INSERT = (
    'INSERT INTO metrics (trial_id, trial_run_id, "group", steps_completed, metrics, report_time) '
    "SELECT t, r, g, s, m::json, w::timestamp AT TIME ZONE 'UTC' "
    "FROM unnest(%b::integer[], %b::integer[], %b::text[], %b::bigint[], %b::text[], %b::text[]) "
    "AS u(t, r, g, s, m, w) "
    "ON CONFLICT ON CONSTRAINT uq_metrics_report DO NOTHING"
)
"""A whole batch in one statement of six array parameters: one plan (psycopg prepares it after a few uses),
whatever the batch size. The arrays go in binary (``%b``): in text, psycopg escapes each element in Python
with a regular expression, which cost more than all the rest of the ingest (9.7 vs 3.9 µs a row, parsing
the body included). The metrics and times go as text, cast by the server; times are the rows' UTC wall
times, as ``sqlite_rows`` writes them. (A multi-row VALUES statement is slower still: psycopg parses a
statement over 4 KB again at each call.)"""


def pg_ingest_raw(dbapi: Any, trial_id: int, rows: list[tuple[Any, ...]]) -> tuple[int, int]:
    """``sqlite_ingest_raw`` for PostgreSQL on a psycopg connection inside the caller's transaction (the
    metrics writer's raw group): the same run filter, insert and ``steps_completed`` update."""
    found = dbapi.execute(_PG_RUN, (trial_id,)).fetchone()
    if found is None:
        raise LookupError(f"trial {trial_id} not found")  # the ordinary path gives the API's answer
    current_run = found[0] or 0
    fresh = [r for r in rows if r[1] >= current_run]
    if not fresh:
        return 0, len(rows)
    columns = [list(c) for c in zip(*fresh, strict=True)]
    accepted = int(dbapi.execute(_PG_INSERT, columns).rowcount)
    max_steps = max(columns[3])
    dbapi.execute(_PG_STEPS, (max_steps, trial_id, max_steps))
    return accepted, len(rows) - accepted


def _sqlite_insert_ignore(session: Session, trial_id: int, reports: list[MetricReport]) -> int:
    """Multi-row INSERTs in driver SQL; returns how many rows were new."""
    conn = session.connection()
    chunks = _sqlite_insert_chunks(sqlite_rows(trial_id, reports))
    return sum(int(conn.exec_driver_sql(sql, params).rowcount) for sql, params in chunks)


def _bump_steps(session: Session, trial_id: int, reports: list[MetricReport]) -> None:
    max_steps = max(r.steps_completed for r in reports)
    session.execute(
        update(TrialModel)
        .where(TrialModel.id == trial_id, TrialModel.steps_completed < max_steps)
        .values(steps_completed=max_steps)
        .execution_options(synchronize_session=False)
    )


def query_metrics(
    session: Session,
    trial_id: int,
    group: str | None = None,
    *,
    offset: int = 0,
    limit: int = 0,
) -> list[MetricModel]:
    stmt = select(MetricModel).where(MetricModel.trial_id == trial_id)
    if group:
        stmt = stmt.where(MetricModel.group == group)
    stmt = stmt.order_by(MetricModel.steps_completed, MetricModel.trial_run_id, MetricModel.group).offset(
        offset
    )
    if limit > 0:
        stmt = stmt.limit(limit)
    return list(session.scalars(stmt))


def metrics_page(
    session: Session, trial_id: int, group: str, *, after: tuple[int, int] | None, limit: int
) -> list[MetricModel]:
    """A trial's reports of one group by steps, at most `limit` after the (steps, id) key `after` (keyset
    paging: a stream of pages sees each report once even while reports are added)."""
    stmt = select(MetricModel).where(MetricModel.trial_id == trial_id, MetricModel.group == group)
    if after is not None:
        steps, row_id = after
        stmt = stmt.where(
            MetricModel.steps_completed >= steps,  # implied by the next; the index can start the page here
            or_(
                MetricModel.steps_completed > steps,
                and_(MetricModel.steps_completed == steps, MetricModel.id > row_id),
            ),
        )
    stmt = stmt.order_by(MetricModel.steps_completed, MetricModel.id).limit(limit)
    return list(session.scalars(stmt))


def count_metrics(session: Session, trial_id: int | None = None) -> int:
    stmt = select(func.count()).select_from(MetricModel)
    if trial_id is not None:
        stmt = stmt.where(MetricModel.trial_id == trial_id)
    return int(session.scalar(stmt) or 0)


def metric_value(metrics: dict[str, Any], name: str) -> float | None:
    avg = metrics.get("avgMetrics", metrics)
    value = avg.get(name) if isinstance(avg, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
