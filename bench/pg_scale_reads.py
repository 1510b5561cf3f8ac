"""PostgreSQL at scale: the master's main reads and the lifecycle loop's searcher pass, with their plans.

    .venv/bin/python bench/pg_scale_reads.py [--quick] [--trials N] [--rows R] [--rebuild] [--pg-url URL]

Builds (or reuses) a database ``hpcdet_scale_<trials>_<rows>`` next to the project's on the PostgreSQL
server (``--pg-url``, default ``$DET_TEST_PG_URL`` or the project's): the master's schema by its Alembic
migrations, then by COPY a few users, ~100 experiments totalling ``--trials`` trials (10,000) whose
trials, runs, checkpoints and searcher snapshots come from the real search methods run in the simulator
(``bench/_pg_scale_plan.py``), and ``--rows`` metric rows (50,000,000) as the harness reports them
(``bench/_pg_scale_rows.py``, ``bench/_pg_scale_build.py``). A database whose recorded scale matches is
reused (``--rebuild`` forces a new one). ``--quick``: 1,000 trials and 1,000,000 rows.

Then, with nothing else running against it:

1. the lifecycle loop's per-tick reads, in-process (the functions the loop calls; writes rolled back);
2. the SQL of every read, captured in-process (the master's app, through Starlette's TestClient) and run
   again under ``EXPLAIN (ANALYZE, BUFFERS)``: does any read scan a table that grows with trials or rows?
3. the reads over HTTP against a real ``det-master`` (loopback, one request in flight, keep-alive, logged in
   as ``admin``): p50, p99 and max.

Results are printed and appended to ``--out`` (default ``bench/results/pg_scale_reads.md``, none for ``--quick``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import psycopg  # noqa: E402
from _pg_scale_build import PASSWORD, ensure_database, pg_dsn  # noqa: E402
from _pg_scale_http import Master, Read, Timing, reads, time_read  # noqa: E402
from _pg_scale_report import Row, report  # noqa: E402
from _pg_scale_sql import Plan, capture_on, capturing, explain, loop_passes, time_pass  # noqa: E402

PROJECT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:25432/hpcdet"
POINT_BUDGET = 320_000
"""The web UI's budget of curve points (``pointsPerTrial`` in webui/js/pages/experiment.js)."""


def _one(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def pick_ids(dsn: str) -> dict[str, Any]:
    """The experiments and trials the reads ask for: the largest (active) search and a typical one; the
    trial with the most metric rows and a typical trial of the typical search."""
    with psycopg.connect(dsn) as c:
        query = "SELECT experiment_id, count(*) FROM trials GROUP BY experiment_id"
        sizes: dict[int, int] = dict(c.execute(query).fetchall())
        states: dict[int, str] = dict(c.execute("SELECT id, state FROM experiments").fetchall())
        big = max((e for e in sizes if states[e] == "ACTIVE"), key=lambda e: sizes[e])
        done = sorted((n, e) for e, n in sizes.items() if states[e] == "COMPLETED" and n > 1)
        typical = done[len(done) // 2][1]
        long_trial = c.execute("SELECT id FROM trials ORDER BY steps_completed DESC LIMIT 1").fetchone()
        steps = c.execute(
            "SELECT id FROM trials WHERE experiment_id = %s AND steps_completed > 0 ORDER BY steps_completed",
            (typical,),
        ).fetchall()
        assert long_trial is not None and steps
        trials = [long_trial[0], steps[len(steps) // 2][0]]
        rows = {t: _one(c, "SELECT count(*) FROM metrics WHERE trial_id = %s", t) for t in trials}
    return {
        "big": big,
        "typical": typical,
        "long_trial": trials[0],
        "trial": trials[1],
        "trials_of": sizes,
        "rows_of": rows,
        "points_of": {e: max(32, min(1000, POINT_BUDGET // sizes[e])) for e in (big, typical)},
    }


def fingerprint(dsn: str) -> list[Any]:
    """What the master must not have changed while it was measured (it has no Slurm to act on)."""
    with psycopg.connect(dsn) as c:
        return [
            c.execute(
                f"SELECT state, count(*), max(version) FROM {t} GROUP BY state ORDER BY state"
            ).fetchall()
            for t in ("experiments", "trials", "trial_runs")
        ] + [c.execute("SELECT count(*), max(id) FROM metrics").fetchone()]


def database_facts(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as c:
        size = c.execute("SELECT pg_database_size(current_database())").fetchone()
        tables = c.execute(
            "SELECT relname, n_live_tup, pg_total_relation_size(relid) FROM pg_stat_user_tables "
            "ORDER BY pg_total_relation_size(relid) DESC LIMIT 6"
        ).fetchall()
        server = c.execute("SHOW server_version").fetchone()
        settings = {k: _one(c, f"SHOW {k}") for k in ("shared_buffers", "work_mem", "jit")}
    return {
        "size": size[0] if size else 0,
        "tables": tables,
        "server": server[0] if server else "",
        **settings,
    }


def sql_of_reads(url: str, workdir: Path, rd: list[Read]) -> dict[str, tuple[int, list[Plan]]]:
    """Each read once through the master's app in-process: its statements, and their plans."""
    from fastapi.testclient import TestClient

    from hpc_master.api.app import create_app
    from hpc_master.db.engine import make_engine
    from hpc_master.masterconf import parse_master_config

    config = parse_master_config(
        {
            "db": {"url": url},
            "checkpoint_storage": {"host_path": str(workdir / "ckpt")},
            "job_storage_root": str(workdir / "jobs"),
        },
        env={},
    )
    engine = make_engine(url)
    cap = capture_on(engine)
    out: dict[str, tuple[int, list[Plan]]] = {}
    with TestClient(create_app(config, engine=engine)) as client:
        login = client.post("/api/v1/auth/login", json={"username": "admin", "password": PASSWORD})
        client.headers["Authorization"] = f"Bearer {login.json()['token']}"
        client.get(rd[0].path)  # the token cached, the pool warm
        for read in rd:
            with capturing(cap) as statements:
                assert client.get(read.path).status_code == 200
            out[read.name] = (len(statements), explain(pg_dsn(url), statements))
    engine.dispose()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pg-url", default=os.environ.get("DET_TEST_PG_URL") or PROJECT_PG_URL)
    parser.add_argument("--quick", action="store_true", help="1,000 trials and 1,000,000 metric rows")
    parser.add_argument("--trials", type=int, default=None, help="default 10,000")
    parser.add_argument("--rows", type=int, default=None, help="metric rows, default 50,000,000")
    parser.add_argument("--rebuild", action="store_true", help="build the database even if one matches")
    parser.add_argument("--drop", action="store_true", help="drop the database afterwards")
    parser.add_argument("--repeats", type=int, default=100, help="requests per read (fewer past --budget-s)")
    parser.add_argument("--budget-s", type=float, default=20.0, help="time per read before stopping early")
    parser.add_argument("--out", default=None, help="append the Markdown to this file")
    args = parser.parse_args()
    trials = args.trials or (1000 if args.quick else 10_000)
    rows = args.rows or (1_000_000 if args.quick else 50_000_000)
    out = (
        args.out
        if args.out is not None
        else (None if args.quick else str(ROOT / "bench/results/pg_scale_reads.md"))
    )
    name = f"hpcdet_scale_{trials}_{rows}"
    print(f"# database {name}: {trials:,} trials, {rows:,} metric rows", flush=True)
    built = ensure_database(args.pg_url, name, trials, rows, rebuild=args.rebuild)
    dsn = pg_dsn(built.url)
    print(f"  {'reused' if built.reused else 'built'}: {built.scale}", flush=True)
    ids = pick_ids(dsn)
    rd = reads(ids)
    before = fingerprint(dsn)
    workdir = Path(tempfile.mkdtemp(prefix="hpc-det-pg-scale-"))
    try:
        engine, passes = loop_passes(built.url, ids["big"])
        cap = capture_on(engine)
        loop_rows: list[Row] = []
        for p in passes:
            samples = time_pass(p, args.repeats, args.budget_s)
            with capturing(cap) as statements:
                p.run()
            plans = explain(dsn, statements)
            loop_rows.append(Row(p.name, Timing(samples, 0, 0), len(statements), plans))
            print(
                f"  {p.name}: p50 {statistics.median(samples):.1f} ms, {len(statements)} statements",
                flush=True,
            )
        engine.dispose()
        sql = sql_of_reads(built.url, workdir, rd)
        master = Master(built.url, workdir, "admin", PASSWORD)
        read_rows: list[Row] = []
        try:
            for read in rd:
                timing = time_read(master, read, repeats=args.repeats, budget_s=args.budget_s, at_least=10)
                count, plans = sql[read.name]
                read_rows.append(Row(read.name, timing, count, plans))
                print(
                    f"  {read.name}: p50 {timing.p50:.1f} ms, p99 {timing.p99:.1f} ms, {timing.items:,} items",
                    flush=True,
                )
        finally:
            master.stop()
        slurm_calls = master.slurm_calls()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    changed = fingerprint(dsn) != before
    facts = database_facts(dsn)
    text = report(
        date=datetime.date.today().isoformat(), trials=trials, rows=rows, quick=args.quick, built=built,
        facts=facts, ids=ids, loop=loop_rows, reads=read_rows, slurm_calls=slurm_calls, changed=changed,
        cpus=os.cpu_count() or 0, load=os.getloadavg(),
    )  # fmt: skip
    print()
    print(text)
    if out:
        with open(out, "a") as f:
            f.write("\n" + text)
    if args.drop:
        with psycopg.connect(pg_dsn(built.url.rsplit("/", 1)[0] + "/postgres"), autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 1 if changed else 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    code = main()
    print(f"({time.perf_counter() - t0:.0f} s)")
    sys.exit(code)
