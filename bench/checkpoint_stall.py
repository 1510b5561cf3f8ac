"""How long an asynchronous checkpoint stops training, next to a synchronous ``torch.save`` + fsync, in one run.

    .venv/bin/python bench/checkpoint_stall.py [--size-mb 1200] [--saves 6] [--duration-s 180] [--period-s 60]
        [--threads 1,2] [--pairs 10] [--dir DIR] [--out bench/results/checkpoint_stall.md]

The state is an MLP (6 square ``Linear`` layers) with Adam: parameters + ``exp_avg`` + ``exp_avg_sq`` are
``--size-mb`` (1.2 GB by default); a training step is one forward/backward/``step`` on a batch of 32. The
checkpoint is ``{"model": state_dict, "opt": state_dict}`` written by the harness's
``CheckpointContext.save_state`` into ``--dir`` (no master: registration is the only part left out).

1. **Stall**: ``save_state(asynchronous=True)`` after a step, timed until it returns (the staging copy), for
   saves 1..N; save 1 allocates the staging buffer and is reported apart, the median is over saves 2..N.
   Between saves the loop trains until the save is durable (the step times while a write is in flight are
   reported too). The baseline is ``torch.save`` of the same state into a file + fsync of it and its directory.
2. **Periodic overhead**, at each ``--threads``: the same loop for ``--duration-s`` without checkpoints, then
   the same number of steps with an asynchronous checkpoint every ``--period-s`` (the first at half a period),
   order alternated between thread counts. The staging buffer exists already (allocated once per job, in 1.).
3. **Preemption → durable**: ``--pairs`` pairs, order alternated, each run after ``sync`` and the removal of
   the previous run's files (a fixed pre-warm: page cache holds no dirty data of ours). Bare: ``torch.save`` +
   fsync. Platform: an asynchronous save is started, one training step runs (so it is stale), SIGUSR1 is sent
   to this process, the loop sees ``should_preempt()``, and ``save_state`` abandons the save in flight and
   writes the final one (fsync, rename). Reported: the median of the per-pair ratios.

Run it with nothing else busy (``nice`` does not protect memory bandwidth); it prints one line at the end:
``stall X s per checkpoint vs synchronous Y s; periodic overhead Z %``.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from harness import core
from harness.core import CheckpointContext, DummyDistributedContext, PreemptContext

LAYERS = 6
BATCH = 32
GRACE_TIME_S = 10  # GraceTime of det deploy local's preemptible partition


class Model:
    def __init__(self, size_mb: int) -> None:
        params = size_mb * 1e6 / 12  # fp32 parameters, exp_avg, exp_avg_sq
        self.width = max(64, int(math.sqrt(params / LAYERS)) // 64 * 64)
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(*[torch.nn.Linear(self.width, self.width) for _ in range(LAYERS)])
        self.opt = torch.optim.Adam(self.net.parameters(), lr=1e-5)
        self.x = torch.randn(BATCH, self.width)
        self.steps = 0
        self.step()

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=False)
        self.net(self.x).square().mean().backward()
        self.opt.step()
        self.steps += 1

    def state(self) -> dict[str, Any]:
        return {"model": self.net.state_dict(), "opt": self.opt.state_dict()}

    def nbytes(self) -> int:
        ts = list(self.net.state_dict().values())
        ts += [t for s in self.opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in ts)


def clean(root: Path) -> None:
    for p in root.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    os.sync()


def bare_save(m: Model, root: Path) -> float:
    t0 = time.perf_counter()
    path = root / "bare.pt"
    torch.save(m.state(), path)
    for p in (path, root):
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return time.perf_counter() - t0


def step_time(m: Model, n: int = 3) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        m.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_stall(m: Model, ckpt: CheckpointContext, root: Path, saves: int) -> dict[str, Any]:
    base_step = step_time(m)
    stalls, durable, inflight_steps = [], [], []
    for _ in range(saves):
        m.step()
        t0 = time.perf_counter()
        ckpt.save_state(m.state(), {"steps_completed": m.steps}, asynchronous=True)
        stalls.append(time.perf_counter() - t0)
        inflight = ckpt._inflight
        assert inflight is not None
        while not inflight.done:
            t1 = time.perf_counter()
            m.step()
            inflight_steps.append(time.perf_counter() - t1)
        ckpt.wait()
        durable.append(inflight.durable_s or 0.0)
        clean(root)
    sync = []
    for _ in range(3):
        sync.append(bare_save(m, root))
        clean(root)
    return {
        "first": stalls[0],
        "stalls": stalls[1:],
        "stall": statistics.median(stalls[1:]),
        "durable": statistics.median(durable[1:]),
        "sync": statistics.median(sync),
        "syncs": sync,
        "base_step": base_step,
        "inflight_step": statistics.median(inflight_steps) if inflight_steps else base_step,
        "inflight_steps": len(inflight_steps),
    }


def loop(
    m: Model,
    ckpt: CheckpointContext | None,
    root: Path,
    steps: int | None,
    duration_s: float,
    period_s: float,
) -> tuple[float, int, int]:
    """Train for ``steps`` (or ``duration_s``); checkpoint every ``period_s`` when ``ckpt`` is given."""
    t0 = time.perf_counter()
    n = saves = 0
    next_save = period_s / 2
    while (n < steps) if steps is not None else (time.perf_counter() - t0 < duration_s):
        m.step()
        n += 1
        if ckpt is not None and time.perf_counter() - t0 >= next_save:
            ckpt.save_state(m.state(), {"steps_completed": m.steps}, asynchronous=True)
            saves += 1
            next_save += period_s
    if ckpt is not None:
        ckpt.wait()
    elapsed = time.perf_counter() - t0
    clean(root)
    return elapsed, n, saves


def measure_periodic(
    m: Model, ckpt: CheckpointContext, root: Path, threads: list[int], duration_s: float, period_s: float
) -> list[dict[str, Any]]:
    out = []
    for i, k in enumerate(threads):
        torch.set_num_threads(k)
        step_time(m, 2)  # warm this thread count
        if i % 2 == 0:
            base, n, _ = loop(m, None, root, None, duration_s, period_s)
            with_ckpt, _, saves = loop(m, ckpt, root, n, duration_s, period_s)
        else:  # the other order: run with checkpoints first, for the same number of steps as the plain run
            n = max(1, round(duration_s / step_time(m, 3)))
            with_ckpt, _, saves = loop(m, ckpt, root, n, duration_s, period_s)
            base, _, _ = loop(m, None, root, n, duration_s, period_s)
        out.append(
            {
                "threads": k,
                "steps": n,
                "base": base,
                "ckpt": with_ckpt,
                "saves": saves,
                "overhead": (with_ckpt - base) / base * 100,
            }
        )
    return out


def platform_preempt(m: Model, root: Path) -> tuple[float, bool]:
    ckpt = CheckpointContext(DummyDistributedContext(), root)
    preempt = PreemptContext(None, "", DummyDistributedContext())
    with core.Context(checkpoint=ckpt, preempt=preempt) as ctx:
        ctx.checkpoint.save_state(m.state(), {"steps_completed": m.steps}, asynchronous=True)
        m.step()  # a step since: the save in flight is stale
        inflight = ctx.checkpoint._inflight
        in_flight = inflight is not None and not inflight.done
        t0 = time.perf_counter()
        os.kill(os.getpid(), signal.SIGUSR1)
        while not ctx.preempt.should_preempt():
            time.sleep(0.001)
        ctx.checkpoint.save_state(m.state(), {"steps_completed": m.steps})
        elapsed = time.perf_counter() - t0
        abandoned = in_flight and inflight is not None and inflight.abandoned
    return elapsed, abandoned


def measure_preempt(m: Model, root: Path, pairs: int) -> dict[str, Any]:
    rows = []
    for i in range(pairs):
        run: dict[str, Any] = {}
        for kind in ("bare", "platform") if i % 2 == 0 else ("platform", "bare"):
            clean(root)
            time.sleep(0.5)
            if kind == "bare":
                run["bare"] = bare_save(m, root)
            else:
                run["platform"], run["abandoned"] = platform_preempt(m, root)
        clean(root)
        rows.append(run)
    ratios = [r["platform"] / r["bare"] for r in rows]
    return {
        "rows": rows,
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "bare": statistics.median(r["bare"] for r in rows),
        "platform": statistics.median(r["platform"] for r in rows),
        "abandoned": sum(bool(r["abandoned"]) for r in rows),
    }


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}–{max(xs):.3f})"


def report(
    args: argparse.Namespace,
    m: Model,
    st: dict[str, Any],
    per: list[dict[str, Any]],
    pre: dict[str, Any],
    load: str,
) -> str:
    size_gb = m.nbytes() / 1e9
    worst = max(p["overhead"] for p in per)
    fits_gb = size_gb / pre["platform"] * GRACE_TIME_S
    lines = [
        "# Asynchronous checkpoints: training stall, periodic overhead, preemption",
        "",
        f"`bench/checkpoint_stall.py --size-mb {args.size_mb}`, {datetime.date.today()}: an MLP ({LAYERS} × "
        f"Linear({m.width}, {m.width})) with Adam, checkpoint state {size_gb:.2f} GB, files in `{args.dir}`; "
        f"torch {torch.__version__}, {os.cpu_count()} CPUs. Load while it ran: {load}.",
        "",
        "## Training stall per checkpoint",
        "",
        "| | seconds | target | met |",
        "|---|---|---|---|",
        f"| `save_state(asynchronous=True)` returns, saves 2..{args.saves}: median (min–max) | "
        f"{fmt(st['stalls'])} | ≤ 0.2 | {'yes' if st['stall'] <= 0.2 else 'no'} |",
        f"| save 1 (allocates the staging buffer, once per job) | {st['first']:.3f} | | |",
        f"| synchronous `torch.save` + fsync of the same state, 3 runs | {fmt(st['syncs'])} | | |",
        f"| asynchronous save: call → durable (background), median | {st['durable']:.3f} | | |",
        f"| training step alone / while a write is in flight (median of {st['inflight_steps']}) | "
        f"{st['base_step']:.3f} / {st['inflight_step']:.3f} | | |",
        "",
        f"Stall ratio: {st['stall'] / st['sync'] * 100:.1f} % of the synchronous save.",
        "",
        f"## A loop checkpointing every {args.period_s:.0f} s vs the same loop without checkpoints",
        "",
        "| torch threads | steps | without (s) | with (s) | checkpoints | overhead | target | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in per:
        lines.append(
            f"| {p['threads']} | {p['steps']} | {p['base']:.1f} | {p['ckpt']:.1f} | {p['saves']} | "
            f"{p['overhead']:.2f} % | ≤ 3.5 % | {'yes' if p['overhead'] <= 3.5 else 'no'} |"
        )
    lines += [
        "",
        "The staging buffer is allocated at a job's first asynchronous save (save 1 above) and reused after;",
        "the loops above start with it allocated.",
        "",
        f"## Preemption signal → durable checkpoint, {len(pre['rows'])} paired runs (order alternated)",
        "",
        "| pair | bare `torch.save` + fsync (s) | platform: signal → durable (s) | save in flight abandoned | ratio |",
        "|---|---|---|---|---|",
    ]
    for i, (r, ratio) in enumerate(zip(pre["rows"], pre["ratios"], strict=True)):
        lines.append(
            f"| {i + 1} | {r['bare']:.3f} | {r['platform']:.3f} | {'yes' if r['abandoned'] else 'no'} | "
            f"{ratio:.3f} |"
        )
    lines += [
        "",
        f"Median of the per-pair ratios: **{pre['ratio']:.3f}×** (target ≤ 1.1×: "
        f"{'met' if pre['ratio'] <= 1.1 else 'not met'}); medians {pre['bare']:.3f} s bare, "
        f"{pre['platform']:.3f} s platform.",
        "",
        f"Largest checkpoint that fits the default grace time ({GRACE_TIME_S} s, `det deploy local`'s "
        f"`GraceTime`) at this run's platform rate ({size_gb / pre['platform']:.2f} GB/s, a stale save in flight "
        f"abandoned first): about **{fits_gb:.1f} GB**; a time limit's default 300 s lead fits 30× that.",
        "",
        f"stall {st['stall']:.3f} s per checkpoint vs synchronous {st['sync']:.3f} s; periodic overhead "
        f"{worst:.2f} %",
    ]
    return "\n".join(lines) + "\n"


def loadavg() -> str:
    return "loadavg " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=1200)
    ap.add_argument("--saves", type=int, default=6)
    ap.add_argument("--duration-s", type=float, default=180.0)
    ap.add_argument("--period-s", type=float, default=60.0)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--dir", default=None, help="where checkpoints go (default: a temporary directory)")
    ap.add_argument("--out", default=None, help="write the results table here (markdown)")
    args = ap.parse_args()
    if args.saves < 2 or args.pairs < 1 or args.size_mb < 1:
        ap.error("--saves must be ≥ 2, --pairs ≥ 1, --size-mb ≥ 1")
    threads = [int(t) for t in args.threads.split(",")]
    root = Path(args.dir or tempfile.mkdtemp(prefix="ckpt-stall-"))
    root.mkdir(parents=True, exist_ok=True)
    args.dir = str(root)
    load_before = loadavg()
    torch.set_num_threads(threads[-1])
    m = Model(args.size_mb)
    print(f"state {m.nbytes() / 1e9:.2f} GB, width {m.width}", flush=True)
    ckpt = CheckpointContext(DummyDistributedContext(), root)
    st = measure_stall(m, ckpt, root, args.saves)
    print(f"stall {st}", flush=True)
    per = measure_periodic(m, ckpt, root, threads, args.duration_s, args.period_s)
    print(f"periodic {per}", flush=True)
    torch.set_num_threads(threads[-1])
    pre = measure_preempt(m, root, args.pairs)
    print(f"preempt ratio {pre['ratio']:.3f} {pre['ratios']}", flush=True)
    text = report(args, m, st, per, pre, f"{load_before} before, {loadavg()} after")
    if args.out:
        Path(args.out).write_text(text)
    if not args.dir or args.dir.startswith(tempfile.gettempdir()):
        shutil.rmtree(root, ignore_errors=True)
    print(text.splitlines()[-1])


if __name__ == "__main__":
    main()
