"""Step time of 2-node torch DDP under the platform's launcher, next to bare ``srun torchrun``, in one job.

    .venv/bin/python bench/ddp_overhead.py [--quick] [--user researcher] [--rounds N] [--steps N]

Run as root on the local cluster (``det deploy local up``); the job is submitted as a non-root account with
``runuser`` (``--user``, default ``$DET_TEST_USER`` or ``researcher``). One ``sbatch -N 2`` job (2 GPU slots per
node) runs the same DDP script (gloo, a small MLP, ``torch.set_num_threads(1)``) several times, alternating:

- **launcher**: ``python -m launchers.torch_distributed python ddp_step.py`` from the batch script (what a
  trial runs: one ``srun`` task per node, each a ``torchrun`` whose ranks run under ``launchers.wrap_rank``);
- **bare**: ``srun --nodes=2 --ntasks-per-node=1 torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d
  --rdzv-endpoint FIRST_NODE:PORT ddp_step.py``.

Rank 0 times every step after a warm-up (forward, backward with DDP's allreduce, optimizer step). The table
gives, per variant, the median over rounds of each run's median step time, the p90 and the wall time of a
whole run (start-up included); the ratio is launcher / bare (goal: at most 1.02). The order of the two
variants flips every round, so drift on a shared machine hits both.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORK_ROOT = Path(os.environ.get("DET_BENCH_DIR", "/var/tmp/hpc-det-bench"))

STEP_SCRIPT = textwrap.dedent(
    """
    import argparse, json, os, time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DDP(torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    ))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
    times = []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    dist.barrier()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"step_s": times, "world": dist.get_world_size(), "host": os.uname().nodename}, f)
    dist.destroy_process_group()
    """
)


def job_script(work: Path, python: str, rounds: int, steps: int, partition: str) -> str:
    torchrun = str(Path(python).with_name("torchrun"))
    return textwrap.dedent(
        f"""\
        #!/bin/bash
        #SBATCH --job-name=bench-ddp-overhead
        #SBATCH --nodes=2
        #SBATCH --ntasks-per-node=1
        #SBATCH --gres=gpu:2
        #SBATCH --partition={partition}
        #SBATCH --time=30
        #SBATCH --output={work}/job.out
        #SBATCH --no-requeue
        set -u
        cd {work}
        export PYTHONPATH={REPO}
        first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
        chief=$(getent ahostsv4 "$first" | awk 'NR==1 {{print $1}}')
        base=$(( 20000 + SLURM_JOB_ID % 2000 * 10 ))
        for r in $(seq 1 {rounds}); do
          if [ $(( r % 2 )) -eq 1 ]; then order="launcher bare"; else order="bare launcher"; fi
          for v in $order; do
            t0=$(date +%s.%N)
            if [ "$v" = launcher ]; then
              DET_UNIQUE_PORT_OFFSET=$(( base - 29400 + r * 2 )) \\
                {python} -m launchers.torch_distributed {python} ddp_step.py --steps {steps} --out res-$v-$r.json
            else
              srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 {torchrun} --nnodes 2 --nproc-per-node 2 \\
                --rdzv-backend c10d --rdzv-endpoint "$chief:$(( base + r * 2 + 1 ))" --max-restarts 0 \\
                ddp_step.py --steps {steps} --out res-$v-$r.json
            fi
            rc=$?
            echo "WALL $v $r $rc $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN {{print a - b}}')"
          done
        done
        """
    )


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(work: Path, rounds: int) -> dict[str, dict[str, Any]]:
    walls: dict[str, list[float]] = {"launcher": [], "bare": []}
    for line in (work / "job.out").read_text().splitlines():
        if line.startswith("WALL "):
            _, v, _r, rc, wall = line.split()
            if rc != "0":
                raise SystemExit(f"the {v} run of round {_r} failed (exit code {rc}); see {work}/job.out")
            walls[v].append(float(wall))
    out: dict[str, dict[str, Any]] = {}
    for v in ("launcher", "bare"):
        medians, p90s, hosts = [], [], set()
        for r in range(1, rounds + 1):
            data = json.loads((work / f"res-{v}-{r}.json").read_text())
            assert data["world"] == 4, data
            hosts.add(data["host"])
            medians.append(statistics.median(data["step_s"]))
            p90s.append(_p(data["step_s"], 0.9))
        out[v] = {
            "median_step_ms": 1000 * statistics.median(medians),
            "p90_step_ms": 1000 * statistics.median(p90s),
            "run_medians_ms": [round(1000 * m, 3) for m in medians],
            "wall_s": statistics.median(walls[v]),
            "walls_s": [round(w, 1) for w in walls[v]],
        }
    return out


def table(result: dict[str, dict[str, Any]], rounds: int, steps: int) -> str:
    ours, bare = result["launcher"], result["bare"]
    ratio = ours["median_step_ms"] / bare["median_step_ms"]
    rows = [
        f"2 nodes x 2 ranks, gloo DDP, {rounds} round(s) x {steps} timed steps per variant "
        "(median of per-run medians)",
        "",
        "| variant | median step (ms) | p90 step (ms) | per-run medians (ms) | wall per run, median (s) | walls (s) |",
        "|---|---|---|---|---|---|",
    ]
    for name, label in (("bare", "bare `srun torchrun`"), ("launcher", "launchers.torch_distributed")):
        r = result[name]
        rows.append(
            f"| {label} | {r['median_step_ms']:.3f} | {r['p90_step_ms']:.3f} | "
            f"{', '.join(str(m) for m in r['run_medians_ms'])} | {r['wall_s']:.1f} | "
            f"{', '.join(str(w) for w in r['walls_s'])} |"
        )
    rows += ["", f"**ratio launcher / bare (median step): {ratio:.3f}** (goal <= 1.02)"]
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 100 steps")
    parser.add_argument("--user", default=os.environ.get("DET_TEST_USER", "researcher"))
    parser.add_argument("--partition", default="batch")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 4)
    steps = args.steps or (100 if args.quick else 300)
    if os.geteuid() != 0:
        raise SystemExit("run as root: the job is submitted as --user with runuser")
    pw = pwd.getpwnam(args.user)
    python = str(REPO / ".venv" / "bin" / "python")

    WORK_ROOT.mkdir(parents=True, exist_ok=True)
    WORK_ROOT.chmod(0o1777)
    work = WORK_ROOT / f"ddp-{uuid.uuid4().hex[:10]}"
    work.mkdir()
    (work / "ddp_step.py").write_text(STEP_SCRIPT)
    (work / "job.sh").write_text(job_script(work, python, rounds, steps, args.partition))
    for p in (work, work / "ddp_step.py", work / "job.sh"):
        os.chown(p, pw.pw_uid, pw.pw_gid)

    submit = ["runuser", "-u", args.user, "--", "sbatch", "--parsable", str(work / "job.sh")]
    job_id = subprocess.run(submit, capture_output=True, text=True, check=True, cwd="/").stdout.strip()
    print(f"submitted job {job_id} as {args.user}; work dir {work}", file=sys.stderr)
    deadline = time.monotonic() + args.timeout_s
    try:
        while True:
            state = subprocess.run(
                ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, check=False
            ).stdout.strip()
            if not state:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"job {job_id} still {state} after {args.timeout_s:.0f} s")
            time.sleep(2)
    finally:
        subprocess.run(["scancel", job_id], check=False, capture_output=True)
    result = summarize(work, rounds)
    print(table(result, rounds, steps))
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "steps": steps, **result}, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
