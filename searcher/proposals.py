"""``proposals: model``: new ASHA trials proposed by a TPE density model over the results so far.

Our own searcher key (not Determined's), for ``adaptive_asha`` and ``async_halving``; without it,
or with ``proposals: random``, every trial's hyperparameters are sampled at random exactly as
before (the same draws from the same seeded RNG).

With ``proposals: model`` each new trial is proposed like this (BOHB's rules, Falkner et al. 2018:
which results to fit, when to start, a third of the proposals random; no liar for trials in flight,
as in BOHB and Optuna's default ``TPESampler``):

1. The results are grouped by rung *length* (total units trained), across every bracket of an
   ``adaptive_asha`` search, so one model learns from all brackets.
2. The model is fitted to the longest length with at least ``d + 1`` results (``d``: the number of
   non-constant hyperparameters). Until some length has that many, and for ``RANDOM_FRACTION`` (a
   third) of the proposals after that, the trial is sampled at random.
3. ``searcher.tpe.propose`` returns the candidate with the best density ratio (candidates drawn
   from the good density with its bandwidths × 3, as BOHB does). Trials that have no result at
   that length yet are left out. An earlier version added them to the bad side (a constant liar:
   running trials, and trials paused waiting for a promotion), but with ``promotion: pause``
   almost every trial ever created is paused at some lower rung, so hundreds of liars swamped the
   few dozen real results at the top rung: the bad density became the proposal density itself
   and pushed new proposals away from where the model had been proposing, i.e. away from the good
   region (issue 40: worse than random proposals on the learning-curve problems). Lying only about
   running trials (at most ``W``) was still worse than no liar on the tuning seeds; W concurrent
   proposals stay diverse because each draws its own candidates from the widened good density
   (and a third are random).

These settings were chosen on tuning seeds (1000-1059, ``bench/tune_proposals.py``), disjoint from
the seeds the results are reported on; ``bench/results/hpo_model_proposals.md`` has the variants.

The numpy generator of each proposal is seeded from the experiment's seeded RNG, and the model is
fitted again from the algorithm's state at every proposal: the rungs (already in the snapshot) and
the encoded hyperparameters of every trial (``x``, added to the snapshot). A search restored from a
snapshot therefore proposes exactly what the uninterrupted search would have.

Each ``Create`` says where its hyperparameters came from (``proposal``: ``model`` or ``random``);
the master stores it with the trial and ``det e describe`` shows it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import numpy as np

from searcher import hparams, tpe
from searcher.actions import Create
from searcher.base import Context

PROPOSALS = ("random", "model")
RANDOM_FRACTION = 1 / 3  # BOHB's
MIN_RESULTS_EXTRA = 1  # fit a length with at least d + 1 results (BOHB's min_points_in_model)


class RungSource(Protocol):
    """What a bracket shows the model: its results."""

    def model_results(self) -> Iterator[tuple[int, str, float]]:
        """(length, request id, metric) for every result recorded at every rung."""
        ...


class ModelProposals:
    """The proposal model of one search (shared by the brackets of an ``adaptive_asha`` search)."""

    def __init__(self, space: hparams.Space) -> None:
        self.space = space
        self.dims = tpe.dimensions(space)
        self.ks = [dim.k for dim in self.dims]
        self.min_results = len(self.dims) + MIN_RESULTS_EXTRA
        self.sources: list[RungSource] = []
        self.x: dict[str, list[float]] = {}

    def create(self, ctx: Context) -> Create:
        """A new trial, proposed by the model where it can."""
        sample = self._propose(ctx)
        create = ctx.create() if sample is None else ctx.create(sample, proposal="model")
        self.x[create.request_id] = tpe.encode(self.dims, create.hparams)
        return create

    def fit_data(self) -> tuple[tpe.Array, tpe.Array] | None:
        """(points, values) of the longest length with enough results, or None."""
        by_length: dict[int, list[tuple[str, float]]] = {}
        for source in self.sources:
            for length, rid, metric in source.model_results():
                by_length.setdefault(length, []).append((rid, metric))
        eligible = [length for length, rs in by_length.items() if len(rs) >= self.min_results]
        if not eligible:
            return None
        results = by_length[max(eligible)]
        points = np.array([self.x[rid] for rid, _ in results], dtype=float).reshape(-1, len(self.dims))
        values = np.array([metric for _, metric in results], dtype=float)
        return points, values

    def _propose(self, ctx: Context) -> dict[str, Any] | None:
        if not self.dims:
            return None
        data = self.fit_data()
        if data is None or ctx.rng.random() < RANDOM_FRACTION:
            return None
        points, values = data
        gen = np.random.default_rng(ctx.rng.getrandbits(64))
        x = tpe.propose(self.ks, points, values, np.zeros((0, len(self.dims))), gen)
        return tpe.decode(self.space, self.dims, [float(v) for v in x])

    def get_state(self) -> dict[str, Any]:
        return {"x": [[rid, x] for rid, x in self.x.items()]}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.x = {str(rid): [float(v) for v in x] for rid, x in state["x"]}
