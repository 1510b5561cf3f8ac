"""``random``: sample ``max_trials`` configurations, train each to ``max_length``, at most
``max_concurrent_trials`` at a time (Determined's ``random.go``, ValidateAfter era).

A trial that exits with ``INVALID_HP`` does not count: a replacement is sampled when it closes.
Errored or user-canceled trials count as done. Without ``max_length`` (0.38 style), trials train as
long as their code decides and the search only counts them as they close.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from searcher.actions import ExitedReason
from searcher.base import Algorithm, Context, Op, stop, validate_after
from searcher.config import SearcherConfig


def initial_trial_count(max_trials: int, max_concurrent_trials: int) -> int:
    return min(max_trials, max_concurrent_trials) if max_concurrent_trials > 0 else max_trials


def length_progress(
    units: Mapping[str, int], closed: set[str], invalid: set[str], max_length: int | None, trials: int
) -> float:
    """Units trained over units planned; closed trials count in full, invalid ones not at all."""
    if trials <= 0:
        return 1.0
    if max_length is None:
        return len(closed - invalid) / trials
    done = sum(
        max_length if rid in closed else min(u, max_length) for rid, u in units.items() if rid not in invalid
    )
    return done / (max_length * trials)


class RandomSearch(Algorithm):
    name = "random"
    replace_invalid = True

    def __init__(self, config: SearcherConfig) -> None:
        self.max_trials = config.max_trials
        self.max_concurrent_trials = config.max_concurrent_trials
        self.max_length = config.max_length
        self.created_trials = 0

    def _create(self, ctx: Context) -> list[Op]:
        create = ctx.create()
        self.created_trials += 1
        if self.max_length is None:
            return [create]
        return [create, validate_after(create.request_id, self.max_length)]

    def initial(self, ctx: Context) -> list[Op]:
        ops: list[Op] = []
        for _ in range(initial_trial_count(self.max_trials, self.max_concurrent_trials)):
            ops += self._create(ctx)
        return ops

    def validated(self, ctx: Context, request_id: str, metric: float, units: int) -> list[Op]:
        return [stop(request_id)]

    def exited_early(self, ctx: Context, request_id: str, reason: ExitedReason) -> list[Op]:
        if reason == ExitedReason.INVALID_HP and self.replace_invalid:
            self.created_trials -= 1  # its replacement is created when it closes
        return []

    def closed(self, ctx: Context, request_id: str) -> list[Op]:
        return self._create(ctx) if self.created_trials < self.max_trials else []

    def progress(self, units: Mapping[str, int], closed: set[str], invalid: set[str]) -> float:
        return length_progress(units, closed, invalid, self.max_length, self.max_trials)

    def get_state(self) -> dict[str, Any]:
        return {"created_trials": self.created_trials}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.created_trials = int(state["created_trials"])
