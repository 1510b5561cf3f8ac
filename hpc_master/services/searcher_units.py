"""How far a trial has trained, in the searcher's unit, from what the harness reported."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from hpc_master.expconf import ExperimentConfig


def searcher_units(config: ExperimentConfig, steps_completed: int, metrics: Mapping[str, Any]) -> int:
    """Units of the searcher's length for a validation reported at `steps_completed` (batches).

    The 0.38 form (`time_metric`) reads the named metric from the report when present; the ≤0.37 form
    (`max_length: {batches|records|epochs: N}`) converts batches with `global_batch_size` and
    `records_per_epoch`, as Determined does.
    """
    searcher = config.searcher
    time_metric = getattr(searcher, "time_metric", None)
    if time_metric:
        return _reported_units(time_metric, steps_completed, metrics)
    max_length = getattr(searcher, "max_length", None)
    unit = max_length.unit if max_length is not None else "batches"
    if unit == "batches":
        return steps_completed
    gbs = config.global_batch_size
    if gbs is None or gbs <= 0:
        return steps_completed
    records = steps_completed * gbs
    if unit == "records":
        return records
    rpe = config.records_per_epoch
    if rpe <= 0:
        return steps_completed
    return math.floor(records / rpe)


def _reported_units(time_metric: str, steps_completed: int, metrics: Mapping[str, Any]) -> int:
    """The 0.38 form: the reported `time_metric` (its average when nested), else `steps_completed`."""
    avg = metrics.get("avgMetrics", metrics)
    value = avg.get(time_metric) if isinstance(avg, Mapping) else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    return steps_completed


def searcher_max_length(config: ExperimentConfig) -> int | None:
    """The most any search method asks one trial to train, in the searcher's unit (its last rung)."""
    searcher = config.searcher
    max_length = getattr(searcher, "max_length", None)
    value = max_length.value if max_length is not None else getattr(searcher, "max_time", None)
    return value if isinstance(value, int) and value > 0 else None
