"""How much faster does our ASHA find good hyperparameters than random search, and how does it
compare with Optuna's pruners, at equal budget?

Every method runs in the same event simulator (``searcher.simulate``) with W workers for the same
simulated wall time (budget = ``BUDGET_FULL_RUNS`` full-length trainings per worker), the same
reduction factor (3) and the same rung lengths (1, 3, 9, 27, 81 of 81 units). Starting a trial
costs 1 unit of time, resuming a paused one 2 (checkpoint restore and requeue).

Methods: our ``random``; our ``adaptive_asha`` (max_rungs 5, ``max_concurrent_trials`` = W) in
Determined's default ``mode: standard`` (brackets of 5, 4 and 3 rungs) and in ``mode: aggressive``
(one 5-rung bracket, plain ASHA), each with ``promotion: pause`` and ``promotion: continue``; Optuna ``SuccessiveHalvingPruner`` and
``HyperbandPruner`` (``RandomSampler``, driven through ask/tell by an adapter that speaks the
simulator's events, W trials in flight).

Measured: the normalised regret (0 = optimum, 1 = a random configuration's mean) of the incumbent,
the trial with the best *observed* full-length result, at 25/50/100% of the budget (1.0 before any
trial finishes), averaged over seeds; and the time at which the median-over-seeds regret first
reaches the target, the median regret random search reaches with the whole budget (so random's own
time is ≈ 1.0 × budget), and the speedup over random that this gives ("—": never reached). Nothing is timed on the host: all times are simulated.

Run: ``.venv/bin/python bench/hpo_efficiency.py [--quick] [--seeds N] [--workers 1,4,16]``.
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _curves import CurveProblem

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

    def __init__(self, pruner_name: str, space: Mapping[str, Any], workers: int, seed: int) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        pruner: optuna.pruners.BasePruner
        if pruner_name == "sh":
            pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=DIVISOR)
        else:
            pruner = optuna.pruners.HyperbandPruner(
                min_resource=1, max_resource=MAX_LENGTH, reduction_factor=DIVISOR
            )
        sampler = optuna.samplers.RandomSampler(seed=seed)
        self.study = optuna.create_study(direction="minimize", sampler=sampler, pruner=pruner)
        self.dists: dict[str, optuna.distributions.BaseDistribution] = {
            name: optuna.distributions.FloatDistribution(p["minval"], p["maxval"])
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
}


def make_problem(spec: tuple[str, dict[str, Any]], seed: int) -> Problem:
    kind, params = spec
    if kind == "hartmann":
        return HartmannProblem(seed)
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


def median_time_to(traces: list[list[tuple[float, float]]], target: float, budget: float) -> float:
    """First time at which the median (over seeds) regret reaches ``target``, on a 1/400 grid."""
    for i in range(1, 401):
        t = budget * i / 400
        if statistics.median(regret_at(trace, t) for trace in traces) <= target:
            return t
    return math.inf


def _fmt_time(x: float, budget: float) -> str:
    return "—" if math.isinf(x) else f"{x / budget:.2f}"


def report(results: list[Result]) -> str:
    lines = [
        "| problem | W | method | regret@25% | regret@50% | regret@100% | time to target (× budget) "
        "| speedup vs random | trials | pauses/resumes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, int], dict[str, list[Result]]] = {}
    for r in results:
        groups.setdefault((repr(r.job.problem), r.job.workers), {}).setdefault(r.job.method, []).append(r)
    for (_problem_key, workers), by_method in groups.items():
        randoms = by_method["random"]
        budget = randoms[0].budget_s
        target = statistics.median(regret_at(r.trace, budget) for r in randoms)
        t_random = median_time_to([r.trace for r in randoms], target, budget)
        name = make_problem(randoms[0].job.problem, 0).name
        for method in METHODS:
            rs = by_method.get(method, [])
            if not rs:
                continue
            regrets = [statistics.fmean(regret_at(r.trace, f * budget) for r in rs) for f in CHECKPOINTS]
            t = median_time_to([r.trace for r in rs], target, budget)
            speedup = "—" if math.isinf(t) or math.isinf(t_random) else f"{t_random / t:.1f}×"
            trials = statistics.fmean(r.trials for r in rs)
            pauses = (
                f"{statistics.fmean(r.pauses for r in rs):.0f}/{statistics.fmean(r.resumes for r in rs):.0f}"
            )
            lines.append(
                f"| {name} | {workers} | {method} | "
                + " | ".join(f"{x:.3f}" for x in regrets)
                + f" | {_fmt_time(t, budget)} | {speedup} | {trials:.0f} | {pauses} |"
            )
        lines.append(f"|  |  | target regret (random's median at 100%) = {target:.3f} |  |  |  |  |  |  |  |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="3 seeds, W=1 and 16, one problem (<30 s)")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--workers", default=None, help="comma-separated worker counts (default 1,4,16)")
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
    seeds = args.seeds or (3 if args.quick else 10)
    workers = (
        [int(w) for w in args.workers.split(",")] if args.workers else ([1, 16] if args.quick else [1, 4, 16])
    )
    if args.quick:
        problems = problems[:1]

    jobs = [Job(p, m, w, s) for p in problems for w in workers for m in METHODS for s in range(seeds)]
    start = time.monotonic()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(run, jobs, chunksize=1))
    print(
        f"Budget: {BUDGET_FULL_RUNS} full-length trainings per worker ({budget_s():.0f} simulated s); "
        f"max_length {MAX_LENGTH}, divisor {DIVISOR}, {seeds} seeds; host time {time.monotonic() - start:.0f} s\n"
    )
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
