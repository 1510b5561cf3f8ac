"""The SQL behind each read of ``bench/pg_scale_reads.py``, its plans, and the lifecycle loop's passes.

Statements are captured in-process (a ``before_cursor_execute``/``after_cursor_execute`` listener on the
engine the master's app is built with, the same app ``det-master`` serves, called through Starlette's
TestClient), each distinct SELECT is run again under ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` with the
parameters it was given, and its plan is reduced to what matters: which scans touch which tables, by index
or sequentially. The lifecycle loop's per-tick reads are timed by calling the functions the loop calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from _pg_scale_build import pg_dsn
from sqlalchemy import Engine, event, select

from hpc_master.db.engine import make_engine, make_sessionmaker, transaction

BIG_TABLES = (
    "metrics", "trials", "trial_runs", "checkpoints", "events", "searcher_op_completions", "metric_curves",
    "log_files", "sessions",
)  # fmt: skip
"""Tables that grow with trials or rows: a sequential scan of one of these is a finding."""


@dataclass
class Statement:
    sql: str
    params: Any
    ms: float


@dataclass
class Capture:
    statements: list[Statement] = field(default_factory=list)
    on: bool = False


def capture_on(engine: Engine) -> Capture:
    cap = Capture()

    def before(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        conn.info["bench_t0"] = time.perf_counter()

    def after(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        if cap.on and not many:
            ms = (time.perf_counter() - conn.info.pop("bench_t0", time.perf_counter())) * 1000
            cap.statements.append(Statement(statement, params, ms))

    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "after_cursor_execute", after)
    return cap


@contextmanager
def capturing(cap: Capture) -> Iterator[list[Statement]]:
    cap.statements = []
    cap.on = True
    try:
        yield cap.statements
    finally:
        cap.on = False


@dataclass
class Scan:
    node: str
    table: str
    index: str | None
    rows: int
    """Rows the node produced plus those its filter removed, over all its loops."""

    def __str__(self) -> str:
        where = f" using {self.index}" if self.index else ""
        return f"{self.node} on {self.table}{where} ({self.rows:,} rows)"


@dataclass
class Plan:
    sql: str
    ms: float
    scans: list[Scan]
    hit: int
    read: int
    text: str


def _walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _walk(child)


def _scan(node: dict[str, Any]) -> Scan:
    examined = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
    return Scan(
        node["Node Type"],
        node["Relation Name"],
        node.get("Index Name"),
        int(examined * node.get("Actual Loops", 1)),
    )


def explain(dsn: str, statements: list[Statement]) -> list[Plan]:
    """EXPLAIN ANALYZE each distinct SELECT once (with the parameters of its slowest execution)."""
    slowest: dict[str, Statement] = {}
    for s in statements:
        if s.sql.lstrip().upper().startswith(("SELECT", "WITH")) and (
            s.sql not in slowest or s.ms > slowest[s.sql].ms
        ):
            slowest[s.sql] = s
    plans = []
    with psycopg.connect(dsn) as conn:
        for s in slowest.values():
            row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {s.sql}", s.params).fetchone()
            assert row is not None
            top = row[0][0]
            text = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {s.sql}", s.params).fetchall()
            scans = [_scan(n) for n in _walk(top["Plan"]) if "Relation Name" in n]
            plans.append(
                Plan(
                    s.sql, float(top["Execution Time"]), scans, int(top["Plan"].get("Shared Hit Blocks", 0)),
                    int(top["Plan"].get("Shared Read Blocks", 0)), "\n".join(r[0] for r in text),
                )
            )  # fmt: skip
            conn.rollback()
    return plans


def seq_scans(plans: list[Plan]) -> list[Scan]:
    return [s for p in plans for s in p.scans if s.node == "Seq Scan" and s.table in BIG_TABLES]


# ---------------------------------------------------------------- the lifecycle loop's passes


@dataclass
class Pass:
    name: str
    run: Callable[[], Any]


def loop_passes(url: str, big: int) -> tuple[Engine, list[Pass]]:
    """What the lifecycle loop reads each tick, called as it calls it (writes rolled back)."""
    from hpc_master.db.models import ExperimentModel, SearcherOpCompletionModel, TrialModel, TrialRunModel
    from hpc_master.lifecycle import searchers
    from hpc_master.lifecycle.configs import LEAN_EXPERIMENT
    from hpc_master.lifecycle.loop import LifecycleLoop
    from hpc_master.lifecycle.priorities import KnobCache, within_max_slots
    from hpc_master.lifecycle.waiting import list_waiting, pending_reasons
    from hpc_master.services import lifecycle as svc

    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    loop = LifecycleLoop(sessions, None)
    cache = searchers.new_search_inputs_cache()
    knobs = KnobCache()

    def rolled_back(fn: Callable[[Any], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with sessions() as s:
                try:
                    out = fn(s)
                    s.flush()
                    return out
                finally:
                    s.rollback()

        return run

    def drive_big(s: Any) -> int:
        exp = s.get(ExperimentModel, big, options=LEAN_EXPERIMENT)
        return searchers.drive(s, exp, cache)

    def drive_big_with_event(s: Any) -> int:
        """A running trial of the largest search reported the validation its searcher asked for."""
        trial = s.scalars(
            select(TrialModel)
            .join(TrialRunModel, TrialRunModel.trial_id == TrialModel.id)
            .where(TrialModel.experiment_id == big, TrialRunModel.state == "RUNNING")
            .order_by(TrialModel.id)
            .limit(1)
        ).first()
        if trial is None or trial.searcher_op_length is None:
            return 0
        s.add(SearcherOpCompletionModel(trial_id=trial.id, length=trial.searcher_op_length, metric=0.5))
        s.flush()
        return drive_big(s)

    def job_driver_reads(s: Any) -> int:
        live = svc.list_live_runs(s)
        pending_reasons(s)
        waiting = list_waiting(s)
        todo = within_max_slots(s, knobs, [(t.id, t.experiment_id) for t in svc.list_trials_to_submit(s)])
        return len(live) + len(waiting) + len(todo)

    with transaction(sessions) as s:
        actives = len(list(s.scalars(select(ExperimentModel.id).where(ExperimentModel.state == "ACTIVE"))))
    return engine, [
        Pass(
            f"searcher pass, all {actives} active experiments (LifecycleLoop.drive_searchers)",
            loop.drive_searchers,
        ),
        Pass("searcher pass, largest experiment, no new event (searchers.drive)", rolled_back(drive_big)),
        Pass(
            "searcher pass, largest experiment, one validation to act on (rolled back)",
            rolled_back(drive_big_with_event),
        ),
        Pass(
            "stranded-trial check (repair_stranded_trials, rolled back)",
            rolled_back(svc.repair_stranded_trials),
        ),
        Pass(
            "job driver's reads (live runs, pending reasons, waiting, to submit)",
            rolled_back(job_driver_reads),
        ),
    ]


def time_pass(p: Pass, repeats: int, budget_s: float) -> list[float]:
    p.run()  # warm: the search inputs cache, the connection pool
    samples: list[float] = []
    spent = time.monotonic()
    while len(samples) < repeats and (len(samples) < 10 or time.monotonic() - spent < budget_s):
        t = time.perf_counter()
        p.run()
        samples.append((time.perf_counter() - t) * 1000)
    return samples


__all__ = ["capture_on", "capturing", "explain", "loop_passes", "pg_dsn", "seq_scans", "time_pass"]
