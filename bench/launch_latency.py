"""Launch latency and many-short-trials throughput through the whole platform, next to bare ``sbatch``.

    .venv/bin/python bench/launch_latency.py [--quick] [--trials N] [--throughput-trials M] [--poll-interval-s S]

Run as root with the local cluster up; jobs run as the researcher account. A private master (its own DB) is
started with the given poll interval (default 5 s, the shipped default; the lifecycle loop ticks every
min(2 s, poll interval)).

1. Latency, N pairs, alternating which goes first, each waiting for the previous job to end:
   - platform: ``POST /api/v1/experiments`` (one trial, ``single`` searcher) → searcher → ``sbatch`` → job
     RUNNING in ``squeue`` → the entrypoint's first line (the script writes ``time.time()`` before any import)
     → RUNNING in the master's DB → experiment COMPLETED;
   - bare: ``runuser -u researcher -- sbatch`` of a bash script with the same partition and resources
     (``-N1 --ntasks-per-node=1 --gres=gpu:1 --no-requeue``) that runs ``python3 bare.py``, whose first line
     records its start time (as the platform's entrypoint does) before it sleeps the same time.
   slurmctld schedules new batch jobs from a background loop that wakes on whole wall-clock seconds, so how
   long a job waits depends on the fraction of a second at which it was submitted; back-to-back runs lock
   onto a phase (waits of 0.12 or 0.45 or 0.99 s, nothing between). Each pair therefore starts both its
   requests at the same phase of the second, the pairs' phases spread evenly over [0, 1); the ratio is
   given on medians and on means.
2. Throughput, M short trials (a ``grid`` search of M points, ``max_concurrent_trials`` = 4 × slots so that
   Slurm always has queued trials to start when one ends, each trial sleeps ``--trial-s``) next to M bare
   ``sbatch`` jobs of the same sleep, submitted back to back. Reported against the slot-time minimum
   M × trial_s / slots, slots being the GPUs of the cluster's default partition (``sinfo``).

Times are wall-clock (``time.time()``) on this machine, which the cluster's nodes share.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._cluster import (
    BenchMaster,
    bench_root,
    median,
    others_on_cluster,
    pct,
    require_cluster,
    sbatch,
    shared_dir,
    spread,
    squeue_states,
    start_master,
    table,
    wait_for,
    write_result,
)
from tests.slurm.fixtures import Researcher


def cluster_slots() -> int:
    """GPUs in the default partition: the most trials (1 GPU each) that can run at once."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-p", "batch", "-o", "%N %G"], capture_output=True, text=True, check=True
    ).stdout
    total = 0
    for line in sorted(set(out.splitlines())):
        for gres in line.split()[1].split(","):
            if gres.startswith("gpu:"):
                total += int(gres.split(":")[-1].split("(")[0])
    return total


TRIAL_SCRIPT = """\
import time

T0 = time.time()  # the entrypoint's first line, before any import

import json
import os
import pathlib

import determined as det


def main(core_context):
    info = det.get_cluster_info()
    hp = info.trial.hparams
    t_ready = time.time()
    for op in core_context.searcher.operations():
        time.sleep(hp["sleep_s"])
        t_slept = time.time()
        core_context.train.report_validation_metrics(
            steps_completed=op.length, metrics={"validation_loss": 1.0}
        )
        op.report_completed(1.0)
    t_end = time.time()
    record = {"start": T0, "ready": t_ready, "slept": t_slept, "end": t_end, "job": os.environ.get("SLURM_JOB_ID")}
    out = pathlib.Path(hp["out_dir"]) / f"trial-{info.trial.trial_id}.json"
    out.write_text(json.dumps(record))


if __name__ == "__main__":
    with det.core.init() as core_context:
        main(core_context)
"""

BARE_SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=bench-bare
#SBATCH --partition=batch
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:1
#SBATCH --no-requeue
#SBATCH --output=/dev/null
exec python3 {bare_py}
"""

BARE_PY = """\
import time

T0 = time.time()  # the first line, as in the platform's entrypoint

import json
import os

time.sleep({sleep_s})
job = os.environ["SLURM_JOB_ID"]
with open(f"{out_dir}/bare-{{job}}.json", "w") as f:
    json.dump({{"start": T0, "end": time.time(), "job": job}}, f)
"""


def single_config(out_dir: Path, sleep_s: float) -> str:
    return textwrap.dedent(f"""
        name: bench-latency
        entrypoint: python3 lat.py
        hyperparameters: {{sleep_s: {sleep_s}, out_dir: "{out_dir}"}}
        searcher: {{name: single, metric: validation_loss, max_length: {{batches: 1}}}}
        max_restarts: 0
    """)


def grid_config(out_dir: Path, trials: int, sleep_s: float, slots: int) -> str:
    return textwrap.dedent(f"""
        name: bench-throughput
        entrypoint: python3 lat.py
        hyperparameters:
          sleep_s: {sleep_s}
          out_dir: "{out_dir}"
          i: {{type: int, minval: 1, maxval: {trials}, count: {trials}}}
        searcher:
          name: grid
          metric: validation_loss
          max_length: {{batches: 1}}
          max_concurrent_trials: {4 * slots}
        max_restarts: 0
    """)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


# ---- latency: one job at a time ----------------------------------------------------------------------


def at_phase(phase: float) -> None:
    """Sleep until the wall clock's fraction of a second is ``phase``."""
    time.sleep((phase - time.time()) % 1.0)


def bare_once(researcher: Researcher, script: Path, out_dir: Path, phase: float = 0.0) -> dict[str, float]:
    at_phase(phase)
    t0 = time.time()
    job = sbatch(researcher, script)
    t_sbatch = time.time()
    t_running: float | None = None
    while True:
        state = squeue_states([job]).get(job)
        now = time.time()
        if state == "RUNNING" and t_running is None:
            t_running = now
        if state is None or state in ("COMPLETED", "FAILED", "CANCELLED"):
            t_gone = now
            break
        if now - t0 > 300:
            raise TimeoutError(f"bare job {job} still {state}")
        time.sleep(0.1)
    rec = wait_for(lambda: _read_json(out_dir / f"bare-{job}.json"), 30, f"bare job {job}'s record")
    return {
        "sbatch": t_sbatch - t0,
        "squeue_running": (t_running or float("nan")) - t0,
        "user_start": rec["start"] - t0,
        "done": t_gone - t0,
    }


def platform_once(
    m: BenchMaster, headers: dict[str, str], context: Path, out_dir: Path, phase: float = 0.0
) -> dict[str, float]:
    config = single_config(out_dir, SLEEP_S)
    at_phase(phase)
    t0 = time.time()
    exp = m.create_experiment(headers, config, context)
    t_created = time.time()
    job: str | None = None
    marks: dict[str, float] = {}
    while True:
        now = time.time()
        runs = [r for r in m.runs() if r["experiment_id"] == exp]
        if runs and runs[0]["slurm_job_id"] and job is None:
            job = str(runs[0]["slurm_job_id"])
            marks["sbatch"] = now
        if job and "squeue_running" not in marks and squeue_states([job]).get(job) == "RUNNING":
            marks["squeue_running"] = now
        if runs and runs[0]["state"] != "PENDING" and "master_running" not in marks:
            marks["master_running"] = now
        if "master_running" in marks and now - marks.get("_exp_checked", 0) > 0.2:
            marks["_exp_checked"] = now
            if m.experiment(headers, exp)["state"] in ("STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED"):
                marks["done"] = now
                break
        if now - t0 > 300:
            raise TimeoutError(f"experiment {exp}: {marks}\n{m.diagnose(exp)}")
        # Until sbatch has answered, only the master's database is read (a local SQLite file), every 10 ms;
        # after that every 0.1 s, with squeue.
        time.sleep(0.1 if job else 0.01)
    trial = m.trials(headers, exp)[0]
    rec = wait_for(lambda: _read_json(out_dir / f"trial-{trial['id']}.json"), 30, "the trial's record")
    out = {k: v - t0 for k, v in marks.items() if not k.startswith("_")}
    out["create"] = t_created - t0
    out["user_start"] = rec["start"] - t0
    out["harness_ready"] = rec["ready"] - t0
    out["state_completed"] = float(trial["state"] == "STATE_COMPLETED")
    return out


# ---- throughput: M short jobs --------------------------------------------------------------------------


def bare_batch(researcher: Researcher, script: Path, out_dir: Path, n: int) -> dict[str, float]:
    t0 = time.time()
    jobs = [sbatch(researcher, script) for _ in range(n)]
    t_submitted = time.time()

    def all_done() -> bool:
        if any(not (out_dir / f"bare-{j}.json").exists() for j in jobs):
            return False
        return not squeue_states(jobs)

    wait_for(all_done, 60 + 10 * n, f"{n} bare jobs", interval_s=0.2)
    t_done = time.time()
    recs = [_read_json(out_dir / f"bare-{j}.json") or {} for j in jobs]
    return {
        "submit_s": t_submitted - t0,
        "makespan_s": max(r["end"] for r in recs) - t0,
        "done_s": t_done - t0,
        "user_s": sum(r["end"] - r["start"] for r in recs),
        "first_start_s": min(r["start"] for r in recs) - t0,
        "jobs": float(len(jobs)),
        "job_ids": jobs,  # type: ignore[dict-item]
    }


def platform_batch(
    m: BenchMaster, headers: dict[str, str], context: Path, out_dir: Path, n: int, trial_s: float, slots: int
) -> dict[str, float]:
    t0 = time.time()
    exp = m.create_experiment(headers, grid_config(out_dir, n, trial_s, slots), context)
    first_burst: float | None = None
    burst = min(n, 4 * slots)
    while True:
        now = time.time()
        if first_burst is None:  # read often until the first burst is in Slurm, then seldom: the makespan
            # comes from the trials' own records, and this process shares the machine with the master
            submitted = [r for r in m.runs() if r["experiment_id"] == exp and r["slurm_job_id"]]
            if len(submitted) >= burst:
                first_burst = now - t0
        state = m.experiment(headers, exp)["state"]
        if state in ("STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED"):
            break
        if now - t0 > 120 + 15 * n:
            raise TimeoutError(f"grid experiment {exp} still {state}\n{m.diagnose(exp)}")
        time.sleep(0.1 if first_burst is None else 1.0)
    t_done = time.time()
    trials = m.trials(headers, exp)
    recs = [_read_json(out_dir / f"trial-{t['id']}.json") for t in trials]
    ok = [r for r in recs if r]
    jobs = [str(r["slurm_job_id"]) for r in m.runs() if r["experiment_id"] == exp and r["slurm_job_id"]]
    return {
        "burst_s": first_burst or float("nan"),
        "burst_n": float(burst),
        "makespan_s": max(r["end"] for r in ok) - t0,
        "done_s": t_done - t0,
        "user_s": sum(r["end"] - r["start"] for r in ok),
        "harness_init_s": sum(r["ready"] - r["start"] for r in ok),
        "report_s": sum(r["end"] - r["slept"] for r in ok),
        "first_start_s": min(r["start"] for r in ok) - t0,
        "completed": float(sum(t["state"] == "STATE_COMPLETED" for t in trials)),
        "jobs": float(len(jobs)),
        "job_ids": jobs,  # type: ignore[dict-item]
    }


def sacct_elapsed_s(job_ids: list[str]) -> float:
    """Total ElapsedRaw (s, 1 s resolution) of the jobs, as Slurm accounted them."""
    if not job_ids:
        return float("nan")
    total = 0.0
    for i in range(0, len(job_ids), 200):
        out = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids[i : i + 200]), "--format=JobID,ElapsedRaw"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) == 2 and parts[1].isdigit():
                total += int(parts[1])
    return total


SLEEP_S = 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trials", type=int, default=None, help="latency pairs (default 20, quick 3)")
    parser.add_argument("--throughput-trials", type=int, default=None, help="default 120, quick 24")
    parser.add_argument("--rounds", type=int, default=None, help="throughput rounds (default 2, quick 1)")
    parser.add_argument("--trial-s", type=float, default=1.0, help="sleep of each short trial")
    parser.add_argument("--poll-interval-s", type=float, default=5.0, help="the master's poll_interval_s")
    parser.add_argument(
        "--no-bare-throughput",
        action="store_true",
        help="throughput of the platform only, against the slot-time minimum (halves a long run)",
    )
    parser.add_argument(
        "--no-platform-throughput",
        action="store_true",
        help="throughput of bare sbatch only (its half of a long run, done separately)",
    )
    args = parser.parse_args()
    n_lat = args.trials or (3 if args.quick else 20)
    n_tp = args.throughput_trials or (24 if args.quick else 120)
    rounds = args.rounds or (1 if args.quick else 2)

    researcher = require_cluster()
    root = bench_root("launch")
    out_dir = shared_dir(root, "out")
    context = root / "context"
    context.mkdir()
    (context / "lat.py").write_text(TRIAL_SCRIPT)
    slots = cluster_slots()
    for name, sleep_s in (("lat", SLEEP_S), ("tp", args.trial_s)):
        py = root / f"bare_{name}.py"
        py.write_text(BARE_PY.format(sleep_s=sleep_s, out_dir=out_dir))
        (root / f"bare_{name}.sbatch").write_text(BARE_SCRIPT.format(bare_py=py))
        for p in (py, root / f"bare_{name}.sbatch"):
            p.chmod(0o644)
    bare_lat, bare_tp = root / "bare_lat.sbatch", root / "bare_tp.sbatch"

    cluster_before = others_on_cluster()
    m, alice = start_master("launch", researcher, args.poll_interval_s)
    try:
        platform_once(m, alice, context, out_dir)  # warm-up (page cache, first imports), not counted
        bare_once(researcher, bare_lat, out_dir)
        lat_p: list[dict[str, float]] = []
        lat_b: list[dict[str, float]] = []
        order = random.Random(0).sample(range(n_lat), n_lat)  # every phase once, not in order
        for i in range(n_lat):
            phase = (order[i] + 0.5) / n_lat
            if i % 2 == 0:
                lat_b.append(bare_once(researcher, bare_lat, out_dir, phase))
                lat_p.append(platform_once(m, alice, context, out_dir, phase))
            else:
                lat_p.append(platform_once(m, alice, context, out_dir, phase))
                lat_b.append(bare_once(researcher, bare_lat, out_dir, phase))
            print(f"latency pair {i + 1}/{n_lat}: platform {lat_p[-1]} bare {lat_b[-1]}", flush=True)

        tp_p: list[dict[str, Any]] = []
        tp_b: list[dict[str, Any]] = []
        for r in range(rounds):
            order = ["bare", "platform"] if r % 2 == 0 else ["platform", "bare"]
            for kind in order:
                if (kind == "bare" and args.no_bare_throughput) or (
                    kind == "platform" and args.no_platform_throughput
                ):
                    continue
                if kind == "bare":
                    tp_b.append(bare_batch(researcher, bare_tp, out_dir, n_tp))
                else:
                    tp_p.append(platform_batch(m, alice, context, out_dir, n_tp, args.trial_s, slots))
                print(
                    f"throughput round {r + 1} {kind}: {(tp_b if kind == 'bare' else tp_p)[-1]}", flush=True
                )
        for rec in tp_b + tp_p:
            rec["sacct_s"] = sacct_elapsed_s(rec.pop("job_ids"))
        cluster_after = others_on_cluster()
    finally:
        m.shutdown()

    text = report(lat_p, lat_b, tp_p, tp_b, n_tp, slots, args, cluster_before, cluster_after)
    print(text)
    path = write_result("launch_latency", text)
    print(f"written to {path}")


def _col(rows: list[dict[str, float]], key: str) -> list[float]:
    return [r[key] for r in rows if key in r and r[key] == r[key]]


def report(
    lat_p: list[dict[str, float]],
    lat_b: list[dict[str, float]],
    tp_p: list[dict[str, Any]],
    tp_b: list[dict[str, Any]],
    n_tp: int,
    slots: int,
    args: argparse.Namespace,
    cluster_before: str,
    cluster_after: str,
) -> str:
    def cell(xs: list[float]) -> str:
        return f"{median(xs):.2f} / {pct(xs, 90):.2f} ({spread(xs)})"

    lines = [
        "# Launch latency and short-trial throughput",
        "",
        f"`bench/launch_latency.py{' --quick' if args.quick else ''}`: {len(lat_p)} latency pairs, "
        f"{len(tp_p)} throughput round(s) of {n_tp} trials of {args.trial_s:g} s; master poll_interval_s="
        f"{args.poll_interval_s:g} (loop tick {min(2.0, args.poll_interval_s):g} s). Other people's jobs on the "
        f"cluster: {cluster_before} before, {cluster_after} after. Seconds since the request "
        "(REST create or `sbatch`), median / p90 (min–max).",
        "",
        "## Create → running, one job at a time",
        "",
    ]
    stages = [
        ("REST create returned", "create", None),
        ("job in Slurm (sbatch answered)", "sbatch", "sbatch"),
        ("RUNNING in squeue", "squeue_running", "squeue_running"),
        ("entrypoint's first line runs", "user_start", "user_start"),
        ("Core API ready (`det.core.init` entered)", "harness_ready", None),
        ("RUNNING in the master", "master_running", None),
        ("done (experiment COMPLETED / job left squeue)", "done", "done"),
    ]
    rows = []
    for label, pk, bk in stages:
        p = _col(lat_p, pk)
        b = _col(lat_b, bk) if bk else []
        ratio = f"{median(p) / median(b):.2f}×" if b and median(b) > 0 else "–"
        rows.append([label, cell(p), cell(b) if b else "–", ratio])
    lines.append(table(["stage", "platform", "bare sbatch", "ratio (medians)"], rows))
    up = _col(lat_p, "user_start")
    ub = _col(lat_b, "user_start")
    pairs = [p["user_start"] / b["user_start"] for p, b in zip(lat_p, lat_b, strict=True)]
    lines += [
        "",
        f"**Create → entrypoint running: {median(up):.2f} s platform vs {median(ub):.2f} s bare sbatch → "
        f"{median(up) / median(ub):.2f}×; means {statistics.fmean(up):.2f} vs {statistics.fmean(ub):.2f} s → "
        f"{statistics.fmean(up) / statistics.fmean(ub):.2f}× (per-pair ratios: median {median(pairs):.2f}×, "
        f"{spread(pairs)}; goal ≤ 1.2×).**",
        "",
        "The platform's own share, from the medians: REST create "
        f"{median(_col(lat_p, 'create')):.2f} s, create → sbatch answered "
        f"{median(_col(lat_p, 'sbatch')) - median(_col(lat_p, 'create')):.2f} s (the lifecycle loop wakes, "
        "the searcher creates the trial, the run directory is written; polled every 0.01 s), job start → "
        f"entrypoint {median(up) - median(_col(lat_p, 'squeue_running')):.2f} s vs bare "
        f"{median(ub) - median(_col(lat_b, 'squeue_running')):.2f} s (squeue polled every 0.1 s).",
        "",
        "## Many short trials",
        "",
    ]
    ideal = n_tp * args.trial_s / slots
    rows = []
    for kind, recs in (("platform (grid search)", tp_p), ("bare sbatch", tp_b)):
        if not recs:
            continue
        mk = [r["makespan_s"] for r in recs]
        rows.append(
            [
                kind,
                f"{median(mk):.1f} ({spread(mk)})",
                f"{median(mk) / ideal:.2f}×",
                f"{median([r['jobs'] / r['makespan_s'] * 60 for r in recs]):.0f}",
                f"{median([r['sacct_s'] / r['jobs'] for r in recs]):.2f}",
                f"{median([r['user_s'] / r['jobs'] for r in recs]):.2f}",
                f"{median([r['harness_init_s'] / r['jobs'] for r in recs]):.2f}"
                if "harness_init_s" in recs[0]
                else "–",
                f"{median([r['report_s'] / r['jobs'] for r in recs]):.2f}" if "report_s" in recs[0] else "–",
            ]
        )
    lines.append(
        table(
            [
                f"{n_tp} trials of {args.trial_s:g} s",
                "makespan s (min–max)",
                f"vs slot-time minimum {ideal:.0f} s ({slots} slots)",
                "trials/min",
                "Slurm elapsed per job s",
                "script time per job s",
                "of which imports + Core API init s",
                "of which validation report + report_completed s",
            ],
            rows,
        )
    )
    overheads: list[str] = []
    submissions: list[str] = []
    tail: list[str] = []
    if tp_p:
        mp_ = median([r["makespan_s"] for r in tp_p])
        bursts = [r["burst_n"] / r["burst_s"] for r in tp_p]
        completed = int(sum(r["completed"] for r in tp_p))
        overheads.append(f"platform {100 * (mp_ / ideal - 1):.1f} %")
        submissions.append(
            f"the platform put its first {int(tp_p[0]['burst_n'])} trials into Slurm at "
            f"{median(bursts):.1f} jobs/s (REST create → last of them answered by sbatch)"
        )
        tail.append(f"Trials COMPLETED: {completed} of {n_tp * len(tp_p)}.")
    if tp_b:
        mb = median([r["makespan_s"] for r in tp_b])
        subs = [r["jobs"] / r["submit_s"] for r in tp_b]
        overheads.append(f"bare sbatch {100 * (mb / ideal - 1):.1f} %")
        submissions.append(f"bare back-to-back `runuser sbatch` ran at {median(subs):.1f} jobs/s")
    if tp_p and tp_b:
        overheads.append(f"platform / bare makespan = {mp_ / mb:.2f}×")
    not_run = (
        " (bare sbatch not run: --no-bare-throughput)"
        if not tp_b
        else " (platform not run: --no-platform-throughput)"
        if not tp_p
        else ""
    )
    lines += [
        "",
        f"Overhead vs the slot-time minimum: {', '.join(overheads)}{not_run}. {' '.join(tail)}".rstrip(),
        f"Submission rate: {'; '.join(submissions)}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
