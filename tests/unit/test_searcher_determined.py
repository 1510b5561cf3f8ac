"""Exact values from Determined's searcher tests (master/pkg/searcher/*_test.go).

``run_predefined`` plays Determined's ``runValueSimulationTestCases``: trials are served first in,
first out; the n-th created trial always reports the n-th metric, and an "early exit" trial exits
(errored) when asked to train to its last listed length instead of validating there.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from searcher import Create, ExitedReason, Pause, Resume, Shutdown, Stop, ValidateAfter, make_search_method
from searcher.adaptive_asha import (
    bracket_max_concurrent,
    bracket_max_trials,
    bracket_rungs_for_mode,
    brackets_for,
)
from searcher.asha import rung_lengths
from searcher.config import parse_searcher_config
from searcher.hparams import grid, parse_space


def run_predefined(
    cfg: dict[str, Any], metrics: list[float], early_exit: dict[int, int] | None = None, hp: Any = None
) -> list[list[int]]:
    """Return, per created trial, the lengths it was asked to reach. ``early_exit`` maps a trial's
    creation index to the request (1-based) at which it errors out instead of validating."""
    early_exit = early_exit or {}
    method = make_search_method(cfg, hp or {"x": {"type": "double", "minval": 0, "maxval": 1}}, seed=0)
    seen: list[list[int]] = []
    targets: dict[int, int] = {}
    queue: deque[int] = deque()
    closed: set[int] = set()
    shutdown = False

    def apply(actions: list[Any]) -> None:
        nonlocal shutdown
        work = deque(actions)
        while work:
            a = work.popleft()
            if isinstance(a, Create):
                seen.append([])
                work.extend(method.on_trial_created(a.request_id, len(seen)))
            elif isinstance(a, ValidateAfter):
                targets[a.trial_id] = a.length
                queue.append(a.trial_id)
            elif isinstance(a, Stop):
                closed.add(a.trial_id)
                work.extend(method.on_trial_closed(a.trial_id))
            elif isinstance(a, Shutdown):
                shutdown = True
            else:
                assert isinstance(a, Pause | Resume)

    apply(method.initial_actions())
    while queue:
        tid = queue.popleft()
        if tid in closed:
            continue
        index = tid - 1
        seen[index].append(targets[tid])
        metric = metrics[index % len(metrics)]
        if early_exit.get(index) == len(seen[index]):
            closed.add(tid)
            apply(method.on_trial_exited_early(tid, ExitedReason.ERRORED))
            apply(method.on_trial_closed(tid))
        else:
            apply(method.on_validation_completed(tid, metric, targets[tid]))
    assert shutdown, "search did not shut down"
    return seen


def test_bracket_max_trials() -> None:
    assert bracket_max_trials(20, 3.0, [3, 2, 1]) == [12, 5, 3]
    assert bracket_max_trials(50, 3.0, [4, 3]) == [35, 15]
    assert bracket_max_trials(50, 4.0, [3, 2]) == [37, 13]
    assert bracket_max_trials(100, 4.0, [4, 3, 2]) == [70, 22, 8]


def test_bracket_max_concurrent_trials() -> None:
    assert bracket_max_concurrent(0, 3.0, [9, 3, 1]) == [3, 3, 3]
    assert bracket_max_concurrent(11, 3.0, [9, 3, 1]) == [4, 4, 3]
    assert bracket_max_concurrent(0, 4.0, [40, 10]) == [10, 10]


def test_modes() -> None:
    assert bracket_rungs_for_mode("aggressive", 5) == [5]
    assert bracket_rungs_for_mode("standard", 5) == [3, 4, 5]
    assert bracket_rungs_for_mode("standard", 2) == [1, 2]
    assert bracket_rungs_for_mode("conservative", 3) == [1, 2, 3]


def test_adaptive_brackets_for_determined_defaults() -> None:
    cfg = parse_searcher_config(
        {
            "name": "adaptive_asha",
            "max_trials": 16,
            "max_length": {"batches": 1000},
            "max_concurrent_trials": 0,
        }
    )
    # divisor 4, max_rungs 5 capped by log4(1000)+1 = 5 and log4(16)+1 = 3; standard → [2, 3].
    assert [(b.num_rungs, b.max_trials, b.max_concurrent_trials) for b in brackets_for(cfg)] == [
        (3, 12, 4),
        (2, 4, 4),
    ]


@pytest.mark.parametrize(
    ("length", "expected"),
    [(576000, [64000, 192000, 576000]), (9000, [1000, 3000, 9000]), (12, [1, 4, 12])],
)
def test_rung_lengths(length: int, expected: list[int]) -> None:
    assert rung_lengths(length, 3.0, 3) == expected


def test_rung_lengths_that_repeat_are_rejected() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        rung_lengths(2, 4.0, 3)


ASHA = {
    "name": "async_halving",
    "metric": "error",
    "num_rungs": 3,
    "max_length": {"batches": 9000},
    "max_trials": 12,
    "divisor": 3,
}


def test_asha_constant_metric_promotes_8_3_1() -> None:
    seen = run_predefined(ASHA, [0.5])
    assert sorted(seen) == sorted([[1000]] * 8 + [[1000, 3000]] * 3 + [[1000, 3000, 9000]])


@pytest.mark.parametrize("smaller_is_better", [True, False])
def test_asha_search_method(smaller_is_better: bool) -> None:
    metrics = [0.01 * (i + 1) for i in range(12)]
    if not smaller_is_better:
        metrics.reverse()
    seen = run_predefined({**ASHA, "smaller_is_better": smaller_is_better}, metrics)
    assert seen == [[1000, 3000, 9000]] + [[1000, 3000]] * 3 + [[1000]] * 8


def test_asha_async_promotions_with_early_exit() -> None:
    metrics = [0.10, 0.11, 0.12, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09]
    seen = run_predefined(ASHA, metrics, early_exit={2: 1})
    assert seen == [[1000, 3000], [1000], [1000], [1000, 3000, 9000]] + [[1000, 3000]] * 3 + [[1000]] * 5


def test_asha_early_exit_after_promotion() -> None:
    metrics = [0.01 * (i + 1) for i in range(12)]
    seen = run_predefined(ASHA, metrics, early_exit={2: 2})
    assert seen == [[1000, 3000, 9000]] + [[1000, 3000]] * 3 + [[1000]] * 8


def test_adaptive_asha_early_exit() -> None:
    seen = run_predefined({**ADAPTIVE, "stop_once": False}, [0.1, 0.2, 0.3, 0.4, 0.5], early_exit={1: 1})
    assert seen == [[300, 900], [300], [300], [900], [900]]


def test_asha_single_rung() -> None:
    seen = run_predefined(
        {**ASHA, "num_rungs": 1, "max_trials": 4, "max_concurrent_trials": 3}, [0.05, 0.06, 0.07, 0.08]
    )
    assert seen == [[9000]] * 4


STOPPING = {**ASHA, "stop_once": True, "max_concurrent_trials": 2}


def test_asha_stopping_increasing_metric() -> None:
    seen = run_predefined(STOPPING, [float(i) for i in range(12)])
    assert seen == [[1000, 3000, 9000]] + [[1000]] * 11


def test_asha_stopping_search_method() -> None:
    metrics = [0.01 * (i + 1) for i in range(12)]
    assert (
        run_predefined({**STOPPING, "max_concurrent_trials": 3}, metrics)
        == [[1000, 3000, 9000]] + [[1000]] * 11
    )
    larger = run_predefined({**STOPPING, "max_concurrent_trials": 3, "smaller_is_better": False}, metrics)
    assert larger == [[1000, 3000, 9000]] * 12


ADAPTIVE = {
    "name": "adaptive_asha", "metric": "error", "max_length": {"batches": 900}, "max_trials": 5,
    "mode": "standard", "max_rungs": 2, "divisor": 3, "max_concurrent_trials": 5,
}  # fmt: skip


@pytest.mark.parametrize("stop_once", [False, True])
def test_adaptive_asha_search_method(stop_once: bool) -> None:
    seen = run_predefined({**ADAPTIVE, "stop_once": stop_once}, [0.1, 0.2, 0.3, 0.4, 0.5])
    assert seen == [[300, 900], [300], [300], [900], [900]]


def test_adaptive_asha_stopping_larger_is_better() -> None:
    seen = run_predefined(
        {**ADAPTIVE, "stop_once": True, "smaller_is_better": False}, [0.1, 0.2, 0.3, 0.4, 0.5]
    )
    assert seen == [[300, 900]] * 3 + [[900], [900]]


def test_grid_int_counts() -> None:
    space = parse_space(
        {
            "1": {"type": "int", "minval": 0, "maxval": 20, "count": 3},
            "2": {"3": {"type": "int", "minval": 0, "maxval": 10, "count": 3}},
        }
    )
    assert grid(space) == [{"1": a, "2": {"3": b}} for a in (0, 10, 20) for b in (0, 5, 10)]
    assert grid(parse_space({"1": {"type": "int", "minval": -4, "maxval": -2, "count": 3}})) == [
        {"1": -4},
        {"1": -3},
        {"1": -2},
    ]
    assert grid(parse_space({"1": {"type": "int", "minval": 0, "maxval": 4, "count": 9}})) == [
        {"1": i} for i in range(5)
    ]


def test_grid_search_runs_every_point_once() -> None:
    hp = {
        str(i): {"type": "double", "minval": -1.0, "maxval": 1.0, "count": c} for i, c in enumerate([2, 1, 3])
    }
    seen = run_predefined(
        {"name": "grid", "metric": "e", "max_length": {"records": 19200}, "max_concurrent_trials": 2},
        [0.1],
        hp=hp,
    )
    assert seen == [[19200]] * 6
