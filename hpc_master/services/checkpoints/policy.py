"""Which checkpoints a garbage-collection policy keeps: Determined's semantics, as pure functions.

A policy is the three ``checkpoint_storage`` fields (defaults as in Determined):

- ``save_experiment_best`` (0): the N best checkpoints of the whole experiment;
- ``save_trial_best`` (1): the N best checkpoints of each trial;
- ``save_trial_latest`` (1): the N latest checkpoints of each trial.

A checkpoint is kept when any of the three keeps it (the union). "Best" is by the searcher metric of the
validation the trial reported at the checkpoint's ``steps_completed`` (``smaller_is_better`` says which way);
a checkpoint with no such validation is never among the best, only perhaps among the latest. "Latest" is by
``steps_completed``. As Determined's query (``ExperimentCheckpointsToGCRaw``): delete when
``((experiment_rank > E and trial_rank > T) or no metric) and trial_order_rank > L``.

Two differences, on purpose: ranks are strict (ties in metric go to the checkpoint reported first, ties in
steps to the one reported last), so a policy of N keeps at most N directories, where Determined's ``rank()``
keeps every checkpoint at a tied step; and only checkpoints that still exist are ranked (Determined ranks
deleted ones too, so deleting the best by hand made the next best deletable as well). A NaN metric (a
diverged loss) counts as no metric.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GC_FIELDS = ("save_experiment_best", "save_trial_best", "save_trial_latest")


@dataclass(frozen=True)
class GCPolicy:
    save_experiment_best: int = 0
    save_trial_best: int = 1
    save_trial_latest: int = 1

    @classmethod
    def of(cls, storage: Any, default: GCPolicy | None = None) -> GCPolicy:
        """The policy of a ``checkpoint_storage`` mapping; fields it lacks (or that are not counts) come from
        `default` (the master's policy), then Determined's defaults."""
        base = default or cls()
        values = {name: getattr(base, name) for name in GC_FIELDS}
        if isinstance(storage, Mapping):
            for name in GC_FIELDS:
                value = storage.get(name)
                if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                    values[name] = value
        return cls(**values)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in GC_FIELDS}


@dataclass(frozen=True)
class CheckpointFacts:
    """What the policy reads of one checkpoint."""

    uuid: str
    trial_id: int
    steps_completed: int
    report_time: dt.datetime
    metric: float | None
    """The searcher metric of the trial's validation at the same steps; None when it has none."""


def _ranked(metric: float | None) -> bool:
    return metric is not None and not math.isnan(metric)


def _best_first(items: Iterable[CheckpointFacts], smaller_is_better: bool) -> list[CheckpointFacts]:
    sign = 1.0 if smaller_is_better else -1.0
    ranked = [c for c in items if _ranked(c.metric)]
    return sorted(ranked, key=lambda c: (sign * float(c.metric or 0.0), c.report_time, c.uuid))


def _latest_first(items: Iterable[CheckpointFacts]) -> list[CheckpointFacts]:
    # Newest report first among equal steps; the uuid only makes the order total.
    by_time = sorted(items, key=lambda c: (c.report_time, c.uuid), reverse=True)
    return sorted(by_time, key=lambda c: c.steps_completed, reverse=True)


def checkpoints_to_keep(
    checkpoints: Sequence[CheckpointFacts], policy: GCPolicy, *, smaller_is_better: bool
) -> set[str]:
    """The uuids the policy keeps among `checkpoints` (every existing checkpoint of one experiment)."""
    keep = {c.uuid for c in _best_first(checkpoints, smaller_is_better)[: policy.save_experiment_best]}
    by_trial: dict[int, list[CheckpointFacts]] = defaultdict(list)
    for c in checkpoints:
        by_trial[c.trial_id].append(c)
    for items in by_trial.values():
        keep.update(c.uuid for c in _best_first(items, smaller_is_better)[: policy.save_trial_best])
        keep.update(c.uuid for c in _latest_first(items)[: policy.save_trial_latest])
    return keep


def checkpoints_to_delete(
    checkpoints: Sequence[CheckpointFacts],
    policy: GCPolicy,
    *,
    smaller_is_better: bool,
    collectable_trials: Collection[int],
    protected: Collection[str] = (),
) -> list[str]:
    """The uuids to delete: those the policy does not keep, of trials in `collectable_trials` only (trials no
    job runs for: paused or ended), never one in `protected` (the latest checkpoint of a trial that can still
    run, a checkpoint registered as a model version). Ranks are over every checkpoint given, so a running
    trial's checkpoints, and protected ones, count against the others'."""
    keep = checkpoints_to_keep(checkpoints, policy, smaller_is_better=smaller_is_better)
    return [
        c.uuid
        for c in sorted(checkpoints, key=lambda c: (c.trial_id, c.steps_completed, c.report_time, c.uuid))
        if c.uuid not in keep and c.trial_id in collectable_trials and c.uuid not in protected
    ]
