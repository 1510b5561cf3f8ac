"""The report of ``bench/many_users.py``: a level's measurements and the Markdown written to bench/results."""

from __future__ import annotations

import argparse
import itertools
import os
from dataclasses import dataclass, field
from typing import Any

from bench._cluster import pct, table
from bench._many_users_traffic import Calls


@dataclass
class Level:
    users: int
    t0: float
    t1: float
    calls: Calls
    master_cpu_s: float
    created: list[int]
    ticks: list[dict[str, Any]] = field(default_factory=list)
    server: dict[str, list[float]] = field(default_factory=dict)
    jobs: int = 0
    metric_rows: int = 0
    drain_s: float = 0.0
    to_queued: list[float] = field(default_factory=list)  # experiment created → its first run allocated
    to_running: list[float] = field(default_factory=list)  # experiment created → its first run RUNNING


def cell(xs: list[float]) -> str:
    if not xs:
        return "–"
    return f"{1000 * pct(xs, 50):.0f} / {1000 * pct(xs, 99):.0f} / {1000 * max(xs):.0f} ({len(xs)})"


def tick_row(level: Level) -> list[Any]:
    ticks = sorted(level.ticks, key=lambda r: r["t"])
    durs = [r["dur"] for r in ticks]
    interval = ticks[0]["interval"] if ticks else float("nan")
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(ticks)]
    over = sum(d > interval for d in durs)
    slow_step = ""
    if ticks:
        worst = max(ticks, key=lambda r: r["dur"])
        steps = {k: v for k, v in worst.items() if k not in ("t", "dur", "interval")}
        name, spent = max(steps.items(), key=lambda kv: kv[1], default=("–", 0.0))
        slow_step = f"{name} {1000 * spent:.0f} ms"
    starved = bool(gaps) and max(gaps) > 2 * interval
    return [
        "idle" if level.users == 0 else level.users,
        len(ticks),
        f"{1000 * pct(durs, 50):.0f} / {1000 * pct(durs, 99):.0f} / {1000 * max(durs, default=0):.0f}",
        slow_step,
        f"{max(gaps, default=0):.2f} s (interval {interval:g} s)",
        over,
        "**yes**" if starved else "no",
    ]


def report(levels: list[Level], idle: Level, ran: dict[str, Any], iso: dict[str, Any], args: argparse.Namespace,
           env: dict[str, str]) -> str:  # fmt: skip
    lines = [
        "# Many users on one master",
        "",
        f"`bench/many_users.py{' --quick' if args.quick else ''}` ({env['date']}): levels {args.levels} "
        f"concurrent researchers, {args.duration_s:g} s each; one `det-master` on PostgreSQL "
        f"(`{args.db_name}`), poll_interval_s {args.poll_interval_s:g} (loop interval "
        f"{min(2.0, args.poll_interval_s):g} s); the real 2-node local Slurm cluster ({env['cluster']}). "
        f"**The machine has {os.cpu_count()} CPUs, shared by the master, PostgreSQL, slurmctld/slurmd, the jobs and "
        "the load generator (one process, one thread per researcher); another engineer's tests may also run on "
        f"it.** Load average before: {env['load_before']}, after: {env['load_after']}.",
        "",
        f"Each researcher: its own Unix account (`detbenchNN`) and master user (`benchNN`, token of its own); one "
        f"live experiment at a time (a new one when the last ended, at most every {args.create_every_s:g} s; "
        f"`single` and 2-trial `random` searches, CPU-only trials reporting a training metric every "
        f"{args.sleep_s:g} s for {args.steps} steps); between think times of {args.think_s[0]:g}–{args.think_s[1]:g} "
        "s: list own experiments 20 %, list all 10 %, describe 20 %, list trials 20 %, trial metrics 20 %, "
        f"follow a trial's logs for {args.follow_s:g} s 10 %.",
        "",
        "## API latency, client side (ms: p50 / p99 / max (requests))",
        "",
    ]
    routes = sorted({r for lv in levels for r in lv.calls.latency}, key=lambda r: r != "create experiment")
    rows = [[r, *(cell(lv.calls.latency.get(r, [])) for lv in levels)] for r in routes]
    rows.append(["**all**", *(cell([x for v in lv.calls.latency.values() for x in v]) for lv in levels)])
    rows.append(["errors", *(", ".join(f"{k}: {len(v)}" for k, v in lv.calls.errors.items()) or "0"
                             for lv in levels)])  # fmt: skip
    lines.append(table(["route", *(f"{lv.users} user(s)" for lv in levels)], rows))
    lines += [
        "",
        "## The master's side of it (ms from the request reaching the app: p50 / p99 / max (count))",
        "",
    ]
    classes = sorted({c for lv in levels for c in lv.server})
    rows = [[c, *(cell(lv.server.get(c, [])) for lv in levels)] for c in classes]
    rows += [
        [
            "requests / s (users + jobs)",
            *(f"{sum(len(v) for v in lv.server.values()) / (lv.t1 - lv.t0):.1f}" for lv in levels),
        ],
        ["master CPU (% of one core)", *(f"{100 * lv.master_cpu_s / (lv.t1 - lv.t0):.0f}" for lv in levels)],
        ["create → first trial's run allocated by the loop", *(cell(lv.to_queued) for lv in levels)],
        [
            "create → first trial RUNNING (Slurm start incl. queueing)",
            *(cell(lv.to_running) for lv in levels),
        ],
        ["experiments created / Slurm jobs", *(f"{len(lv.created)} / {lv.jobs}" for lv in levels)],
        ["metric rows the jobs posted", *(str(lv.metric_rows) for lv in levels)],
        ["log lines the follows received", *(str(lv.calls.log_lines) for lv in levels)],
    ]
    lines.append(table(["", *(f"{lv.users} user(s)" for lv in levels)], rows))
    lines += ["", "## The lifecycle loop", ""]
    lines.append(
        table(
            [
                "users",
                "ticks",
                "tick ms p50 / p99 / max",
                "slowest tick's biggest step",
                "max gap between tick starts",
                "ticks longer than the interval",
                "starved (gap > 2 × interval)",
            ],
            [tick_row(lv) for lv in [idle, *levels]],
        )
    )
    steps = sorted({k for lv in [idle, *levels] for r in lv.ticks for k in r} - {"t", "dur", "interval"})
    last = levels[-1] if levels else idle
    rows = [
        [
            f"`{k}`",
            *(cell([r.get(k, 0.0) for r in lv.ticks]) for lv in [idle, *levels]),
            f"{sum(r.get(k, 0.0) for r in last.ticks):.1f} s",
        ]
        for k in steps
    ]
    lines += ["", "Where a tick's time goes (ms per tick: p50 / p99 / max (ticks)):", ""]
    header = ["step", *("idle" if lv.users == 0 else f"{lv.users} user(s)" for lv in [idle, *levels])]
    lines.append(table([*header, f"total at {last.users} users"], rows))
    mismatch = f" {ran['sacct_mismatch']}" if ran["sacct_mismatch"] else ""
    lines += [
        "",
        "## Whose account ran the jobs",
        "",
        f"{ran['jobs']} Slurm jobs of {ran['accounts']} accounts: `sacct` user = the owner's `unixUsername` for "
        f"{ran['sacct_match']}, different for {len(ran['sacct_mismatch'])}{mismatch}, not in sacct "
        f"{ran['sacct_unknown']}; output files of the jobs that started (those killed while pending have none) "
        f"owned by that account: {ran['files_ok']}, by another: {ran['files_bad']}.",
        "",
        "## What a user sees of the others'",
        "",
        f"- `GET /experiments?users=<me>`: {iso.get('own_list_foreign', 0)} foreign experiments in "
        f"{iso.get('unfiltered_lists', 0)} users' lists.",
        f"- `GET /experiments` (no filter): {iso.get('unfiltered_lists_with_foreign', 0)} of "
        f"{iso.get('unfiltered_lists', 0)} users see others' experiments ({iso.get('foreign_seen', 0)} in all), "
        'as docs/security.md intends (Determined\'s "the team can look"); their secrets '
        f"(`environment_variables`) leaked in {iso.get('foreign_secret_leaks', 0)} (own shown: "
        f"{iso.get('own_secret_shown', 0)}).",
        "- Another user's trial: logs → "
        + ", ".join(
            f"HTTP {k.rsplit('_', 1)[1]}: {v}" for k, v in iso.items() if k.startswith("foreign_logs_")
        )
        + "; metrics → "
        + ", ".join(
            f"HTTP {k.rsplit('_', 1)[1]}: {v}" for k, v in iso.items() if k.startswith("foreign_metrics_")
        )
        + ".",
        "",
    ]
    return "\n".join(lines)
