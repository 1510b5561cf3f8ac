"""Running one benchmark in this tree and in a ``git worktree`` of a base revision, alternately, and reporting
the ratios (``stored_config_reads``, ``typed_responses``).

Each round runs the benchmark script's ``--inner DB`` in a fresh process and a fresh database, once in the base
tree and once here, back to back; the report gives each measurement's median over the rounds in both trees
and the median of the rounds' ratios (this tree / base) with their range.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Report:
    """What the results file says: its title (when new), and each run's heading and column names."""

    title: str
    base_name: str
    head_name: str
    unit: str
    what: str = "operation"


def run_tree(script: Path, tree: Path) -> dict[str, float]:
    """`script --inner DB` in `tree`'s Python path, with a private home and master directories."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(tree), "HOME": tmp, "DET_MASTER_DATA_DIR": f"{tmp}/data",
               "DET_MASTER_STATE_DIR": f"{tmp}/state", "DET_CHECKPOINT_ROOT": f"{tmp}/checkpoints",
               "DET_JOB_STORAGE_ROOT": f"{tmp}/jobs"}  # fmt: skip
        got = subprocess.run(
            [sys.executable, str(script), "--inner", str(Path(tmp) / "master.db")],
            cwd=tree, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
    return dict(json.loads(got.stdout.strip().splitlines()[-1]))


def compare(script: Path, base: str, rounds: int, out: Path, report: Report) -> str:
    """Run `script` `rounds` times in each tree, append the table to `out`, and return it."""
    base_tree = Path(tempfile.mkdtemp(prefix="bench-base-"))
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(base_tree), base], cwd=REPO, check=True)
    try:
        runs: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
        for _ in range(rounds):
            runs["base"].append(run_tree(script, base_tree))
            runs["head"].append(run_tree(script, REPO))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=REPO, check=True)
    head_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
    lines = [
        f"\n## {datetime.date.today()}: {head_rev} ({report.head_name}) against {base} ({report.base_name}), "
        f"median of {rounds} rounds, {report.unit} per {report.what}\n",
        f"| {report.what} | {report.base_name} | {report.head_name} | ratio: median of the rounds' (range) |",
        "|---|---:|---:|---:|",
    ]
    for name in runs["base"][0]:
        base_v = statistics.median(r[name] for r in runs["base"])
        head_v = statistics.median(r[name] for r in runs["head"])
        ratios = sorted(h[name] / b[name] for b, h in zip(runs["base"], runs["head"], strict=True))
        base_s, head_s = (f"{v:,.1f}" if v < 100 else f"{v:,.0f}" for v in (base_v, head_v))
        ratio = statistics.median(ratios)
        lines.append(f"| {name} | {base_s} | {head_s} | {ratio:.2f}× ({ratios[0]:.2f}–{ratios[-1]:.2f}) |")
    text = "\n".join(lines) + "\n"
    if not out.exists():
        out.write_text(report.title)
    with out.open("a") as f:
        f.write(text)
    return text


def main(
    script: str, inner: Callable[[Path], dict[str, float]], base: str, rounds: int, report: Report
) -> None:
    """A benchmark's command line: ``[--base REV] [--rounds N] [--out FILE]`` (default
    ``bench/results/<script>.md``); ``--inner DB`` runs `inner` (in whichever tree's Python path)."""
    path = Path(script).resolve()
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default=base)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / f"{path.stem}.md")
    ap.add_argument("--inner", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        print(json.dumps(inner(args.inner)))
        return
    print(compare(path, args.base, args.rounds, args.out, report))
