"""The rows ``bench/pg_scale_reads.py`` copies into each table, from the plan (``_pg_scale_plan``).

Trials, runs, checkpoints, events and searcher completions are what the master would have recorded for the
searches the plan simulated; metric rows are written as the harness reports them (``{"avgMetrics": {...}}``
in orjson's compact layout) and in the order they would arrive: the trials of an experiment run
``WORKERS`` at a time and their reports interleave by time, so a trial's rows are spread over the table as
they are in a real database (rows copied trial by trial would make every per-trial read look better).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
from _pg_scale_plan import VALIDATION_EVERY, WORKERS, ExperimentPlan, TrialPlan

NOW = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
"""The build's "now" (fixed: the same plan gives the same rows)."""
SECONDS_PER_BATCH = 0.08

_TRAIN = '{"avgMetrics":{"loss":%r,"lr":%s}}'
_VALID = '{"avgMetrics":{"validation_loss":%r,"accuracy":%r}}'
_LINE = "%d\t%d\t%d\t%s\t%d\t%s\t%s+00\n"

RUN_END = {
    "COMPLETED": ("COMPLETED", "SEARCHER_DONE"),
    "ERROR": ("FAILED", "NONZERO_EXIT"),
    "CANCELED": ("CANCELED", "CANCELED_BY_USER"),
    "PAUSED": ("PREEMPTED", "PAUSED_BY_SEARCHER"),
}


def started(plan: ExperimentPlan) -> dt.datetime:
    return NOW - dt.timedelta(days=plan.age_days)


def _trial_start(plan: ExperimentPlan, index: int) -> dt.datetime:
    length = int(plan.config["searcher"]["max_length"]["batches"])
    wave_s = length * SECONDS_PER_BATCH / 8  # most trials of a wave stop early (ASHA)
    return started(plan) + dt.timedelta(seconds=(index // WORKERS) * wave_s + index % WORKERS)


def _length(plan: ExperimentPlan) -> int:
    return int(plan.config["searcher"]["max_length"]["batches"])


def _run_boundaries(t: TrialPlan) -> list[int]:
    """Where each later run of the trial began: it was paused after a validation and resumed."""
    return sorted({u for u, _ in t.validations})[: t.resumes]


def _ended(plan: ExperimentPlan, t: TrialPlan, index: int) -> dt.datetime | None:
    if t.state in ("ACTIVE", "PAUSED"):
        return None
    return _trial_start(plan, index) + dt.timedelta(seconds=t.units * SECONDS_PER_BATCH + 60)


# ---------------------------------------------------------------- the small tables


def trial_rows(plan: ExperimentPlan) -> Iterator[tuple[Any, ...]]:
    for index, t in enumerate(plan.trials):
        metrics = [m for _, m in t.validations]
        paused_by = "PAUSED_BY_USER" if plan.state == "PAUSED" and not t.paused else "PAUSED_BY_SEARCHER"
        open_op = t.state == "ACTIVE" or (t.state == "PAUSED" and not t.paused)
        yield (
            t.id, plan.id, t.request_id, t.hparams, t.seed, t.state, int(t.errored), len(_runs(t)),
            _checkpoint_uuid(t, len(t.validations) - 1) if t.validations else None, t.units,
            metrics[-1] if metrics else None, min(metrics) if metrics else None,
            min(1.0, t.units / _length(plan)), t.target if open_op else None, t.closed or t.stopped,
            None, paused_by if t.state == "PAUSED" else None, None, len(_runs(t)) + 1,
            _trial_start(plan, index), _ended(plan, t, index),
        )  # fmt: skip


def _runs(t: TrialPlan) -> list[tuple[str, str | None]]:
    """(state, exit reason) of each run of the trial, oldest first."""
    earlier = [("PREEMPTED", "PAUSED_BY_SEARCHER")] * len(_run_boundaries(t))
    if t.live is not None:
        return [*earlier, (t.live, None)]
    if t.state == "PAUSED":
        return [*earlier, ("PREEMPTED", "PAUSED_BY_SEARCHER" if t.paused else "PAUSED_BY_USER")]
    return [*earlier, RUN_END[t.state]]


def run_rows(plan: ExperimentPlan, first_run_id: int) -> Iterator[tuple[Any, ...]]:
    run_id = first_run_id
    for index, t in enumerate(plan.trials):
        start = _trial_start(plan, index)
        for number, (state, reason) in enumerate(_runs(t), start=1):
            pending = state == "PENDING"
            end = None if state in ("PENDING", "RUNNING") else start + dt.timedelta(hours=1)
            yield (
                run_id, t.id, number, str(700_000 + run_id), None if pending else f"gpu{run_id % 48:02d}",
                state, reason, None, None, False, False, 2 if end else 1, start,
                None if pending else start + dt.timedelta(seconds=30), end,
                "Priority" if pending else None, start if pending else None,
            )  # fmt: skip
            run_id += 1


def _checkpoint_uuid(t: TrialPlan, k: int) -> str:
    return str(uuid.UUID(int=(t.id << 16) + k))


def checkpoint_rows(plan: ExperimentPlan) -> Iterator[tuple[Any, ...]]:
    """A checkpoint at each validation the searcher saw; the GC kept the latest and the best."""
    for index, t in enumerate(plan.trials):
        if not t.validations:
            continue
        best = min(range(len(t.validations)), key=lambda k: t.validations[k][1])
        start = _trial_start(plan, index)
        for k, (units, _) in enumerate(t.validations):
            kept = k in (best, len(t.validations) - 1)
            size = 40_000_000 + (t.id * 7919) % 9_000_000
            resources = {"state_dict.pth": size, "optimizer.pth": size * 2, "metadata.json": 214}
            metadata = {"steps_completed": units, "framework": "torch-2.4.0", "format": "pickle"}
            yield (
                _checkpoint_uuid(t, k), t.id, 1 + sum(b < units for b in _run_boundaries(t)), units,
                "COMPLETED" if kept else "DELETED", resources, metadata,
                start + dt.timedelta(seconds=units * SECONDS_PER_BATCH), sum(resources.values()), 0, None, None,
            )  # fmt: skip


def completion_rows(plan: ExperimentPlan, first_id: int) -> Iterator[tuple[Any, ...]]:
    """The validations the searcher consumed (the outbox keeps them, consumed)."""
    n = first_id
    for index, t in enumerate(plan.trials):
        for units, metric in t.validations:
            at = _trial_start(plan, index) + dt.timedelta(seconds=units * SECONDS_PER_BATCH)
            yield (n, t.id, units, metric, True, at)
            n += 1


def event_rows(plan: ExperimentPlan, first_run_id: int) -> Iterator[tuple[str, int, str | None, str, str]]:
    """(entity, id, old, new, reason): each trial's and run's state changes, and the experiment's."""
    yield ("experiment", plan.id, None, "ACTIVE", "created")
    if plan.state != "ACTIVE":
        yield ("experiment", plan.id, "ACTIVE", plan.state, "")
    run_id = first_run_id
    for t in plan.trials:
        yield ("trial", t.id, None, "ACTIVE", f"created by searcher ({t.request_id})")
        if t.state != "ACTIVE":
            yield ("trial", t.id, "ACTIVE", t.state, "")
        for state, reason in _runs(t):
            if state != "PENDING":
                yield ("trial_run", run_id, "PENDING", "RUNNING", "")
            if state not in ("PENDING", "RUNNING"):
                yield ("trial_run", run_id, "RUNNING", state, reason or "")
            run_id += 1


def run_count(plan: ExperimentPlan) -> int:
    return sum(len(_runs(t)) for t in plan.trials)


# ---------------------------------------------------------------- metric rows


def _trial_arrays(plan: ExperimentPlan, t: TrialPlan, index: int) -> tuple[np.ndarray[Any, Any], ...]:
    """(time µs, group 0/1, steps, run number, value, second value) of the trial's reports."""
    n_valid = t.rows // (VALIDATION_EVERY + 1) if t.rows > 1 else 0
    n_train = t.rows - n_valid
    units = max(t.units, 1)
    train = np.unique(np.round(np.linspace(units / max(n_train, 1), units, n_train)).astype(np.int64))
    valid = np.unique(np.round(np.linspace(units / max(n_valid, 1), units, n_valid)).astype(np.int64))
    steps = np.concatenate([train, valid])
    group = np.concatenate([np.zeros(len(train), np.int8), np.ones(len(valid), np.int8)])
    final = t.validations[-1][1] if t.validations else 0.9
    rng = np.random.default_rng(t.id)
    loss = final + (2.3 - final) * np.exp(-4.0 * steps / _length(plan)) + rng.normal(0, 0.02, len(steps))
    loss += group * 0.05
    runs = 1 + np.searchsorted(np.asarray(_run_boundaries(t), np.int64), steps, side="left")
    start_us = int(_trial_start(plan, index).timestamp() * 1e6)
    times = start_us + (steps * SECONDS_PER_BATCH * 1e6).astype(np.int64) + group * 5_000_000
    return times, group, steps, runs, loss, 1.0 - loss / 3.0


def metric_chunks(plan: ExperimentPlan, first_id: int) -> Iterator[tuple[bytes, int]]:
    """COPY text for ``metrics (id, trial_id, trial_run_id, "group", steps_completed, metrics,
    report_time)``, one chunk per wave of trials; yields (chunk, rows in it)."""
    row_id = first_id
    lrs = {t.id: repr(float(t.hparams.get("lr", 0.001))) for t in plan.trials}
    for wave in range(0, len(plan.trials), WORKERS):
        parts = []
        for index in range(wave, min(wave + WORKERS, len(plan.trials))):
            t = plan.trials[index]
            if t.rows:
                arrays = _trial_arrays(plan, t, index)
                parts.append((np.full(len(arrays[0]), t.id, np.int64), *arrays))
        if not parts:
            continue
        trial_ids, times, group, steps, runs, value, second = (
            np.concatenate(c) for c in zip(*parts, strict=True)
        )
        order = np.argsort(times, kind="stable")
        stamps = np.datetime_as_string(times[order].astype("datetime64[us]"), unit="us").tolist()
        lines = []
        for tid, g, s, r, v, w, stamp in zip(
            trial_ids[order].tolist(), group[order].tolist(), steps[order].tolist(), runs[order].tolist(),
            value[order].tolist(), second[order].tolist(), stamps, strict=True,
        ):  # fmt: skip
            body = _VALID % (v, w) if g else _TRAIN % (v, lrs[tid])
            lines.append(_LINE % (row_id, tid, r, "validation" if g else "training", s, body, stamp))
            row_id += 1
        yield "".join(lines).encode(), len(lines)
