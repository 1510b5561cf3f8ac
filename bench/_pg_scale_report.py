"""The Markdown report of ``bench/pg_scale_reads.py``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from _pg_scale_http import Timing
from _pg_scale_sql import BIG_TABLES, Plan, Scan, seq_scans

SLOW_MS = 200.0
SEQ_ROWS = 5_000
"""A sequential scan of at least this many rows of a table that grows gets its plan shown."""
_PARAMS = re.compile(r"(%\((\w+?)_\d+\)s(::\w+)?)(, %\(\2_\d+\)s(::\w+)?)+")
_ARRAY = re.compile(r"'\{([^,}']+,[^,}']+,[^,}']+),[^}']*\}'")


def short(text: str) -> str:
    """Long IN lists cut short: their first parameter or values, then an ellipsis."""
    return _ARRAY.sub(lambda m: "'{" + m.group(1) + ",…}'", _PARAMS.sub(lambda m: m.group(1) + ", …", text))


@dataclass
class Row:
    name: str
    timing: Timing
    statements: int
    plans: list[Plan]

    def key_scan(self) -> Scan | None:
        """The scan that reads the most rows of a table that grows, in the slowest statement."""
        if not self.plans:
            return None
        slowest = max(self.plans, key=lambda p: p.ms)
        scans = [s for s in slowest.scans if s.table in BIG_TABLES] or slowest.scans
        return max(scans, key=lambda s: (s.node == "Seq Scan", s.rows), default=None)

    def index_cell(self) -> str:
        seq = seq_scans(self.plans)
        if not self.plans:
            return "–"
        if not seq:
            return "yes"
        rows: dict[str, int] = {}
        for s in seq:
            rows[s.table] = max(rows.get(s.table, 0), s.rows)
        return "**no**: " + ", ".join(f"Seq Scan on {t} ({n:,} rows)" for t, n in sorted(rows.items()))

    def sql_ms(self) -> float:
        return max((p.ms for p in self.plans), default=0.0)


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def _ms(x: float) -> str:
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def _flag(x: float) -> str:
    return f"**{_ms(x)}**" if x > SLOW_MS else _ms(x)


def report(**k: Any) -> str:
    built, facts, ids = k["built"], k["facts"], k["ids"]
    scale = built.scale
    lines = [
        f"## {k['date']}: {k['trials']:,} trials, {scale.get('metric_rows', k['rows']):,} metric rows"
        + (" (--quick)" if k["quick"] else ""),
        "",
        f"Machine: {k['cpus']} CPUs shared with other work (load average {k['load'][0]:.1f} / {k['load'][1]:.1f} / "
        f"{k['load'][2]:.1f} at the end), PostgreSQL {facts['server']} with its default settings (shared_buffers "
        f"{facts['shared_buffers']}, work_mem {facts['work_mem']}, jit {facts['jit']}); the database files fit "
        "in the OS page cache, so these are warm-cache figures.",
        "",
        f"Database: {_gb(facts['size'])} ("
        + ", ".join(f"{t} {_gb(b)} ({n:,} rows)" for t, n, b in facts["tables"][:4])
        + "). "
        + (
            f"Reused as built on {scale.get('built_at')} (its schema brought to the migrations' head in "
            f"{built.migrate_s:,.1f} s)."
            if built.reused
            else "Built by this run."
        )
        + f" Build: {scale.get('build_s', 0):,.0f} s in all: migrations and the plan {scale.get('plan_s', 0):.0f} s, "
        f"the small tables {scale.get('small_tables_s', 0):.0f} s, the metric rows' COPY "
        f"{scale.get('metrics_copy_s', 0):,.0f} s ({scale.get('metric_rows', 0) / max(scale.get('metrics_copy_s', 1), 1e-9):,.0f} "
        f"rows/s), their primary key, unique constraint and foreign key {scale.get('metrics_indexes_s', 0):,.0f} s, "
        f"VACUUM ANALYZE {scale.get('vacuum_analyze_s', 0):,.0f} s, the curve keeper's first pass "
        f"{scale.get('curve_keeper_s', 0):,.0f} s ({scale.get('curves_saved', 0):,} curves saved).",
        "",
        f"Asked for: the largest search, experiment {ids['big']} (ACTIVE, adaptive ASHA, "
        f"{ids['trials_of'][ids['big']]:,} trials); a typical one, experiment {ids['typical']} (COMPLETED, "
        f"{ids['trials_of'][ids['typical']]:,} trials); the trial with the most metric rows, {ids['long_trial']} "
        f"({ids['rows_of'][ids['long_trial']]:,}); a typical trial, {ids['trial']} ({ids['rows_of'][ids['trial']]:,}).",
        "",
        "### The lifecycle loop, per tick (in-process, the functions the loop calls)",
        "",
        "| pass | p50 ms | p99 ms | max ms | n | SQL statements | slowest statement ms | index only | key plan node |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in k["loop"]:
        t = r.timing
        lines.append(
            f"| {r.name} | {_flag(t.p50)} | {_flag(t.p99)} | {_ms(t.max)} | {len(t.samples_ms)} | {r.statements} | "
            f"{_ms(r.sql_ms())} | {r.index_cell()} | {r.key_scan() or '–'} |"
        )
    lines += [
        "",
        "### The reads over HTTP (det-master, loopback, one request in flight, logged in as admin)",
        "",
        "| read | p50 ms | p99 ms | max ms | n | rows returned | response | SQL statements | slowest statement ms "
        "| index only | key plan node (slowest statement) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in k["reads"]:
        t = r.timing
        lines.append(
            f"| {r.name} | {_flag(t.p50)} | {_flag(t.p99)} | {_ms(t.max)} | {len(t.samples_ms)} | {t.items:,} | "
            f"{t.bytes / 1e3:,.0f} KB | {r.statements} | {_ms(r.sql_ms())} | {r.index_cell()} | {r.key_scan() or '–'} |"
        )
    lines += [
        "",
        f'The master saw no Slurm: its commands were stubs that answer "Unable to contact slurm controller" '
        f"({k['slurm_calls']} calls while it ran). "
        + (
            "**The database changed while the master ran** (states, versions or metric rows): see its log."
            if k["changed"]
            else "Experiment, trial and run states and versions, and the metric rows, were the same after it."
        ),
        "",
    ]
    lines += _plans(k["loop"] + k["reads"])
    return "\n".join(lines) + "\n"


def _plans(rows: list[Row]) -> list[str]:
    """The plans worth reading: each statement with a sequential scan of a growing table or over 20 ms."""
    out = [
        f"### Plans worth reading (a sequential scan of ≥ {SEQ_ROWS:,} rows of a table that grows, or a statement "
        "over 20 ms)",
        "",
    ]
    seen: set[str] = set()
    for r in rows:
        for p in sorted(r.plans, key=lambda p: -p.ms):
            worth = p.ms > 20 or any(s.rows >= SEQ_ROWS for s in seq_scans([p]))
            if not worth or p.sql in seen:
                continue
            seen.add(p.sql)
            out += [f"**{r.name}** ({p.ms:,.1f} ms, shared buffers hit {p.hit:,}, read {p.read:,}):", ""]
            out += ["```sql", short(" ".join(p.sql.split())), "```", "", "```", short(p.text), "```", ""]
    if len(out) == 2:
        out.append("None.")
    return out
