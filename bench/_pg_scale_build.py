"""Build (or find already built) the scale database of ``bench/pg_scale_reads.py`` on a PostgreSQL server.

The schema is the master's own (``upgrade_to_head``: the Alembic migrations). Rows go in with COPY: the
small tables as they are; ``metrics`` with its constraints and indexes dropped first and put back after
(the same definitions, read from the catalog and checked afterwards), into the table truncated in the same
transaction (``COPY … FREEZE``: written all-visible, as a table that autovacuum has been through). Then
``VACUUM ANALYZE``, and one pass of the master's curve keeper, so that the saved learning curves exist as
on a master that has been running. The scale is recorded as the database's comment; a database whose
comment matches is reused as it is.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import yaml
from _pg_scale_plan import USERS, ExperimentPlan, plan_experiments
from _pg_scale_rows import (
    NOW,
    checkpoint_rows,
    completion_rows,
    event_rows,
    metric_chunks,
    run_count,
    run_rows,
    started,
    trial_rows,
)
from psycopg import sql
from psycopg.types.json import Json
from sqlalchemy.engine import make_url

from hpc_master import auth
from hpc_master.db.engine import make_engine, make_sessionmaker, transaction
from hpc_master.db.migrate import upgrade_to_head

FORMAT = 1
"""Bumped when what the build writes changes: a database of another format is rebuilt."""
PASSWORD = "bench-scale-pw"

COLUMNS = {
    "users": "id, username, password_hash, admin, active, unix_username, display_name, created_at",
    "experiments": "id, owner_id, name, description, state, config_text, config, searcher_snapshot, "
    "context_path, archived, progress, parent_id, resource_pool, version, start_time, end_time",
    "trials": "id, experiment_id, request_id, hparams, seed, state, restarts, run_id, latest_checkpoint, "
    "steps_completed, searcher_metric, best_validation, progress, searcher_op_length, searcher_done, "
    "early_exit_reason, pause_reason, exit_message, version, start_time, end_time",
    "trial_runs": "id, trial_id, run_number, slurm_job_id, node_list, state, exit_reason, exit_message, "
    "runner_state, preempt_requested, preempt_acked, version, submit_time, start_time, end_time, "
    "pending_reason, pending_since",
    "log_files": "id, trial_run_id, path, stream",
    "checkpoints": "uuid, trial_id, trial_run_id, steps_completed, state, resources, metadata, report_time, "
    "size_bytes, gc_attempts, gc_error, gc_retry_at",
    "searcher_op_completions": "id, trial_id, length, metric, consumed, created_at",
    "events": "id, entity, entity_id, old_state, new_state, reason, time",
}
JSON_COLUMNS = {"config", "searcher_snapshot", "hparams", "resources", "metadata"}


@dataclass
class Built:
    url: str
    scale: dict[str, Any]
    reused: bool
    migrate_s: float = 0.0
    """Reused: how long bringing its schema to the migrations' head took."""


def pg_dsn(sqlalchemy_url: str) -> str:
    """A libpq URL for psycopg from a SQLAlchemy one (``postgresql+psycopg://`` → ``postgresql://``)."""
    return make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(hide_password=False)


def database_url(server_url: str, name: str) -> str:
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def recorded_scale(server_url: str, name: str) -> dict[str, Any] | None:
    with psycopg.connect(pg_dsn(database_url(server_url, "postgres")), autocommit=True) as c:
        row = c.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s", (name,)
        ).fetchone()
    if row is None or not row[0]:
        return None
    try:
        return dict(json.loads(row[0]))
    except ValueError:
        return None


def nice_backend(conn: psycopg.Connection[Any]) -> None:
    """Lower the priority of the server process that serves `conn` (the machine is shared)."""
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()
    with contextlib.suppress(OSError):  # another account's process, or a remote server: left as it is
        os.setpriority(os.PRIO_PROCESS, int(pid[0]) if pid else 0, 10)


def ensure_database(server_url: str, name: str, trials: int, rows: int, *, rebuild: bool) -> Built:
    if make_url(server_url).database == name:
        raise ValueError(f"refusing to build into the server URL's own database {name!r}")
    url = database_url(server_url, name)
    wanted = {"format": FORMAT, "trials": trials, "rows": rows}
    scale = recorded_scale(server_url, name)
    if not rebuild and scale is not None and {k: scale.get(k) for k in wanted} == wanted:
        t = time.perf_counter()
        engine = make_engine(url)
        upgrade_to_head(engine)  # a migration added since the build (an index, say) applies to it here
        engine.dispose()
        return Built(url, scale, reused=True, migrate_s=time.perf_counter() - t)
    with psycopg.connect(pg_dsn(database_url(server_url, "postgres")), autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}"')
    scale = {**wanted, **build(url, trials, rows)}
    with psycopg.connect(pg_dsn(database_url(server_url, "postgres")), autocommit=True) as c:
        c.execute(f'COMMENT ON DATABASE "{name}" IS {sql.quote(json.dumps(scale))}')
    return Built(url, scale, reused=False)


def build(url: str, trials: int, rows: int) -> dict[str, Any]:
    """Schema, rows, indexes, statistics and saved curves; returns what the build took."""
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    engine = make_engine(url)
    upgrade_to_head(engine)
    engine.dispose()
    plans = plan_experiments(trials, rows)
    times["plan_s"] = time.perf_counter() - t0
    with psycopg.connect(pg_dsn(url)) as conn:
        nice_backend(conn)
        conn.execute("SET maintenance_work_mem = '1GB'")
        conn.execute("SET max_parallel_maintenance_workers = 0")  # one (reniced) process builds the indexes
        conn.execute("SET synchronous_commit = off")
        t = time.perf_counter()
        _copy_small_tables(conn, plans)
        conn.commit()
        times["small_tables_s"] = time.perf_counter() - t
        t = time.perf_counter()
        definitions = _drop_metric_constraints(conn)
        conn.execute("TRUNCATE metrics")
        written = _copy_metrics(conn, plans)
        conn.commit()
        times["metrics_copy_s"] = time.perf_counter() - t
        t = time.perf_counter()
        _restore_metric_constraints(conn, definitions)
        times["metrics_indexes_s"] = time.perf_counter() - t
        conn.autocommit = True
        t = time.perf_counter()
        conn.execute("VACUUM (ANALYZE)")
        times["vacuum_analyze_s"] = time.perf_counter() - t
    t = time.perf_counter()
    times["curves_saved"] = keeper_pass(url)
    times["curve_keeper_s"] = time.perf_counter() - t
    times["build_s"] = time.perf_counter() - t0
    return {"metric_rows": written, "built_at": time.strftime("%Y-%m-%d %H:%M"), **times}


def _copy(conn: psycopg.Connection[Any], table: str, rows: Iterable[tuple[Any, ...]]) -> int:
    names = [c.strip() for c in COLUMNS[table].split(",")]
    json_at = [i for i, n in enumerate(names) if n in JSON_COLUMNS]
    n = 0
    with conn.cursor() as cur, cur.copy(f"COPY {table} ({COLUMNS[table]}) FROM STDIN") as copy:
        for row in rows:
            values = list(row)
            for i in json_at:
                values[i] = None if values[i] is None else Json(values[i])
            copy.write_row(values)
            n += 1
    return n


def _users() -> Iterator[tuple[Any, ...]]:
    hashed = auth.hash_password(PASSWORD)
    for i, name in enumerate(USERS, start=1):
        yield (i, name, hashed, name == "admin", True, None, None, NOW - dt.timedelta(days=365))


def _experiments(plans: list[ExperimentPlan]) -> Iterator[tuple[Any, ...]]:
    users = {name: i for i, name in enumerate(USERS, start=1)}
    for p in plans:
        start = started(p)
        ends = [r[-1] for r in trial_rows(p) if r[-1] is not None]
        ended = None if p.state in ("ACTIVE", "PAUSED") else max(ends, default=start + dt.timedelta(hours=1))
        yield (
            p.id, users[p.owner], p.name, "", p.state, yaml.safe_dump(p.config, sort_keys=False), p.config,
            p.snapshot, f"/shared/hpc-det/contexts/{p.id}", False, p.progress, None, "default",
            len(p.trials) + 1, start, ended,
        )  # fmt: skip


def _copy_small_tables(conn: psycopg.Connection[Any], plans: list[ExperimentPlan]) -> None:
    _copy(conn, "users", _users())
    _copy(conn, "experiments", _experiments(plans))
    _copy(conn, "trials", (r for p in plans for r in trial_rows(p)))
    firsts, n = [], 1
    for p in plans:
        firsts.append(n)
        n += run_count(p)
    runs = [r for p, first in zip(plans, firsts, strict=True) for r in run_rows(p, first)]
    _copy(conn, "trial_runs", runs)
    _copy(
        conn,
        "log_files",
        ((r[0], r[0], f"/shared/hpc-det/jobs/run-{r[0]}/output.log", "stdout") for r in runs),
    )
    _copy(conn, "checkpoints", (r for p in plans for r in checkpoint_rows(p)))
    completions: list[tuple[Any, ...]] = []
    for p in plans:
        completions += completion_rows(p, len(completions) + 1)
    _copy(conn, "searcher_op_completions", completions)
    events = [e for p, first in zip(plans, firsts, strict=True) for e in event_rows(p, first)]
    at = NOW
    _copy(conn, "events", ((i, *e, at) for i, e in enumerate(events, start=1)))
    for table in COLUMNS:
        if table != "checkpoints":
            conn.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"
            )


def _copy_metrics(conn: psycopg.Connection[Any], plans: list[ExperimentPlan]) -> int:
    written = 0
    columns = 'id, trial_id, trial_run_id, "group", steps_completed, metrics, report_time'
    with conn.cursor() as cur, cur.copy(f"COPY metrics ({columns}) FROM STDIN (FREEZE)") as copy:
        for p in plans:
            for chunk, n in metric_chunks(p, written + 1):
                copy.write(chunk)
                written += n
    conn.execute("SELECT setval(pg_get_serial_sequence('metrics', 'id'), %s)", (max(written, 1),))
    return written


_CATALOG = """
SELECT 'constraint', conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'metrics'::regclass
UNION ALL
SELECT 'index', indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index
WHERE indrelid = 'metrics'::regclass
  AND indexrelid NOT IN (SELECT conindid FROM pg_constraint WHERE conrelid = 'metrics'::regclass)
ORDER BY 1, 2
"""


def _drop_metric_constraints(conn: psycopg.Connection[Any]) -> list[tuple[str, str, str]]:
    found = [(str(a), str(b), str(c)) for a, b, c in conn.execute(_CATALOG).fetchall()]
    for kind, name, _ in found:
        if kind == "constraint":
            conn.execute(f'ALTER TABLE metrics DROP CONSTRAINT "{name}"')
        else:
            conn.execute(f'DROP INDEX "{name}"')
    return found


def _restore_metric_constraints(conn: psycopg.Connection[Any], found: list[tuple[str, str, str]]) -> None:
    # Primary key first (the foreign key and unique constraint need no order among themselves).
    for kind, name, definition in sorted(found, key=lambda f: not f[2].startswith("PRIMARY KEY")):
        if kind == "constraint":
            conn.execute(f'ALTER TABLE metrics ADD CONSTRAINT "{name}" {definition}')
        else:
            conn.execute(definition)
        conn.commit()
    again = [(str(a), str(b), str(c)) for a, b, c in conn.execute(_CATALOG).fetchall()]
    conn.commit()
    if sorted(again) != sorted(found):
        raise RuntimeError(f"metrics' constraints differ after the load: {found} → {again}")


def keeper_pass(url: str) -> int:
    """One pass of det-master's curve keeper over every row (as after an upgrade); returns the curves saved."""
    from sqlalchemy import func, select

    from hpc_master.db.models import MetricCurveModel
    from hpc_master.services.curves.experiment import CurveCache
    from hpc_master.services.curves.keeper import CurveKeeper

    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    CurveKeeper(CurveCache(), lambda: transaction(sessions)).run_once()
    with transaction(sessions) as s:
        saved = int(s.scalar(select(func.count()).select_from(MetricCurveModel)) or 0)
    engine.dispose()
    return saved
