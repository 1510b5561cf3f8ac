"""``adaptive_asha``: several ASHA brackets run side by side (Determined's ``adaptive_asha.go`` and
``tournament.go``).

Brackets: unless ``bracket_rungs`` is given, ``max_rungs`` is capped so that the shortest rung is
at least one unit and at least one trial can reach the top rung::

    max_rungs = min(max_rungs, int(log(max_length)/log(divisor)) + 1, int(log(max_trials)/log(divisor)) + 1)

and ``mode`` picks the brackets' rung counts: ``aggressive`` → ``[max_rungs]``; ``standard`` →
``(max_rungs-1)//2 + 1 … max_rungs``; ``conservative`` → ``1 … max_rungs``. Brackets are sorted with
the most rungs (most early stopping) first. ``max_trials`` is split so that every bracket gets
roughly the same compute (weight ``divisor**(rungs-1) / rungs``, at least one trial each, the
remainder to the first bracket); ``max_concurrent_trials`` is split evenly with the remainder to the
first brackets, after raising it to the number of brackets so that each gets at least one (0 → each
bracket ``max(trials of the last bracket, int(divisor))``). Each bracket keeps its share busy for
as long as it has trials to create and a freed slot is never lent to another bracket, as in
Determined, so each bracket gets worker time in proportion to its share of ``max_concurrent_trials``
(16 with ``mode: standard``: 6, 5 and 5 for the 5-, 4- and 3-rung brackets).

Each bracket is an ``async_halving`` search (``asha.py``); ``promotion`` (``pause`` by default, or
``continue`` = Determined's ``stop_once: true``) applies to all brackets. Events go to the bracket
that created the trial; progress is the brackets' mean. With ``proposals: model`` the brackets share
one proposal model (``proposals.py``), which learns from the results of all of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from searcher import hparams
from searcher.actions import Create, ExitedReason
from searcher.asha import AsyncHalving
from searcher.base import Algorithm, Context, Op
from searcher.config import SearcherConfig
from searcher.proposals import ModelProposals


def capped_max_rungs(max_rungs: int, max_length: int, max_trials: int, divisor: float) -> int:
    max_rungs = min(max_rungs, int(math.log(float(max_length)) / math.log(divisor)) + 1)
    return min(max_rungs, int(math.log(float(max_trials)) / math.log(divisor)) + 1)


def bracket_rungs_for_mode(mode: str, max_rungs: int) -> list[int]:
    if mode == "aggressive":
        return [max_rungs]
    if mode == "standard":
        return list(range((max_rungs - 1) // 2 + 1, max_rungs + 1))
    if mode == "conservative":
        return list(range(1, max_rungs + 1))
    raise ValueError(f"unknown adaptive mode {mode!r}")


def bracket_max_trials(max_trials: int, divisor: float, brackets: Sequence[int]) -> list[int]:
    weights = [divisor ** (rungs - 1) / rungs for rungs in brackets]
    total = sum(weights)
    trials = [max(int(w / total * max_trials), 1) for w in weights]
    trials[0] += max(max_trials - sum(trials), 0)
    return trials


def bracket_max_concurrent(max_concurrent_trials: int, divisor: float, trials: Sequence[int]) -> list[int]:
    n = len(trials)
    if max_concurrent_trials == 0:
        return [max(trials[-1], int(divisor))] * n
    max_concurrent_trials = max(max_concurrent_trials, n)
    per, remainder = divmod(max_concurrent_trials, n)
    return [per + (1 if i < remainder else 0) for i in range(n)]


@dataclass(frozen=True)
class Bracket:
    num_rungs: int
    max_trials: int
    max_concurrent_trials: int


def brackets_for(config: SearcherConfig) -> list[Bracket]:
    """The brackets Determined would run for this config (most rungs first)."""
    assert config.max_length is not None
    rungs = list(config.bracket_rungs)
    if not rungs:
        max_rungs = capped_max_rungs(config.max_rungs, config.max_length, config.max_trials, config.divisor)
        rungs = bracket_rungs_for_mode(config.mode, max_rungs)
    rungs.sort(reverse=True)
    trials = bracket_max_trials(config.max_trials, config.divisor, rungs)
    concurrent = bracket_max_concurrent(config.max_concurrent_trials, config.divisor, trials)
    return [Bracket(r, t, c) for r, t, c in zip(rungs, trials, concurrent, strict=True)]


class AdaptiveASHA(Algorithm):
    name = "adaptive_asha"

    def __init__(self, config: SearcherConfig, space: hparams.Space | None = None) -> None:
        self.brackets = brackets_for(config)
        self.model: ModelProposals | None = None
        if config.proposals == "model":
            assert space is not None, "proposals: model needs the hyperparameter space"
            self.model = ModelProposals(space)  # one model for all brackets
        self.subs = [
            AsyncHalving(
                config,
                num_rungs=b.num_rungs,
                max_trials=b.max_trials,
                max_concurrent_trials=b.max_concurrent_trials,
                model=self.model,
            )
            for b in self.brackets
        ]
        self.owner: dict[str, int] = {}

    def _mark(self, index: int, ops: list[Op]) -> list[Op]:
        for op in ops:
            if isinstance(op, Create):
                self.owner[op.request_id] = index
        return ops

    def initial(self, ctx: Context) -> list[Op]:
        ops: list[Op] = []
        for i, sub in enumerate(self.subs):
            ops += self._mark(i, sub.initial(ctx))
        return ops

    def created(self, ctx: Context, request_id: str) -> list[Op]:
        i = self.owner[request_id]
        return self._mark(i, self.subs[i].created(ctx, request_id))

    def validated(self, ctx: Context, request_id: str, metric: float, units: int) -> list[Op]:
        i = self.owner[request_id]
        return self._mark(i, self.subs[i].validated(ctx, request_id, metric, units))

    def exited_early(self, ctx: Context, request_id: str, reason: ExitedReason) -> list[Op]:
        i = self.owner[request_id]
        return self._mark(i, self.subs[i].exited_early(ctx, request_id, reason))

    def closed(self, ctx: Context, request_id: str) -> list[Op]:
        i = self.owner[request_id]
        return self._mark(i, self.subs[i].closed(ctx, request_id))

    def progress(self, units: Mapping[str, int], closed: set[str], invalid: set[str]) -> float:
        return sum(sub.progress(units, closed, invalid) for sub in self.subs) / len(self.subs)

    def get_state(self) -> dict[str, Any]:
        return {
            "brackets": [sub.get_state() for sub in self.subs],
            "owner": [[rid, i] for rid, i in self.owner.items()],
            **({"model": self.model.get_state()} if self.model is not None else {}),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        for sub, sub_state in zip(self.subs, state["brackets"], strict=True):
            sub.set_state(sub_state)
        self.owner = {str(rid): int(i) for rid, i in state["owner"]}
        if self.model is not None:
            self.model.set_state(state["model"])
