"""``grid``: one trial per point of the cartesian product of every hyperparameter's grid values
(``count`` evenly spaced values for int/double/log, all ``vals`` of a categorical, the constant),
each trained to ``max_length``, at most ``max_concurrent_trials`` at a time. ``max_trials`` is
ignored, as in Determined. Trials that exit early (for any reason) are not replaced: a grid point
is tried once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from searcher import hparams
from searcher.actions import ExitedReason
from searcher.base import Algorithm, Context, Op, stop, validate_after
from searcher.config import SearcherConfig
from searcher.random_search import initial_trial_count, length_progress


class GridSearch(Algorithm):
    name = "grid"

    def __init__(self, config: SearcherConfig, space: hparams.Space) -> None:
        # Points are decoded on demand: the master rebuilds the method from its snapshot on every pass,
        # and enumerating a 2,000-point grid each time cost more than the rest of the pass.
        self.space = space
        self.axes = hparams.grid_axes(space)
        self.size = hparams.grid_size(space, self.axes)
        self.max_concurrent_trials = config.max_concurrent_trials
        self.max_length = config.max_length
        self.next_point = 0

    def _create(self, ctx: Context) -> list[Op]:
        create = ctx.create(hparams.grid_point(self.space, self.next_point, self.axes), proposal="grid")
        self.next_point += 1
        if self.max_length is None:
            return [create]
        return [create, validate_after(create.request_id, self.max_length)]

    def initial(self, ctx: Context) -> list[Op]:
        ops: list[Op] = []
        for _ in range(initial_trial_count(self.size, self.max_concurrent_trials)):
            ops += self._create(ctx)
        return ops

    def validated(self, ctx: Context, request_id: str, metric: float, units: int) -> list[Op]:
        return [stop(request_id)]

    def exited_early(self, ctx: Context, request_id: str, reason: ExitedReason) -> list[Op]:
        return []

    def closed(self, ctx: Context, request_id: str) -> list[Op]:
        return self._create(ctx) if self.next_point < self.size else []

    def progress(self, units: Mapping[str, int], closed: set[str], invalid: set[str]) -> float:
        return length_progress(units, closed, set(), self.max_length, self.size)

    def get_state(self) -> dict[str, Any]:
        return {"next_point": self.next_point}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.next_point = int(state["next_point"])
