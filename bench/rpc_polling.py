"""Slurm RPCs of the master's polling with many users (issue 37: "≤ 1 RPC/s of polling in total"), against a
per-job poller's on the same jobs, in one run on the real local cluster.

    flock /tmp/hpc-cluster.lock .venv/bin/python bench/rpc_polling.py [--users 100] [--window-s 120]

Run as root with the local cluster up. ``--users`` Unix accounts ``detbench01``.. (``bench/many_users.py``'s,
kept for re-runs) each get a master user and ONE running experiment (a CPU-only trial that reports a step
every 2 s and checkpoints every 5, as the user's account; the cluster runs 16 at a time, the rest wait in
Slurm's queue: the master polls both). One master (SQLite, the shipped 5 s poll interval). Measured from the
master's own ``/metrics`` (``det_slurm_calls_total{command}``: every Slurm command it ran, by name):

- **the master, 1 user**: the same master with one experiment, before the others are created;
- **the master, N users**: over ``--window-s`` once every experiment has its job;
- **baseline, per-job polling**: what a tool that polls each job with its own ``squeue -j`` every 5 s (the
  pattern sites ask tools to avoid) sends for the same jobs, run by this script for ``--baseline-s``.

Polling RPCs are ``squeue``, ``sacct`` and ``scontrol`` calls; ``sbatch`` (one per trial run) and ``scancel``
are reported apart. The result goes to ``bench/results/rpc_polling.md``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench._cluster import RESULTS, require_cluster, start_master  # noqa: E402
from bench.many_users import ensure_accounts  # noqa: E402

POLLING = ("squeue", "sacct", "scontrol")
CONFIG = """
name: rpc-{user}
entrypoint: python3 train.py
hyperparameters: {{increment_by: 1, sleep_s: 2}}
searcher: {{name: single, metric: validation_loss, max_length: {{batches: 100000}}}}
resources: {{slots_per_trial: 0}}
max_restarts: 0
"""


def calls(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "det_slurm_calls_total":
                out[sample.labels["command"]] = sample.value
    return out


def rate(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    return {c: (after.get(c, 0) - before.get(c, 0)) / seconds for c in sorted(set(before) | set(after))}


def polling(per_s: dict[str, float]) -> float:
    return sum(v for c, v in per_s.items() if c in POLLING)


def measure(url: str, seconds: float) -> dict[str, float]:
    before, started = calls(url), time.monotonic()
    time.sleep(seconds)
    return rate(before, calls(url), time.monotonic() - started)


def per_job_baseline(job_ids: list[str], seconds: float, interval_s: float = 5.0) -> float:
    """Per-job polling: one ``squeue -j ID`` per job every ``interval_s``; RPCs per second sent."""
    sent, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        cycle = time.monotonic()
        for job in job_ids:
            subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, check=False)
            sent += 1
        time.sleep(max(0.0, interval_s - (time.monotonic() - cycle)))
    return sent / (time.monotonic() - started)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--window-s", type=float, default=120.0)
    parser.add_argument("--baseline-s", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "rpc_polling.md")
    args = parser.parse_args()
    researcher = require_cluster()
    accounts, _ = ensure_accounts(args.users)
    master, _alice = start_master("rpc", researcher, poll_interval_s=5.0)
    try:
        admin = master.login("admin", "admin-pw")
        headers = []
        for i, unix in enumerate(accounts, start=1):
            name = f"rpc{i:03d}"
            body = {"user": {"username": name, "active": True, "unixUsername": unix}, "password": "pw"}
            master.api("POST", "/users", admin, json=body)
            headers.append(master.login(name, "pw"))
        exps = [master.create_experiment(headers[0], CONFIG.format(user=1))]
        wait_jobs(master, 1)
        one = measure(master.url, args.window_s / 2)
        exps += [
            master.create_experiment(h, CONFIG.format(user=i)) for i, h in enumerate(headers[1:], start=2)
        ]
        jobs = wait_jobs(master, len(exps))
        many = measure(master.url, args.window_s)
        running = subprocess.run(["squeue", "-h", "-t", "R", "-j", ",".join(jobs), "-o", "%i"],
                                 capture_output=True, text=True, check=False).stdout.split()  # fmt: skip
        baseline = per_job_baseline(jobs, args.baseline_s)
    finally:
        master.shutdown()
    report(args, one, many, baseline, len(jobs), len(running))
    return 0


def wait_jobs(master: object, n: int, timeout_s: float = 600) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        jobs = [str(j) for j in master.live_job_ids()]  # type: ignore[attr-defined]
        if len(jobs) >= n:
            return jobs
        time.sleep(2)
    raise SystemExit(f"only {len(master.live_job_ids())} of {n} experiments got a Slurm job")  # type: ignore[attr-defined]


def report(
    args: argparse.Namespace,
    one: dict[str, float],
    many: dict[str, float],
    baseline: float,
    jobs: int,
    running: int,
) -> None:
    lines = [
        "# Slurm RPCs of the master's polling with many users (`bench/rpc_polling.py`)",
        "",
        f"Local cluster (Slurm 22.05, 4 nodes), one master (SQLite, 5 s poll interval), {args.users} Unix accounts "
        f"with one running experiment each: {jobs} Slurm jobs ({running} running, the rest pending). Window "
        f"{args.window_s:.0f} s; per-job baseline {args.baseline_s:.0f} s on the same jobs.",
        "",
        "| | polling RPC/s | by command (per s) | sbatch/s |",
        "|---|---:|---|---:|",
    ]
    for label, r in (("the master, 1 user", one), (f"the master, {args.users} users", many)):
        by = ", ".join(f"{c} {v:.3f}" for c, v in r.items() if c in POLLING and v)
        lines.append(f"| {label} | {polling(r):.3f} | {by} | {r.get('sbatch', 0):.3f} |")
    lines.append(f"| baseline: per-job `squeue -j` every 5 s | {baseline:.2f} | squeue | – |")
    lines += [
        "",
        f"**{polling(many):.3f} polling RPC/s for {jobs} jobs of {args.users} users** (target ≤ 1), "
        f"{polling(many) / max(polling(one), 1e-9):.2f}× the one-user figure and "
        f"{polling(many) / baseline:.3f}× per-job polling ({baseline / max(polling(many), 1e-9):.0f}× fewer).",
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
