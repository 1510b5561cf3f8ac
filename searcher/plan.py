"""Describe what a searcher config will do, for ``det preview``: brackets, rung lengths in the
user's unit, trials per rung, concurrency, and a short simulated run on synthetic curves.

``plan_search(...)`` returns plain data; ``format_plan(plan)`` renders it as text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from searcher import hparams
from searcher.adaptive_asha import brackets_for
from searcher.asha import default_max_concurrent, rung_lengths
from searcher.base import SearchMethod
from searcher.config import SearcherConfig, parse_searcher_config
from searcher.random_search import initial_trial_count
from searcher.simulate import SimConfig, SyntheticCurves, simulate


@dataclass(frozen=True)
class BracketPlan:
    num_rungs: int
    max_trials: int
    max_concurrent_trials: int
    rung_lengths: tuple[int, ...]
    trials_per_rung: tuple[int, ...]
    """How many trials reach each rung if every rung promotes its best ``1/divisor``."""


@dataclass(frozen=True)
class SimulatedRun:
    workers: int
    trials_created: int
    trials_paused: int
    trials_resumed: int
    units_trained: int
    units_without_early_stopping: int
    makespan_units: float
    """Wall time of the simulated search, in units of one unit of training on an average trial."""


@dataclass(frozen=True)
class SearchPlan:
    method: str
    metric: str
    smaller_is_better: bool
    unit: str
    max_length: int | None
    max_trials: int
    max_concurrent_trials: int
    promotion: str | None
    brackets: tuple[BracketPlan, ...]
    simulated: SimulatedRun | None


def _trials_per_rung(max_trials: int, divisor: float, num_rungs: int) -> tuple[int, ...]:
    return tuple(max(int(max_trials / divisor**i), 1) for i in range(num_rungs))


def _brackets(config: SearcherConfig, space: hparams.Space) -> tuple[BracketPlan, ...]:
    length = config.max_length
    if config.name in ("single", "random", "grid"):
        trials = hparams.grid_size(space) if config.name == "grid" else config.max_trials
        rungs = (length,) if length is not None else ()
        conc = initial_trial_count(trials, config.max_concurrent_trials)
        return (BracketPlan(1, trials, conc, rungs, (trials,)),)
    assert length is not None
    if config.name == "async_halving":
        conc = default_max_concurrent(
            config.max_trials, config.max_concurrent_trials, config.divisor, config.num_rungs
        )
        lengths = tuple(rung_lengths(length, config.divisor, config.num_rungs))
        per_rung = _trials_per_rung(config.max_trials, config.divisor, config.num_rungs)
        return (BracketPlan(config.num_rungs, config.max_trials, conc, lengths, per_rung),)
    return tuple(
        BracketPlan(
            b.num_rungs,
            b.max_trials,
            min(b.max_concurrent_trials, b.max_trials),
            tuple(rung_lengths(length, config.divisor, b.num_rungs)),
            _trials_per_rung(b.max_trials, config.divisor, b.num_rungs),
        )
        for b in brackets_for(config)
    )


def plan_search(
    searcher_cfg: Mapping[str, Any],
    hyperparameters: Mapping[str, Any],
    seed: int = 0,
    workers: int | None = None,
    simulate_run: bool = True,
) -> SearchPlan:
    """``workers``: slots for the simulated run (default: the search's own concurrency)."""
    from searcher import make_algorithm

    config = parse_searcher_config(searcher_cfg)
    space = hparams.parse_space(hyperparameters)
    brackets = _brackets(config, space)
    simulated = None
    if simulate_run and config.max_length is not None:
        method = SearchMethod(config, space, make_algorithm(config, space), seed)
        w = workers or max(1, sum(b.max_concurrent_trials for b in brackets))
        curves = SyntheticCurves(horizon=config.max_length, seed=seed)
        summary = simulate(method, curves, SimConfig(workers=w, seed=seed, final_length=config.max_length))
        simulated = SimulatedRun(
            workers=w,
            trials_created=summary.trials_created,
            trials_paused=summary.trials_paused,
            trials_resumed=summary.trials_resumed,
            units_trained=summary.units_trained,
            units_without_early_stopping=summary.trials_created * config.max_length,
            makespan_units=summary.makespan_s,
        )
    return SearchPlan(
        method=config.name,
        metric=config.metric,
        smaller_is_better=config.smaller_is_better,
        unit=config.unit,
        max_length=config.max_length,
        max_trials=sum(b.max_trials for b in brackets),
        max_concurrent_trials=sum(b.max_concurrent_trials for b in brackets),
        promotion=config.promotion if config.name in ("async_halving", "adaptive_asha") else None,
        brackets=brackets,
        simulated=simulated,
    )


def format_plan(plan: SearchPlan) -> str:
    goal = "minimise" if plan.smaller_is_better else "maximise"
    length = (
        f"{plan.max_length} {plan.unit}" if plan.max_length is not None else "until the trial's code ends"
    )
    lines = [
        f"Search method: {plan.method} ({goal} {plan.metric or 'the searcher metric'})",
        f"Trials: up to {plan.max_trials}, at most {plan.max_concurrent_trials} at a time; max length {length}",
    ]
    if plan.promotion == "pause":
        lines.append("Promotion: pause (unpromoted trials are paused and may be resumed from a checkpoint)")
    elif plan.promotion == "continue":
        lines.append("Promotion: continue (a trial goes on at once or is stopped for good)")
    for i, b in enumerate(plan.brackets):
        if plan.method in ("async_halving", "adaptive_asha"):
            lines.append(
                f"Bracket {i + 1}: {b.num_rungs} rungs, {b.max_trials} trials, {b.max_concurrent_trials} at a time"
            )
            for r, (units, trials) in enumerate(zip(b.rung_lengths, b.trials_per_rung, strict=True)):
                lines.append(f"  rung {r + 1}: train to {units} {plan.unit}, ~{trials} trials")
    sim = plan.simulated
    if sim is not None:
        saved = 1 - sim.units_trained / max(1, sim.units_without_early_stopping)
        lines += [
            f"Simulated run on synthetic curves with {sim.workers} workers:",
            f"  {sim.trials_created} trials, {sim.trials_paused} pauses, {sim.trials_resumed} resumes",
            f"  {sim.units_trained} {plan.unit} trained ({saved:.0%} less than training every trial fully)",
            f"  wall time ≈ that of training one average trial for {sim.makespan_units:.0f} {plan.unit}",
        ]
    return "\n".join(lines)
