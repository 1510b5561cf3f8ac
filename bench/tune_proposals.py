"""Screen ``proposals: model`` variants on *tuning* seeds (1000+, disjoint from the reported 0-29).

For each variant (module constants of ``searcher.proposals`` / ``searcher.tpe`` set in this
process) and each synthetic multi-fidelity (problem, W) cell, prints issue 40's goal statistic (the
time-to-target speedup vs the random-proposal twin, ``bench/_hpo_goals.speedup``) and the IQM
regret at 25/50/100 % of the budget. Model cells are cached in ``bench/results/hpo_tune_cells/``
(not in git), keyed by the variant's name; the twins' in ``bench/results/hpo_cells/``.

Run: ``nice -n 19 python bench/tune_proposals.py VARIANT [standard,aggressive] [FIRST:COUNT]``
(default ``standard 1000:15``). What was run and found: ``bench/results/hpo_model_proposals.md``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import hpo_efficiency as H
from _hpo_goals import iqm, speedup

from searcher import proposals, tpe

_OLD = {  # the model before the BOHB-style settings (commit 257dd05)
    "proposals.RANDOM_FRACTION": 0.1,
    "proposals.MIN_RESULTS_EXTRA": 2,
    "tpe.SAMPLE_BANDWIDTH_FACTOR": 1.0,
    "tpe.N_CANDIDATES": 24,
}
_BOHB = {
    "proposals.RANDOM_FRACTION": 1 / 3,
    "proposals.MIN_RESULTS_EXTRA": 1,
    "tpe.SAMPLE_BANDWIDTH_FACTOR": 3.0,
    "tpe.N_CANDIDATES": 64,
}
VARIANTS: dict[str, dict[str, Any]] = {
    "base": _OLD,
    "bohb": _BOHB,
    "bohb_c24": {**_BOHB, "tpe.N_CANDIDATES": 24},
    "bohb_r20": {**_BOHB, "proposals.RANDOM_FRACTION": 0.2},
    "bohb_min2": {**_BOHB, "proposals.MIN_RESULTS_EXTRA": 2},
    "r0": {**_OLD, "proposals.RANDOM_FRACTION": 0.0},
    "r33": {**_OLD, "proposals.RANDOM_FRACTION": 1 / 3},
    "c64": {**_OLD, "tpe.N_CANDIDATES": 64},
    "bw3": {**_OLD, "tpe.SAMPLE_BANDWIDTH_FACTOR": 3.0},
    "min1": {**_OLD, "proposals.MIN_RESULTS_EXTRA": 1},
    # Measured with knobs that commit 'tpe/proposals: knobs for the BOHB-style tuning' had and the
    # chosen model dropped: "indep" (tpe.MULTIVARIATE False), "bohb_good" (tpe.GOOD_MIN_D1 True:
    # BOHB's max(d + 1, 15 %) good points), "bohb_full" (that plus 2(d + 1) results to fit).
}
PROBLEMS = [
    ("curves", {"rank_correlation": 0.8, "noise": 0.05}),
    ("curves", {"rank_correlation": 0.5, "noise": 0.1}),
    ("hartmann", {}),
]
MODES = {
    "standard": ("adaptive_asha, pause, proposals=model", "adaptive_asha, promotion=pause"),
    "aggressive": ("adaptive_asha aggressive, pause, proposals=model", "adaptive_asha aggressive, pause"),
}
OUT = Path(__file__).resolve().parent / "results" / "hpo_tune_cells"


def apply(variant: str) -> None:
    for key, val in VARIANTS[variant].items():
        mod, name = key.split(".")
        setattr({"proposals": proposals, "tpe": tpe}[mod], name, val)


def grid_of(job: H.Job, variant: str) -> npt.NDArray[np.float64]:
    parts = [job.problem, job.method, job.workers, job.seed, variant]
    key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]
    path = OUT / f"{key}.json"
    if path.exists():
        return np.array(json.loads(path.read_text()))
    result = H.run(job)
    grid = H.regret_grid(result.trace, result.budget_s)
    OUT.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(grid.tolist()))
    return grid


def twin_grid(job: H.Job) -> npt.NDArray[np.float64]:
    result = H.run_cached(job)
    return H.regret_grid(result.trace, result.budget_s)


def main() -> None:
    variant = sys.argv[1]
    modes = sys.argv[2].split(",") if len(sys.argv) > 2 else ["standard"]
    first, count = (sys.argv[3] if len(sys.argv) > 3 else "1000:15").split(":")
    seeds = range(int(first), int(first) + int(count))
    assert seeds.start >= 1000, "tuning seeds only: 0-29 are the reported ones"
    apply(variant)
    rng = np.random.default_rng(40)
    start = time.process_time()
    rows, fast, cells = [], 0, 0
    for mode in modes:
        model, twin = MODES[mode]
        for problem in PROBLEMS:
            for workers in (1, 4, 16):
                gm = np.stack([grid_of(H.Job(problem, model, workers, s), variant) for s in seeds])
                gt = np.stack([twin_grid(H.Job(problem, twin, workers, s)) for s in seeds])
                sp = speedup(gt, gm, gt, rng)[0]
                cells += 1
                fast += sp >= 1.5
                at = [int(f * H.GRID) - 1 for f in (0.25, 0.5, 1.0)]
                ours = "/".join(f"{float(iqm(gm[:, i])):.3f}" for i in at)
                theirs = "/".join(f"{float(iqm(gt[:, i])):.3f}" for i in at)
                name = f"{problem[0][:5]}{problem[1].get('rank_correlation', '')}"
                rows.append(
                    f"{mode[:3]} {name} W={workers:2d}: {sp:4.2f}x  iqm25/50/100 {ours}  twin {theirs}"
                )
    print(f"== {variant} seeds {seeds.start}-{seeds.stop - 1}: {fast}/{cells} cells >= 1.5x")
    print(f"   ({time.process_time() - start:.0f} s)")
    print("\n".join(rows), flush=True)


if __name__ == "__main__":
    main()
