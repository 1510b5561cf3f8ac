"""The master's poll under slurmctld's per-user RPC rate limit (Slurm ≥ 23.02, ``rl_enable``), adaptive cadence
(`slurm_backend.cadence`) against the same poller held at its interval, in one run.

    .venv/bin/python bench/poll_rate_limit.py [--hours H] [--out FILE]

No cluster: the local cluster's Slurm 22.05 has no rate limit, so the poller runs against `FakeCluster` with
`RpcRateLimit` (slurmctld's token buckets, and its client's sleep 1, 2, 3 … s and ask again) on a fake clock,
as the master's loop drives it (a tick every 2 s, the shipped 5 s poll interval). The service account polls 8
running jobs; one ends every 97 s (a new one starts in its place). Per site limit, for each poller:

- **told to back off**: RPCs slurmctld answered SLURMCTLD_COMMUNICATIONS_BACKOFF per hour (each is a line
  "RPC rate limit exceeded by uid …" in slurmctld's log, what admins count);
- **squeue per hour** that got through;
- **job end seen after**: from a job's end to the poll that saw it, median and p95 (what the rate limit costs
  the researcher: the next trial starts that much later).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_backend.cli import SlurmCli  # noqa: E402
from slurm_backend.fake import FakeCluster  # noqa: E402
from slurm_backend.fake_ratelimit import RpcRateLimit  # noqa: E402
from slurm_backend.poller import Poller  # noqa: E402

SCRIPT = "#!/bin/bash\n#SBATCH --job-name=bench\n#SBATCH --output=/tmp/%j.log\nsleep 1\n"
SITES = {
    "Slurm's defaults (30, 2 a second)": (30, 2, 1.0),
    "a strict site (40, 4 a minute)": (40, 4, 60.0),
    "10, 1 every 10 s": (10, 1, 10.0),
    "40, 1 every 15 s": (40, 1, 15.0),
}
TICK_S, INTERVAL_S, JOBS, END_EVERY_S = 2.0, 5.0, 8, 97.0


@dataclass
class Row:
    told_per_h: float
    squeue_per_h: float
    seen_after_s: list[float]


def run(bucket: int, refill: int, period_s: float, *, adaptive: bool, hours: float) -> Row:
    uids = {"root": 0, "hpc-det": 998}
    cluster = FakeCluster(master_user="hpc-det", uid=lambda u: uids.get(u, 1001), slots=JOBS * 4)
    cluster.sleep = cluster.advance
    limit = RpcRateLimit(bucket_size=bucket, refill_rate=refill, refill_period_s=period_s)
    cluster.rate_limit = limit
    cli = SlurmCli(runner=cluster, sleep=cluster.advance)
    poller = Poller(cli, INTERVAL_S, max_backoff_s=60.0 if adaptive else INTERVAL_S, clock=cluster.monotonic)

    def submit() -> str:
        job = cluster(
            ["runuser", "-u", "alice", "--", "sbatch", "--parsable"], SCRIPT, 30.0, {}
        ).stdout.strip()
        cluster.start(job)
        return job

    live = [submit() for _ in range(JOBS)]
    ended: dict[str, float] = {}
    seen_after: list[float] = []
    next_end = END_EVERY_S
    warm_up = 600.0  # the bucket empties first
    baseline: tuple[int, int] | None = None  # (told, squeues) when the measurement starts
    end = warm_up + hours * 3600
    while cluster.monotonic() < end:
        now = cluster.monotonic()
        if now >= warm_up and baseline is None:
            baseline = (limit.told_to_back_off, cluster.count("squeue"))
        if now >= next_end:  # the job ended at next_end: the loop may have been waiting in squeue since
            job = live.pop(0)
            cluster.complete(job)
            ended[job] = next_end
            live.append(submit())
            next_end += END_EVERY_S
        poller.watch_all(live + list(ended))
        statuses = poller.poll()
        for job, at in list(ended.items()):
            status = statuses.get(job)
            if status is not None and status.is_terminal:
                if at >= warm_up:
                    seen_after.append(cluster.monotonic() - at)
                poller.unwatch(job)
                del ended[job]
        cluster.advance(TICK_S)
    assert baseline is not None
    told, squeues = limit.told_to_back_off - baseline[0], cluster.count("squeue") - baseline[1]
    return Row(told / hours, squeues / hours, seen_after)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=4.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    lines = [
        "| site limit (bucket, refill) | poller | told to back off / h | squeue / h | job end seen after, "
        "median / p95 (s) |",
        "|---|---|---|---|---|",
    ]
    ratios = []
    for name, (bucket, refill, period) in SITES.items():
        rows = {}
        for adaptive in (False, True):
            r = run(bucket, refill, period, adaptive=adaptive, hours=args.hours)
            rows[adaptive] = r
            seen = sorted(r.seen_after_s)
            p95 = seen[int(0.95 * (len(seen) - 1))] if seen else float("nan")
            lines.append(
                f"| {name} | {'adaptive' if adaptive else 'fixed 5 s (baseline)'} | {r.told_per_h:.0f} | "
                f"{r.squeue_per_h:.0f} | {statistics.median(seen):.1f} / {p95:.1f} |"
            )
        if rows[False].told_per_h:
            ratios.append((name, rows[True].told_per_h / rows[False].told_per_h))
    text = "\n".join(lines)
    print(text)
    for name, ratio in ratios:
        print(f"{name}: adaptive is told to back off {ratio:.2f}x as often as the fixed cadence")
    if args.out:
        args.out.write_text(f"# bench/poll_rate_limit.py\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
