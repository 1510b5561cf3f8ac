"""Issue 40's goal statistics for ``bench/hpo_efficiency.py`` (IQM, bootstrap intervals, Holm).

For each (problem, W) and each ``proposals=model`` method, against its random-proposal twin (the
same ``adaptive_asha`` mode with ``proposals: random``):

- target: the twin's final regret, IQM over seeds (the interquartile mean: the mean of the middle
  50 %); time to target: the first time the IQM-over-seeds regret curve reaches it (the twin's own
  curve ends exactly at it, so the twin always reaches it); speedup = twin's time / model's time,
  with a 90 % bootstrap interval (seeds resampled, the target recomputed each time);
- the same against random search (target: random search's final regret, IQM);
- final regret vs Optuna's default TPE (``optuna TPE``): IQM of each with a 95 % bootstrap interval,
  and a one-sided paired sign-flip permutation test of "ours is worse" on the mean paired
  difference, Holm-corrected over every (problem, W) cell of that method.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

RESAMPLES = 1000
PERMUTATIONS = 10_000


def iqm(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Interquartile mean along ``axis`` (the mean of the sorted middle half, fractional ends
    trimmed as in ``scipy.stats.trim_mean(x, 0.25)``, with whole elements)."""
    s = np.sort(x, axis=axis)
    n = s.shape[axis]
    cut = n // 4
    return np.take(s, range(cut, n - cut), axis=axis).mean(axis=axis)


def first_time(curve: np.ndarray, target: np.ndarray) -> np.ndarray:
    """First grid fraction (1/GRID … 1) where ``curve`` (… × GRID) ≤ ``target`` (…); inf: never."""
    hit = curve <= target[..., None] + 1e-12
    grid = curve.shape[-1]
    return np.where(hit.any(axis=-1), (hit.argmax(axis=-1) + 1) / grid, math.inf)


def speedup(
    base: np.ndarray, ours: np.ndarray, target_of: np.ndarray, rng: np.random.Generator
) -> tuple[float, float, float]:
    """(speedup, 5th, 95th percentile) of base's time / ours' time to reach IQM(target_of[:, -1]).
    Rows of the (seeds × GRID) grids are the same seeds; 0 where ours never reaches."""

    def ratio(idx: np.ndarray) -> np.ndarray:
        target = iqm(target_of[idx, -1], axis=-1)
        tb = first_time(iqm(base[idx], axis=-2), target)
        to = first_time(iqm(ours[idx], axis=-2), target)
        return np.where(np.isinf(to), 0.0, tb / to)

    n = len(base)
    point = float(ratio(np.arange(n)[None, :])[0])
    boot = ratio(rng.integers(0, n, size=(RESAMPLES, n)))
    lo, hi = np.percentile(boot, [5, 95])
    return point, float(lo), float(hi)


def iqm_ci(x: np.ndarray, rng: np.random.Generator) -> tuple[float, float, float]:
    idx = rng.integers(0, len(x), size=(RESAMPLES, len(x)))
    lo, hi = np.percentile(iqm(x[idx], axis=-1), [2.5, 97.5])
    return float(iqm(x)), float(lo), float(hi)


def p_worse(ours: np.ndarray, theirs: np.ndarray, rng: np.random.Generator) -> float:
    """One-sided paired sign-flip permutation p-value of mean(ours - theirs) > 0."""
    diff = ours - theirs
    observed = diff.mean()
    flips = rng.choice([-1.0, 1.0], size=(PERMUTATIONS, len(diff)))
    return float((1 + np.sum((flips * diff).mean(axis=1) >= observed - 1e-15)) / (PERMUTATIONS + 1))


def holm(ps: Sequence[float]) -> list[float]:
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out = [0.0] * len(ps)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


TWIN = {
    "adaptive_asha, pause, proposals=model": "adaptive_asha, promotion=pause",
    "adaptive_asha aggressive, pause, proposals=model": "adaptive_asha aggressive, pause",
}


def goals_table(
    cells: dict[tuple[str, int], dict[str, np.ndarray]], name_of: Callable[[str], str], max_workers: int
) -> str:
    """``cells[(problem key, W)][method]``: that method's (seeds × GRID) regret grid."""
    rng = np.random.default_rng(40)
    rows: list[dict[str, Any]] = []
    for (problem, workers), grids in cells.items():
        for model, twin in TWIN.items():
            if model not in grids or twin not in grids:
                continue
            row: dict[str, Any] = {"problem": name_of(problem), "W": workers, "method": model}
            row["vs_twin"] = speedup(grids[twin], grids[model], grids[twin], rng)
            row["vs_random"] = speedup(grids["random"], grids[model], grids["random"], rng)
            row["ours"] = iqm_ci(grids[model][:, -1], rng)
            if "optuna TPE" in grids:
                row["tpe"] = iqm_ci(grids["optuna TPE"][:, -1], rng)
                row["p"] = p_worse(grids[model][:, -1], grids["optuna TPE"][:, -1], rng)
            rows.append(row)
    for model in TWIN:
        mine = [r for r in rows if r["method"] == model and "p" in r]
        for r, adj in zip(mine, holm([r["p"] for r in mine]), strict=True):
            r["p_holm"] = adj
    lines = [
        "| problem | W | method | speedup vs random-proposal twin (90% CI) | speedup vs random search (90% CI) "
        "| final regret IQM (95% CI) | Optuna TPE IQM (95% CI) | p(ours worse), Holm |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def sp(t: tuple[float, float, float]) -> str:
        f = lambda x: "—" if x <= 0 else f"{x:.1f}×"  # noqa: E731
        return f"{f(t[0])} ({f(t[1])} … {f(t[2])})"

    def ci(t: tuple[float, float, float]) -> str:
        return f"{t[0]:.3f} ({t[1]:.3f} … {t[2]:.3f})"

    for r in rows:
        tpe = ci(r["tpe"]) if "tpe" in r else "n/a"
        p = f"{r['p_holm']:.3f}" + (" **worse**" if r["p_holm"] < 0.05 else "") if "p_holm" in r else "n/a"
        lines.append(
            f"| {r['problem']} | {r['W']} | {r['method']} | {sp(r['vs_twin'])} | {sp(r['vs_random'])} "
            f"| {ci(r['ours'])} | {tpe} | {p} |"
        )
    verdict = []
    for model in TWIN:
        for single in (False, True):
            mine = [r for r in rows if r["method"] == model and ("single-fidelity" in r["problem"]) == single]
            if not mine:
                continue
            fast = sum(r["vs_twin"][0] >= 1.5 for r in mine)
            worse = sum(r.get("p_holm", 1.0) < 0.05 for r in mine)
            top = [r for r in mine if r["W"] == max_workers]
            five = sum(r["vs_random"][0] >= 5.0 for r in top)
            if single:  # proposal quality, reported apart from the multi-fidelity goals
                verdict.append(
                    f"- {model}, single-fidelity (proposal quality): ≥ 1.5× its random-proposal twin on "
                    f"{fast}/{len(mine)} cells; significantly worse than Optuna TPE (Holm, 5%) on {worse}; "
                    f"≥ 5× random search at W={max_workers} on {five}/{len(top)}."
                )
                continue
            verdict.append(
                f"- {model}: ≥ 1.5× its random-proposal twin on {fast}/{len(mine)} multi-fidelity (problem, W) "
                f"cells (goal ≥ 2/3: {'met' if 3 * fast >= 2 * len(mine) else 'NOT met'}); significantly worse "
                f"than Optuna TPE (Holm, 5%) on {worse} (goal 0: {'met' if worse == 0 else 'NOT met'}); ≥ 5× "
                f"random search at W={max_workers} on {five}/{len(top)} problems (goal: all synthetic ones)."
            )
    return "\n".join(lines) + "\n\n" + "\n".join(verdict)
