"""Preemption → durable checkpoint → exit → resumed first step, through real jobs, next to bare torch.save/load.

    .venv/bin/python bench/preempt_resume.py [--quick] [--reps N] [--sizes-mb 12,120,1200] [--poll-interval-s S]

Run as root with the local cluster up; jobs run as the researcher account. For each checkpoint size (a torch
state dict of random float32 tensors of 4 MB each: 12 MB, 120 MB, 1.2 GB; --quick skips 1.2 GB):

- bare, in this process, on the same filesystem as the platform's checkpoint storage: ``torch.save`` of the
  same state + fsync of the file and its directory, then ``torch.load``;
- platform: a one-trial experiment whose Core API script (``ckpt.py`` below) builds the state, trains (steps
  of ~20 ms) and, once it says it is training, gets ``scancel --batch --signal=USR1 JOBID`` — what
  ``sbatch --signal=B:USR1@lead`` delivers before a time limit; the job entry forwards it to the entrypoint.
  The script notices it at the next ``should_preempt()``, writes the state with
  ``core_context.checkpoint.store_path`` (temp dir, fsync, rename, register with the master) and exits; the
  master sees the job end (poll), resubmits the trial, and the next run ``torch.load``s the checkpoint and
  runs one step.

Timestamps come from the script itself (``time.time()``: signal handler entered, preemption noticed,
``torch.save`` returned, ``store_path`` exited = durable and registered, Core API context closed, next run's
first line, load done, first step done), from ``squeue`` polled every 0.1 s (job gone) and from the master's
DB (run ended, next run's ``sbatch`` answered).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench._cluster import (
    BenchMaster,
    bench_root,
    median,
    others_on_cluster,
    require_cluster,
    shared_dir,
    spread,
    squeue_states,
    start_master,
    table,
    wait_for,
    write_result,
)

TENSOR_NUMEL = 1_000_000  # 4 MB of float32

CKPT_SCRIPT = """\
import time

T0 = time.time()  # the entrypoint's first line

import json
import os
import pathlib
import signal

import torch

import determined as det

REC = {"start": T0, "job": os.environ.get("SLURM_JOB_ID")}
OUT = None


def write():
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(json.dumps(REC))
    os.replace(tmp, OUT)


def build_state(size_mb, seed):
    g = torch.Generator().manual_seed(seed)
    n = max(1, round(size_mb / 4))
    return {f"w{i}": torch.randn(1_000_000, generator=g) for i in range(n)}


def step(state):
    state["w0"].mul_(0.999)
    time.sleep(0.02)


def main(core_context):
    global OUT
    info = det.get_cluster_info()
    hp = info.trial.hparams
    OUT = pathlib.Path(hp["out_dir"]) / f"trial-{info.trial.trial_id}-run-{os.environ['DET_TRIAL_RUN_ID']}.json"
    previous = signal.getsignal(signal.SIGUSR1)

    def on_signal(signum, frame):
        REC.setdefault("signal", time.time())
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGUSR1, on_signal)
    if info.latest_checkpoint:
        REC["load_start"] = time.time()
        with core_context.checkpoint.restore_path(info.latest_checkpoint) as path:
            state = torch.load(path / "state.pt")
        REC["loaded"] = time.time()
        step(state)
        REC["first_step"] = time.time()
        write()
        for op in core_context.searcher.operations():
            core_context.train.report_validation_metrics(
                steps_completed=op.length, metrics={"validation_loss": 1.0}
            )
            op.report_completed(1.0)
        return
    state = build_state(hp["size_mb"], hp["seed"])
    REC["built"] = time.time()
    steps = 0
    for _op in core_context.searcher.operations():
        while True:
            step(state)
            steps += 1
            if steps == 3:
                REC["training"] = time.time()
                write()
            if core_context.preempt.should_preempt():
                REC["noticed"] = time.time()
                with core_context.checkpoint.store_path({"steps_completed": steps}) as (path, _):
                    torch.save(state, path / "state.pt")
                    REC["saved"] = time.time()
                REC["durable"] = time.time()
                write()
                return


if __name__ == "__main__":
    with det.core.init() as core_context:
        main(core_context)
    REC["exit"] = time.time()
    write()
"""


def experiment_config(out_dir: Path, size_mb: int, seed: int) -> str:
    mem_mb = 1500 if size_mb < 500 else 2900
    return textwrap.dedent(f"""
        name: bench-preempt-{size_mb}mb
        entrypoint: python3 ckpt.py
        hyperparameters: {{size_mb: {size_mb}, seed: {seed}, out_dir: "{out_dir}"}}
        searcher: {{name: single, metric: validation_loss, max_length: {{batches: 1000}}}}
        max_restarts: 0
        slurm: {{sbatch_args: ["--mem={mem_mb}M"]}}
    """)


def build_state(size_mb: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(TENSOR_NUMEL, generator=g) for i in range(max(1, round(size_mb / 4)))}


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def bare(state: dict[str, torch.Tensor], directory: Path) -> dict[str, float]:
    path = directory / "bare-state.pt"
    t0 = time.time()
    torch.save(state, path)
    _fsync(path)
    _fsync(directory)
    t1 = time.time()
    loaded = torch.load(path)
    t2 = time.time()
    assert torch.equal(loaded["w0"], state["w0"])
    del loaded
    path.unlink()
    return {"save_fsync": t1 - t0, "load": t2 - t1}


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def platform(
    m: BenchMaster, headers: dict[str, str], context: Path, out_dir: Path, size_mb: int
) -> dict[str, float]:
    exp = m.create_experiment(headers, experiment_config(out_dir, size_mb, seed=size_mb), context)
    trial_id = wait_for(lambda: [t["id"] for t in m.trials(headers, exp)], 60, "the trial")[0]
    run1 = out_dir / f"trial-{trial_id}-run-1.json"
    run2 = out_dir / f"trial-{trial_id}-run-2.json"
    rec1 = wait_for(lambda: (r := _read(run1)) and "training" in r and r, 600, "run 1 training", 0.05)
    job = str(rec1["job"])
    t_sent = time.time()
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
    marks: dict[str, float] = {}
    deadline = time.monotonic() + 600
    while "first_step" not in marks:
        now = time.time()
        if "job_gone" not in marks and squeue_states([job]).get(job) in (None, "COMPLETED"):
            marks["job_gone"] = now
        runs = {r["run_number"]: r for r in m.runs() if r["experiment_id"] == exp}
        if "master_ended" not in marks and 1 in runs and runs[1]["state"] not in ("PENDING", "RUNNING"):
            marks["master_ended"] = now
        if "resubmitted" not in marks and 2 in runs and runs[2]["slurm_job_id"]:
            marks["resubmitted"] = now
        r2 = _read(run2)
        if r2 and "first_step" in r2:
            marks["first_step"] = r2["first_step"]
        if time.monotonic() > deadline:
            raise TimeoutError(f"experiment {exp}: {marks}\n{m.diagnose(exp)}")
        time.sleep(0.1)
    state = m.wait_state(headers, exp, {"STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED"}, 120)
    rec1 = wait_for(lambda: (r := _read(run1)) and "exit" in r and r, 30, "run 1's exit record")
    rec2 = _read(run2) or {}
    if state != "STATE_COMPLETED" or "durable" not in rec1:
        raise RuntimeError(f"experiment {exp} ended {state}: {rec1} {rec2}\n{m.diagnose(exp)}")
    r1 = {k: float(v) - t_sent for k, v in rec1.items() if k not in ("job",)}
    return {
        "deliver": r1["signal"],  # scancel issued → handler in the entrypoint
        "notice": r1["noticed"] - r1["signal"],  # → next should_preempt()
        "save": r1["saved"] - r1["noticed"],  # torch.save inside store_path
        "finish": r1["durable"] - r1["saved"],  # fsync tree, rename, fsync dir, register
        "to_durable": r1["durable"],  # the goal's measure: signal → durable checkpoint
        "store_path": r1["durable"] - r1["noticed"],
        "to_exit": r1["exit"] - r1["durable"],  # core context closed, process about to exit
        "job_gone": marks["job_gone"] - t_sent,
        "master_ended": marks.get("master_ended", float("nan")) - t_sent,
        "resubmitted": marks["resubmitted"] - t_sent,
        "run2_start": float(rec2["start"]) - t_sent,
        "load": float(rec2["loaded"]) - float(rec2["load_start"]),
        "first_step": float(rec2["first_step"]) - t_sent,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per size (default 3, quick 1)")
    parser.add_argument("--sizes-mb", default=None, help="default 12,120,1200 (quick 12,120)")
    parser.add_argument("--poll-interval-s", type=float, default=5.0, help="the master's poll_interval_s")
    args = parser.parse_args()
    reps = args.reps or (1 if args.quick else 3)
    sizes = [int(s) for s in (args.sizes_mb or ("12,120" if args.quick else "12,120,1200")).split(",")]

    researcher = require_cluster()
    root = bench_root("preempt")
    out_dir = shared_dir(root, "out")
    context = root / "context"
    context.mkdir()
    (context / "ckpt.py").write_text(CKPT_SCRIPT)
    cluster_before = others_on_cluster()
    m, alice = start_master("preempt", researcher, args.poll_interval_s)
    ckpt_dir = m.root / "checkpoints"  # the same filesystem and directory the platform writes to
    results: dict[int, tuple[list[dict[str, float]], list[dict[str, float]]]] = {}
    try:
        for size_mb in sizes:
            state = build_state(size_mb, seed=size_mb)
            bares: list[dict[str, float]] = []
            plats: list[dict[str, float]] = []
            bare(state, ckpt_dir)  # warm-up
            for i in range(reps):
                bares.append(bare(state, ckpt_dir))
                plats.append(platform(m, alice, context, out_dir, size_mb))
                print(f"{size_mb} MB rep {i + 1}: bare {bares[-1]}\n  platform {plats[-1]}", flush=True)
            del state
            results[size_mb] = (bares, plats)
        cluster_after = others_on_cluster()
    finally:
        m.shutdown()
        shutil.rmtree(ckpt_dir, ignore_errors=True)  # up to a few GB of checkpoints
    text = report(results, args.poll_interval_s, cluster_before, cluster_after, args.quick)
    print(text)
    print(f"written to {write_result('preempt_resume', text)}")


def report(
    results: dict[int, tuple[list[dict[str, float]], list[dict[str, float]]]],
    poll_interval_s: float,
    before: str,
    after: str,
    quick: bool,
) -> str:
    def cell(xs: list[float]) -> str:
        return f"{median(xs):.2f} ({spread(xs)})"

    n = max(len(p) for _, p in results.values())
    lines = [
        "# Preemption → durable checkpoint → resume",
        "",
        f"`bench/preempt_resume.py{' --quick' if quick else ''}`: {n} run(s) per size; master "
        f"poll_interval_s={poll_interval_s:g}. Other people's jobs on the cluster: {before} before, {after} "
        "after. Seconds, median (min–max); platform times are from `scancel --batch --signal=USR1` on.",
        "",
        "## Signal → durable checkpoint vs bare `torch.save` + fsync",
        "",
    ]
    rows = []
    for size_mb, (bares, plats) in results.items():
        b = median([x["save_fsync"] for x in bares])
        d = median([x["to_durable"] for x in plats])
        goal = 1.2 * b + 0.5
        rows.append(
            [
                f"{size_mb} MB",
                cell([x["save_fsync"] for x in bares]),
                cell([x["to_durable"] for x in plats]),
                cell([x["store_path"] for x in plats]),
                f"{d / b:.2f}×",
                f"{goal:.2f}",
                "yes" if d <= goal else "**no**",
            ]
        )
    lines.append(
        table(
            [
                "checkpoint",
                "bare save+fsync",
                "platform signal → durable",
                "of which store_path (save+fsync+rename+register)",
                "ratio",
                "goal 1.2×bare+0.5",
                "met",
            ],
            rows,
        )
    )
    lines += ["", "## Where the time goes (platform, seconds after the signal was sent)", ""]
    stages = [
        ("signal delivered to the entrypoint's handler", "deliver"),
        ("→ noticed at the next `should_preempt()` (Δ)", "notice"),
        ("→ `torch.save` returned (Δ)", "save"),
        ("→ fsync + rename + register done (Δ)", "finish"),
        ("**durable checkpoint**", "to_durable"),
        ("→ Core API context closed, process exiting (Δ)", "to_exit"),
        ("job left squeue", "job_gone"),
        ("master recorded the run's end", "master_ended"),
        ("master's sbatch of the next run answered", "resubmitted"),
        ("next run's entrypoint first line", "run2_start"),
        ("`torch.load` in the next run (Δ)", "load"),
        ("**resumed: first step done**", "first_step"),
    ]
    header = ["stage", *[f"{s} MB" for s in results]]
    rows = [[label, *[cell([x[key] for x in p]) for _, p in results.values()]] for label, key in stages]
    rows.append(["bare `torch.load` (Δ)", *[cell([x["load"] for x in b]) for b, _ in results.values()]])
    lines.append(table(header, rows))
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
