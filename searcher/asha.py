"""``async_halving``: asynchronous successive halving (ASHA), as in Determined's ``asha.go`` and
``asha_stopping.go``, with one bracket of ``num_rungs`` rungs.

Rung ``i`` (0-based) asks for ``max(int(max_length / divisor**(num_rungs - 1 - i)), 1)`` units
of *total* training (``rung_lengths``), e.g. 9000 batches, divisor 3, 3 rungs → 1000, 3000, 9000.
A trial's ``ValidateAfter`` is the next rung's length. At most ``max_trials`` trials are created;
``max_concurrent_trials`` (0: ``divisor**(num_rungs-1)`` capped by ``max_trials``) are started at
once and each later validation that frees a slot starts one more.

Two ways to treat a trial that reaches a rung and is not among the best ``1/divisor`` there:

``promotion: "pause"`` (default; Determined's ``stop_once: false``)
    Promotion-based ASHA. The trial is **paused**: it checkpoints and frees its slots. Whenever a
    rung receives a new result, the number of trials that rung may promote, ``int(n / divisor)``,
    may grow by one; if the trial now deserving promotion is a paused one, it is **resumed** from
    its checkpoint and trained to the next rung. Once all ``max_trials`` trials have reported at
    the bottom rung, paused trials that can no longer be promoted are stopped, rung by rung.
    A promotion is made the moment it becomes due, in the slot the reporting trial frees, so no
    rung ever holds an unpromoted trial among its best ``int(n / divisor)``: this is the ASHA
    paper's ``get_job`` (Li et al., 2020, Algorithm 2: scan the rungs top down for a promotable
    trial, else start a new one) done incrementally, and a new trial is never started while a
    promotion is owed (``test_asha_pause_promotes_as_soon_as_a_trial_deserves_it``).
``promotion: "continue"`` (Determined's ``stop_once: true``)
    Stopping-based ASHA. A trial in the top ``max(int(n / divisor), 1)`` of its rung so far goes
    straight on; any other is stopped for good. Nothing is ever paused or resumed.

Trials that error or are killed count as the worst metric at their rung; trials with invalid
hyperparameters are removed from every rung and replaced.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any

from searcher import hparams
from searcher.actions import ExitedReason
from searcher.base import WORST_METRIC, Algorithm, Context, Op, pause, resume, stop, validate_after
from searcher.config import SearcherConfig
from searcher.proposals import ModelProposals

# One rung's results, sorted by metric: [request_id, metric, promoted].
Entry = list[Any]


def rung_lengths(max_length: int, divisor: float, num_rungs: int) -> list[int]:
    """Total units a trial must have trained to report at each rung (Determined's ``makeRungs``)."""
    lengths = [max(int(float(max_length) / divisor ** (num_rungs - i - 1)), 1) for i in range(num_rungs)]
    if any(b <= a for a, b in itertools.pairwise(lengths)):
        raise ValueError(
            f"searcher: {num_rungs} rungs with divisor {divisor} do not fit in max_length {max_length} "
            f"(rung lengths {lengths} repeat); use fewer rungs or a longer max_length"
        )
    return lengths


def default_max_concurrent(
    max_trials: int, max_concurrent_trials: int, divisor: float, num_rungs: int
) -> int:
    """How many trials start at once (Determined's ``initialOperations``)."""
    if max_concurrent_trials > 0:
        return min(max_concurrent_trials, max_trials)
    return max(1, min(int(divisor ** (num_rungs - 1)), max_trials))


def _metric(entry: Entry) -> float:
    return float(entry[1])


def promote_async(entries: list[Entry], request_id: str, metric: float, divisor: float) -> str | None:
    """Insert a result into a rung (in place); return the trial to promote now, if any.

    Adding one result can raise the number of trials the rung may promote, ``int(n / divisor)``,
    by at most one. The new trial is promoted at once if it ranks inside that number; otherwise,
    if the number grew, the trial at the new boundary is promoted unless it already was.
    """
    old_num = int(len(entries) / divisor)
    num = int((len(entries) + 1) / divisor)
    index = bisect.bisect_right(entries, metric, key=_metric)
    now = index < num
    entries.insert(index, [request_id, metric, now])
    if now:
        return request_id
    if num != old_num and not entries[old_num][2]:
        entries[old_num][2] = True
        return str(entries[old_num][0])
    return None


def continue_training(entries: list[Entry], request_id: str, metric: float, divisor: float) -> bool:
    """Insert a result into a rung (in place); whether the trial ranks in the top
    ``max(int(n / divisor), 1)`` so far (stopping-based ASHA; ties rank the newcomer first)."""
    num = max(int((len(entries) + 1) / divisor), 1)
    index = bisect.bisect_left(entries, metric, key=_metric)
    entries.insert(index, [request_id, metric, index < num])
    return index < num


def asha_progress(bottom_rung_results: int, completed: int, max_trials: int) -> float:
    """Determined's estimate: trials seen at the bottom rung with 20% overhead, then trials closed."""
    progress = bottom_rung_results / (1.2 * max_trials)
    if bottom_rung_results >= max_trials:
        progress = max(completed / max_trials, progress)
    return progress


class AsyncHalving(Algorithm):
    name = "async_halving"

    def __init__(
        self,
        config: SearcherConfig,
        num_rungs: int | None = None,
        max_trials: int | None = None,
        max_concurrent_trials: int | None = None,
        space: hparams.Space | None = None,
        model: ModelProposals | None = None,
    ) -> None:
        """``proposals: model`` needs the ``space``, or a ``model`` shared with other brackets."""
        assert config.max_length is not None
        self.num_rungs = num_rungs if num_rungs is not None else config.num_rungs
        self.max_trials = max_trials if max_trials is not None else config.max_trials
        mct = max_concurrent_trials if max_concurrent_trials is not None else config.max_concurrent_trials
        self.divisor = config.divisor
        self.pause_mode = config.promotion == "pause"
        self.lengths = rung_lengths(config.max_length, config.divisor, self.num_rungs)
        self.initial_trials = default_max_concurrent(self.max_trials, mct, self.divisor, self.num_rungs)
        self.rungs: list[list[Entry]] = [[] for _ in range(self.num_rungs)]
        self.trial_rung: dict[str, int] = {}
        self.awaiting: set[str] = set()  # trials training towards their current rung
        self.early_exit: set[str] = set()
        self.finished: set[str] = set()  # stopped or exited
        self.invalid = 0
        self.completed = 0
        self.owns_model = model is None and config.proposals == "model"
        if self.owns_model:
            assert space is not None, "proposals: model needs the hyperparameter space"
            model = ModelProposals(space)
        self.model = model
        if model is not None:
            model.sources.append(self)

    # ---- helpers --------------------------------------------------------------------------------
    def _create(self, ctx: Context) -> list[Op]:
        create = self.model.create(ctx) if self.model is not None else ctx.create()
        self.trial_rung[create.request_id] = 0
        self.awaiting.add(create.request_id)
        return [create, validate_after(create.request_id, self.lengths[0])]

    def _can_create(self) -> bool:
        return len(self.trial_rung) - self.invalid < self.max_trials

    def _stop(self, request_id: str) -> list[Op]:
        if request_id in self.early_exit or request_id in self.finished:
            return []
        self.finished.add(request_id)
        return [stop(request_id)]

    def _close_out(self) -> list[Op]:
        """Stop unpromoted trials in every rung, bottom up, that can receive no more results."""
        ops: list[Op] = []
        for r, entries in enumerate(self.rungs):
            if any(self.trial_rung[rid] == r for rid in self.awaiting):
                break
            for rid, _, promoted in entries:
                if not promoted:
                    ops += self._stop(rid)
        return ops

    # ---- the two variants ------------------------------------------------------------------------
    def _record_promoting(self, ctx: Context, rid: str, metric: float) -> list[Op]:
        r = self.trial_rung[rid]
        self.awaiting.discard(rid)
        ops: list[Op] = []
        started_work = False
        if r == self.num_rungs - 1:
            bisect.insort(self.rungs[r], [rid, metric, False], key=_metric)
            ops += self._stop(rid)
        else:
            promoted = promote_async(self.rungs[r], rid, metric, self.divisor)
            if promoted != rid and rid not in self.early_exit:
                ops.append(pause(rid))
            if promoted is not None:
                self.trial_rung[promoted] = r + 1
                if promoted in self.early_exit:
                    # As if it had run and reported the worst possible result.
                    return ops + self._record_promoting(ctx, promoted, WORST_METRIC)
                self.awaiting.add(promoted)
                if promoted != rid:
                    ops.append(resume(promoted))
                ops.append(validate_after(promoted, self.lengths[r + 1]))
                started_work = True
        if not started_work and self._can_create():
            ops += self._create(ctx)
        if len(self.rungs[0]) >= self.max_trials:
            ops += self._close_out()
        return ops

    def _record_stopping(self, ctx: Context, rid: str, metric: float) -> list[Op]:
        r = self.trial_rung[rid]
        self.awaiting.discard(rid)
        ops: list[Op] = []
        if r == self.num_rungs - 1:
            bisect.insort(self.rungs[r], [rid, metric, False], key=_metric)
            ops += self._stop(rid)
        elif continue_training(self.rungs[r], rid, metric, self.divisor) and rid not in self.early_exit:
            self.trial_rung[rid] = r + 1
            self.awaiting.add(rid)
            return [validate_after(rid, self.lengths[r + 1])]
        else:
            ops += self._stop(rid)
        if self._can_create():
            ops += self._create(ctx)
        return ops

    def _record(self, ctx: Context, rid: str, metric: float) -> list[Op]:
        if self.pause_mode:
            return self._record_promoting(ctx, rid, metric)
        return self._record_stopping(ctx, rid, metric)

    # ---- events ----------------------------------------------------------------------------------
    def initial(self, ctx: Context) -> list[Op]:
        ops: list[Op] = []
        for _ in range(self.initial_trials):
            ops += self._create(ctx)
        return ops

    def validated(self, ctx: Context, request_id: str, metric: float, units: int) -> list[Op]:
        return self._record(ctx, request_id, metric)

    def exited_early(self, ctx: Context, request_id: str, reason: ExitedReason) -> list[Op]:
        self.early_exit.add(request_id)
        self.finished.add(request_id)
        if reason == ExitedReason.INVALID_HP:
            self.invalid += 1
            self.awaiting.discard(request_id)
            for entries in self.rungs:
                entries[:] = [e for e in entries if e[0] != request_id]
            ops = self._create(ctx)
            return ops + (
                self._close_out() if self.pause_mode and len(self.rungs[0]) >= self.max_trials else []
            )
        if request_id not in self.awaiting:
            return []  # paused, already counted at its rung; if promoted later it records the worst result
        return self._record(ctx, request_id, WORST_METRIC)

    def closed(self, ctx: Context, request_id: str) -> list[Op]:
        self.finished.add(request_id)
        self.completed += 1
        return []

    def progress(self, units: Mapping[str, int], closed: set[str], invalid: set[str]) -> float:
        return asha_progress(len(self.rungs[0]), self.completed - self.invalid, self.max_trials)

    # ---- what the proposal model sees -----------------------------------------------------------
    def model_results(self) -> Iterator[tuple[int, str, float]]:
        for length, entries in zip(self.lengths, self.rungs, strict=True):
            for rid, metric, _ in entries:
                yield length, rid, metric

    # ---- state -----------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {
            "rungs": [[list(e) for e in entries] for entries in self.rungs],
            "trial_rung": [[rid, r] for rid, r in self.trial_rung.items()],
            "awaiting": sorted(self.awaiting),
            "early_exit": sorted(self.early_exit),
            "finished": sorted(self.finished),
            "invalid": self.invalid,
            "completed": self.completed,
            **({"model": self.model.get_state()} if self.owns_model and self.model is not None else {}),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.rungs = [[[str(rid), float(m), bool(p)] for rid, m, p in entries] for entries in state["rungs"]]
        self.trial_rung = {str(rid): int(r) for rid, r in state["trial_rung"]}
        self.awaiting = set(state["awaiting"])
        self.early_exit = set(state["early_exit"])
        self.finished = set(state["finished"])
        self.invalid = int(state["invalid"])
        self.completed = int(state["completed"])
        if self.owns_model and self.model is not None:
            self.model.set_state(state["model"])


def max_rungs_that_fit(max_length: int, divisor: float) -> int:
    return int(math.log(max_length) / math.log(divisor)) + 1
