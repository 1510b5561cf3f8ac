"""Property-based invariants of every search method, run through the simulator."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searcher import (
    Action,
    Create,
    ExitedReason,
    Pause,
    Resume,
    SearchMethod,
    Shutdown,
    Stop,
    ValidateAfter,
    action_from_dict,
    action_to_dict,
    make_search_method,
)
from searcher.adaptive_asha import AdaptiveASHA, brackets_for
from searcher.asha import AsyncHalving, default_max_concurrent, rung_lengths
from searcher.config import parse_searcher_config
from searcher.hparams import grid, grid_point, grid_size, grid_values, parse_space, sample
from searcher.simulate import SimConfig, SimulationError, Summary, SyntheticCurves, simulate

SPACE = {
    "lr": {"type": "log", "minval": -5, "maxval": -1, "base": 10, "count": 3},
    "layers": {"type": "int", "minval": 1, "maxval": 8, "count": 2},
    "opt": {"type": "categorical", "vals": ["sgd", "adam"]},
    "head": {"dropout": {"type": "double", "minval": 0.0, "maxval": 0.5, "count": 2}, "width": 64},
    "global_batch_size": 32,
}
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def searcher_configs(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(st.sampled_from(["random", "grid", "async_halving", "adaptive_asha", "single"]))
    divisor = draw(st.sampled_from([2, 3, 4]))
    num_rungs = draw(st.integers(1, 4))
    cfg: dict[str, Any] = {
        "name": name,
        "metric": "loss",
        "smaller_is_better": draw(st.booleans()),
        "max_trials": draw(st.integers(1, 40)),
        "max_concurrent_trials": draw(st.integers(0, 8)),
        "divisor": divisor,
    }
    length = draw(st.integers(divisor ** (num_rungs - 1), 3000))
    if draw(st.booleans()):
        cfg["max_length"] = {draw(st.sampled_from(["batches", "records", "epochs"])): length}
    else:
        cfg["time_metric"], cfg["max_time"] = "batches", length
    if name == "async_halving":
        cfg["num_rungs"] = num_rungs
    if name in ("async_halving", "adaptive_asha"):
        cfg["promotion"] = draw(st.sampled_from(["pause", "continue"]))
        proposals = draw(st.sampled_from([None, "random", "model"]))
        if proposals is not None:
            cfg["proposals"] = proposals
    if name == "adaptive_asha":
        cfg["mode"] = draw(st.sampled_from(["aggressive", "standard", "conservative"]))
        cfg["max_rungs"] = draw(st.integers(1, 5))
    return cfg


sim_configs = st.builds(
    SimConfig,
    workers=st.integers(1, 8),
    resume_overhead_s=st.floats(0, 5),
    error_rate=st.sampled_from([0.0, 0.0, 0.1, 0.3]),
    invalid_hp_rate=st.sampled_from([0.0, 0.0, 0.1]),
    seed=st.integers(0, 2**16),
)


class Recording:
    """Passes events through to a method and keeps every action it returns."""

    def __init__(self, method: SearchMethod) -> None:
        self.method = method
        self.actions: list[Action] = []
        self.progress: list[float] = []

    def __getattr__(self, name: str) -> Callable[..., list[Action]]:
        def call(*args: Any) -> list[Action]:
            out: list[Action] = getattr(self.method, name)(*args)
            self.actions += out
            self.progress.append(self.method.progress())
            return out

        return call


class Forking:
    """At the k-th event, snapshots the method through JSON into a fresh one; from then on both get
    every event and must answer identically."""

    def __init__(self, make: Callable[[], SearchMethod], k: int) -> None:
        self.make, self.k, self.n = make, k, 0
        self.a = make()
        self.b: SearchMethod | None = None

    def __getattr__(self, name: str) -> Callable[..., list[Action]]:
        def call(*args: Any) -> list[Action]:
            if self.n == self.k:
                snap = json.loads(json.dumps(self.a.snapshot(), allow_nan=False))
                self.b = self.make()
                self.b.restore(snap)
            self.n += 1
            out: list[Action] = getattr(self.a, name)(*args)
            if self.b is not None:
                assert getattr(self.b, name)(*args) == out
                assert self.b.progress() == self.a.progress()
            return out

        return call


def workload(cfg: dict[str, Any], sim: SimConfig) -> SyntheticCurves:
    return SyntheticCurves(horizon=3000, seed=sim.seed, runtime_spread=0.7)


def concurrency_bound(cfg: dict[str, Any]) -> int:
    c = parse_searcher_config(cfg)
    if c.name == "single":
        return 1
    if c.name in ("random", "grid"):
        trials = c.max_trials if c.name == "random" else grid_size(parse_space(SPACE))
        return min(trials, c.max_concurrent_trials) if c.max_concurrent_trials else trials
    if c.name == "async_halving":
        return default_max_concurrent(c.max_trials, c.max_concurrent_trials, c.divisor, c.num_rungs)
    return sum(min(b.max_concurrent_trials, b.max_trials) for b in brackets_for(c))


@FAST
@given(searcher_configs(), sim_configs, st.integers(0, 2**31 - 1))
def test_every_search_terminates_within_its_limits(cfg: dict[str, Any], sim: SimConfig, seed: int) -> None:
    rec = Recording(make_search_method(cfg, SPACE, seed))
    summary = simulate(rec, workload(cfg, sim), sim)
    c = parse_searcher_config(cfg)

    assert summary.shutdown is not None and rec.actions[-1] == summary.shutdown
    assert sum(isinstance(a, Shutdown) for a in rec.actions) == 1
    assert summary.trials_created == summary.trials_closed  # every trial ends
    valid = summary.trials_created - summary.trials_invalid
    if c.name == "grid":
        assert summary.trials_created == grid_size(parse_space(SPACE))
    else:
        assert valid <= c.max_trials
    assert summary.max_active_trials <= concurrency_bound(cfg)
    if c.max_concurrent_trials and c.name == "adaptive_asha":
        assert summary.max_active_trials <= max(c.max_concurrent_trials, len(brackets_for(c)))
    elif c.max_concurrent_trials:
        assert summary.max_active_trials <= c.max_concurrent_trials
    assert all(0.0 <= p <= 1.0 for p in rec.progress) and rec.progress[-1] == 1.0
    if c.promotion == "continue" or c.name not in ("async_halving", "adaptive_asha"):
        assert summary.trials_paused == summary.trials_resumed == 0

    assert c.max_length is not None
    lengths = {a.length for a in rec.actions if isinstance(a, ValidateAfter)}
    if c.name == "async_halving":
        assert lengths <= set(rung_lengths(c.max_length, c.divisor, c.num_rungs))
    elif c.name == "adaptive_asha":
        allowed = {n for b in brackets_for(c) for n in rung_lengths(c.max_length, c.divisor, b.num_rungs)}
        assert lengths <= allowed
    else:
        assert lengths <= {c.max_length}


@FAST
@given(searcher_configs(), sim_configs, st.integers(0, 2**31 - 1), st.integers(0, 400))
def test_snapshot_restore_at_any_point_gives_identical_actions(
    cfg: dict[str, Any], sim: SimConfig, seed: int, k: int
) -> None:
    fork = Forking(lambda: make_search_method(cfg, SPACE, seed), k)
    simulate(fork, workload(cfg, sim), sim)  # type: ignore[arg-type]


@FAST
@given(searcher_configs(), st.integers(0, 2**31 - 1))
def test_same_seed_same_search(cfg: dict[str, Any], seed: int) -> None:
    sim = SimConfig(workers=3, seed=1)
    runs = [Recording(make_search_method(cfg, SPACE, seed)) for _ in range(2)]
    for rec in runs:
        simulate(rec, workload(cfg, sim), sim)
    assert runs[0].actions == runs[1].actions


@st.composite
def grid_spaces(draw: st.DrawFn) -> dict[str, Any]:
    def leaf() -> st.SearchStrategy[Any]:
        count = st.integers(1, 4)
        lo = st.integers(-20, 20)
        return st.one_of(
            st.builds(
                lambda a, w, n: {"type": "int", "minval": a, "maxval": a + w, "count": n},
                lo,
                st.integers(0, 6),
                count,
            ),
            st.builds(lambda a, n: {"type": "double", "minval": a, "maxval": a + 1.5, "count": n}, lo, count),
            st.builds(lambda n: {"type": "log", "minval": -3, "maxval": 0, "base": 10, "count": n}, count),
            st.builds(lambda k: {"type": "categorical", "vals": list(range(k))}, st.integers(1, 3)),
            st.integers(0, 9),
        )

    names = st.text("abcde", min_size=1, max_size=3)
    inner = st.dictionaries(names, leaf(), min_size=1, max_size=2)
    return draw(st.dictionaries(names, st.one_of(leaf(), inner), min_size=1, max_size=4))


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _leaves(space: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in sorted(space):
        v = space[k]
        out.update(_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


@FAST
@given(grid_spaces())
def test_grid_enumerates_exactly_the_product(raw: dict[str, Any]) -> None:
    space = parse_space(raw)
    leaves = _leaves(space)
    axes = [grid_values(p) for p in leaves.values()]
    expected = [dict(zip(leaves, combo, strict=True)) for combo in itertools.product(*axes)]
    assert [_flatten(p) for p in grid(space)] == expected
    assert len(expected) == math.prod(len(a) for a in axes) == grid_size(space)
    assert [grid_point(space, i) for i in range(len(expected))] == grid(space)  # what GridSearch uses
    with pytest.raises(IndexError):
        grid_point(space, len(expected))

    rec = Recording(
        make_search_method(
            {"name": "grid", "max_length": {"batches": 10}, "max_concurrent_trials": 3}, raw, 0
        )
    )
    simulate(rec, SyntheticCurves(horizon=10), SimConfig(workers=2))
    assert [_flatten(dict(a.hparams)) for a in rec.actions if isinstance(a, Create)] == expected


@FAST
@given(st.integers(0, 2**31 - 1))
def test_samples_stay_in_bounds(seed: int) -> None:
    s = sample(parse_space(SPACE), random.Random(seed))
    assert 1e-5 <= s["lr"] <= 1e-1 and 1 <= s["layers"] <= 8 and s["opt"] in ("sgd", "adam")
    assert 0.0 <= s["head"]["dropout"] <= 0.5 and s["head"]["width"] == 64 and s["global_batch_size"] == 32


def test_pause_mode_pauses_and_resumes() -> None:
    cfg = {
        "name": "adaptive_asha",
        "metric": "l",
        "max_trials": 64,
        "max_length": {"batches": 1000},
        "divisor": 3,
    }
    summary: Summary = simulate(
        make_search_method(cfg, SPACE, 3), SyntheticCurves(horizon=1000), SimConfig(workers=4)
    )
    assert summary.trials_paused > 0 and summary.trials_resumed > 0
    cont = simulate(
        make_search_method({**cfg, "promotion": "continue"}, SPACE, 3),
        SyntheticCurves(horizon=1000),
        SimConfig(workers=4),
    )
    assert cont.trials_paused == cont.trials_resumed == 0


def test_invalid_hp_is_replaced_and_errored_counts() -> None:
    cfg = {
        "name": "random",
        "metric": "l",
        "max_trials": 3,
        "max_length": {"batches": 10},
        "max_concurrent_trials": 1,
    }
    m = make_search_method(cfg, SPACE, 0)
    (create, *_) = m.initial_actions()
    assert isinstance(create, Create)
    assert m.on_trial_created(create.request_id, 1) == [ValidateAfter(1, 10)]
    assert m.on_trial_exited_early(1, ExitedReason.INVALID_HP) == []
    out = m.on_trial_closed(1)
    assert len(out) == 1 and isinstance(out[0], Create)
    assert m.on_trial_created(out[0].request_id, 2) == [ValidateAfter(2, 10)]
    assert m.on_validation_completed(2, 0.5, 5) == []  # before the target: ignored
    assert m.on_validation_completed(2, 0.5, 10) == [Stop(2)]
    for tid in (3, 4):
        (nxt,) = m.on_trial_closed(tid - 1)
        assert isinstance(nxt, Create)
        m.on_trial_created(nxt.request_id, tid)
        m.on_trial_exited_early(tid, ExitedReason.ERRORED)
    assert m.on_trial_closed(4) == [Shutdown(cancel=False, failure=False)]
    assert m.progress() == 1.0


def test_all_errored_is_a_failure() -> None:
    m = make_search_method({"name": "single", "max_length": {"batches": 5}}, {}, 0)
    (create,) = m.initial_actions()
    assert isinstance(create, Create) and create.hparams == {}
    m.on_trial_created(create.request_id, 7)
    m.on_trial_exited_early(7, "ERRORED")
    assert m.on_trial_closed(7) == [Shutdown(cancel=False, failure=True)]


def test_actions_round_trip_through_json() -> None:
    actions: list[Action] = [
        Create("r", {"a": {"b": 1}}, 3), ValidateAfter(1, 10), Pause(1), Resume(1), Stop(1), Shutdown(failure=True)
    ]  # fmt: skip
    assert [action_from_dict(json.loads(json.dumps(action_to_dict(a)))) for a in actions] == actions


def test_config_forms_agree_and_errors_name_the_field() -> None:
    a = parse_searcher_config({"name": "adaptive_asha", "max_trials": 4, "max_length": {"batches": 100}})
    b = parse_searcher_config(
        {"name": "adaptive_asha", "max_trials": 4, "time_metric": "batches", "max_time": 100}
    )
    assert a == b and a.promotion == "pause" and a.max_concurrent_trials == 16
    with pytest.raises(ValueError, match="stop_once"):
        parse_searcher_config(
            {
                **{"name": "async_halving", "num_rungs": 2, "max_trials": 2, "max_time": 9},
                "stop_once": True,
                "promotion": "pause",
            }
        )
    with pytest.raises(ValueError, match=r"hyperparameters\.a\.b\.count"):
        make_search_method(
            {"name": "grid", "max_length": {"batches": 1}},
            {"a": {"b": {"type": "int", "minval": 0, "maxval": 3}}},
            0,
        )


def test_restore_rejects_other_configs() -> None:
    cfg = {"name": "random", "max_trials": 3, "max_length": {"batches": 10}}
    snap = make_search_method(cfg, SPACE, 0).snapshot()
    with pytest.raises(ValueError, match="different searcher config"):
        make_search_method({**cfg, "max_trials": 4}, SPACE, 0).restore(snap)


def test_stuck_searches_are_reported() -> None:
    m = make_search_method(
        {"name": "random", "max_trials": 1}, SPACE, 0
    )  # no max_length: nothing to train to
    with pytest.raises(SimulationError, match="stuck"):
        simulate(m, SyntheticCurves(horizon=10))


def test_plan_describes_brackets_and_simulates() -> None:
    from searcher.plan import format_plan, plan_search

    cfg = {"name": "adaptive_asha", "metric": "loss", "max_trials": 16, "max_length": {"batches": 1000}}
    plan = plan_search({**cfg, "max_concurrent_trials": 0}, SPACE)
    assert [(b.num_rungs, b.max_trials, b.rung_lengths) for b in plan.brackets] == [
        (3, 12, (62, 250, 1000)),
        (2, 4, (250, 1000)),
    ]
    assert plan.simulated is not None and plan.simulated.trials_created == 16
    text = format_plan(plan)
    assert "rung 1: train to 62 batches" in text and "Promotion: pause" in text


@FAST
@given(st.integers(1, 10**6), st.sampled_from([2, 3, 4, 5, 2.5]), st.integers(1, 6))
def test_rung_lengths_follow_the_formula(max_length: int, divisor: float, num_rungs: int) -> None:
    if max_length < divisor ** (num_rungs - 1):
        return
    lengths = rung_lengths(max_length, divisor, num_rungs)
    assert lengths == [max(int(max_length / divisor ** (num_rungs - 1 - i)), 1) for i in range(num_rungs)]
    assert lengths[-1] == max_length


class CheckingPromotions:
    """After every event, checks the paper's ASHA rule (Li et al., Algorithm 2, ``get_job``) on
    every bracket: no rung below the top holds an unpromoted trial among its best
    ``int(n / divisor)``, so a freed worker never starts a new trial while a promotion is owed; and,
    with trials left to create, every bracket keeps ``max_concurrent_trials`` trials at work."""

    def __init__(self, method: SearchMethod, unlimited: bool) -> None:
        self.method, self.unlimited, self.events = method, unlimited, 0

    def __getattr__(self, name: str) -> Callable[..., list[Action]]:
        def call(*args: Any) -> list[Action]:
            out: list[Action] = getattr(self.method, name)(*args)
            algorithm = self.method.algorithm
            subs = algorithm.subs if isinstance(algorithm, AdaptiveASHA) else [algorithm]
            for sub in subs:
                assert isinstance(sub, AsyncHalving)
                for entries in sub.rungs[:-1]:
                    assert all(promoted for _, _, promoted in entries[: int(len(entries) / sub.divisor)])
            if self.unlimited and name == "on_validation_completed":
                assert self.method.running_trials() == sum(s.initial_trials for s in subs)
            self.events += 1
            return out

        return call


@FAST
@given(
    st.sampled_from(["aggressive", "standard", "conservative"]),
    st.integers(1, 16),
    st.sampled_from([20, 10_000]),
    st.integers(0, 2**16),
)
def test_asha_pause_promotes_as_soon_as_a_trial_deserves_it(
    mode: str, workers: int, max_trials: int, seed: int
) -> None:
    cfg = {
        "name": "adaptive_asha",
        "metric": "loss",
        "mode": mode,
        "max_trials": max_trials,
        "max_concurrent_trials": workers,
        "max_length": {"batches": 81},
        "divisor": 3,
    }
    check = CheckingPromotions(make_search_method(cfg, SPACE, seed), unlimited=max_trials == 10_000)
    sim = SimConfig(workers=workers, start_overhead_s=1.0, resume_overhead_s=2.0, seed=seed, max_time_s=300.0)
    simulate(check, SyntheticCurves(horizon=81, seed=seed, runtime_spread=0.5), sim)  # type: ignore[arg-type]
    assert check.events > 0
