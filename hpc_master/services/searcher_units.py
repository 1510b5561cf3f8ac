"""How far a trial has trained, in the searcher's unit, from what the harness reported."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def searcher_units(config: Mapping[str, Any], steps_completed: int, metrics: Mapping[str, Any]) -> int:
    """Units of the searcher's length for a validation reported at `steps_completed` (batches).

    The 0.38 form (`time_metric`) reads the named metric from the report when present; the ≤0.37 form
    (`max_length: {batches|records|epochs: N}`) converts batches with `global_batch_size` and
    `records_per_epoch`, as Determined does.
    """
    searcher = config.get("searcher") or {}
    time_metric = searcher.get("time_metric")
    if time_metric:
        avg = metrics.get("avgMetrics", metrics)
        value = avg.get(time_metric) if isinstance(avg, Mapping) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
        return steps_completed
    max_length = searcher.get("max_length")
    unit = next(iter(max_length), "batches") if isinstance(max_length, Mapping) and max_length else "batches"
    if unit == "batches":
        return steps_completed
    hparams = config.get("hyperparameters") or {}
    gbs = hparams.get("global_batch_size")
    if isinstance(gbs, Mapping):
        gbs = gbs.get("val")
    if not isinstance(gbs, int) or gbs <= 0:
        return steps_completed
    records = steps_completed * gbs
    if unit == "records":
        return records
    rpe = config.get("records_per_epoch")
    if not isinstance(rpe, int) or rpe <= 0:
        return steps_completed
    return math.floor(records / rpe)


def searcher_max_length(config: Mapping[str, Any]) -> int | None:
    """The most any search method asks one trial to train, in the searcher's unit (its last rung)."""
    searcher = config.get("searcher") or {}
    max_length = searcher.get("max_length")
    if isinstance(max_length, Mapping) and len(max_length) == 1:
        value = next(iter(max_length.values()))
    else:
        value = searcher.get("max_time")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
