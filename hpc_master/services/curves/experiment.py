"""Learning curves of whole experiments, downsampled on the server and kept warm between requests.

Each experiment's curves live in an ``ExperimentCurves``: for every (group, metric name) and trial, a
``MinMaxCurve`` (``services.curves.downsample``). A refresh reads only the metric rows it has not seen (by id), so
each row is parsed once however often the web UI asks; a page of 1,000 trials × 10,000 points costs a few
hundred points per trial to serialise, not ten million rows to read.

Ids are not committed in order on PostgreSQL (two transactions may commit out of order), so a refresh re-reads
the ids of the last ``LAG_IDS`` ids of the experiment and takes any it has not seen; SQLite commits one writer
at a time, in id order, and the same code is merely exact there.

The curves are also saved in the database (``metric_curves``, one row per trial and metric, and
``metric_curve_marks``: how far each experiment's saved curves have read), by ``services.curves.keeper``, which
keeps the curves of experiments that receive metrics up to date in the background. A restarted master starts
from them and reads only the rows after them: the first page of a 1,000-trial experiment after a restart reads
a few MB of buckets, not ten million rows of JSON.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from sqlalchemy import Text, delete, func, insert, or_, select, type_coerce
from sqlalchemy.orm import Session

from hpc_master.db.models import (
    MetricCurveMarkModel,
    MetricCurveModel,
    MetricModel,
    TrialModel,
    TrialRunModel,
    utcnow,
)
from hpc_master.services.curves.downsample import Floats, Ints, MinMaxCurve, downsample_many
from hpc_master.services.states import LIVE_RUN_STATES

log = logging.getLogger(__name__)

LAG_IDS = 5000
"""How far behind the newest id seen a refresh looks again for rows committed late."""
KEEP_EXPERIMENTS = 8
"""Experiments whose curves stay in memory (least recently used dropped first)."""
KEEP_RENDERED = 2
"""Serialised first answers kept per experiment (a metric at one width; two for a second metric or width)."""
BUCKETS_PER_CURVE = 256
"""Each kept curve holds at most 2 × this many buckets (each a min and a max point): ≥ 512 points, more than
the page asks of one trial (one per pixel column, ≤ 1,000), ≤ 20 KB saved."""
TRIALS_PER_READ = 4
"""Trials read per transaction by a first read without saved curves (10,000 rows each: ~0.1 s)."""
ENDED_RECENTLY_S = 600
"""A run that ended this long before a refresh may still have had rows in flight (the ingest worker's
batches, a save lagging its read): its trial is looked at once more."""
MAX_NAME = 1024
"""Metrics with longer names are not drawn (nor kept or saved)."""

_COLUMNS = (
    MetricModel.id,
    MetricModel.trial_id,
    MetricModel.group,
    MetricModel.steps_completed,
    type_coerce(MetricModel.metrics, Text),  # parsed by orjson here, not by the JSON type
)

SeriesKey = tuple[str, str]
"""(group, metric name)."""


def numeric_metrics(metrics: Any) -> dict[str, float]:
    """A report's numbers: Determined's ``{"avgMetrics": {...}, "batchMetrics": [...]}`` or a flat mapping."""
    avg = metrics.get("avgMetrics", metrics) if isinstance(metrics, dict) else None
    if not isinstance(avg, dict):
        return {}
    return {
        k: float(v)
        for k, v in avg.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and isinstance(k, str)
    }


@dataclass
class ExperimentCurves:
    experiment_id: int
    last_id: int = 0
    recent: set[int] = field(default_factory=set)
    """Ids seen within ``LAG_IDS`` of ``last_id`` (so a late-committed row is taken once)."""
    series: dict[SeriesKey, dict[int, MinMaxCurve]] = field(default_factory=dict)
    changed: dict[tuple[SeriesKey, int], int] = field(default_factory=dict)
    """(series, trial) → the refresh generation that last added a point to it."""
    scanned_to: int = 0
    read_at: dt.datetime | None = None
    """When the last refresh read (for curves loaded from the database: when the saved copy was read)."""
    """The newest metric id (of any experiment) a refresh has seen: the next one reads only after it."""
    generation: int = 0
    saved_generation: int = 0
    """The generation the database's copy (``metric_curves``) holds; nothing saved yet: 0."""
    looked_for_saved: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    rendered: OrderedDict[Any, tuple[int, bytes]] = field(default_factory=OrderedDict)
    """A query's serialised first answer and the generation it was made at (``KEEP_RENDERED`` kept)."""

    def rendered_line(self, key: Any, generation: int) -> bytes | None:
        with self.lock:
            hit = self.rendered.get(key)
            if hit is None or hit[0] != generation:
                return None
            self.rendered.move_to_end(key)
            return hit[1]

    def keep_rendered_line(self, key: Any, generation: int, line: bytes) -> None:
        with self.lock:
            self.rendered[key] = (generation, line)
            self.rendered.move_to_end(key)
            while len(self.rendered) > KEEP_RENDERED:
                self.rendered.popitem(last=False)

    def refresh(self, transaction: Callable[[], AbstractContextManager[Session]]) -> int:
        """Read the rows not yet seen; returns the generation now current. The first refresh starts from the
        saved curves (``metric_curves``), when there are any, and reads only the rows after them.

        ``transaction`` opens the short transaction it reads in, once it holds this experiment's lock:
        the lock is always taken before a database connection, never while holding one, so requests that
        hold a connection never wait on the lock (with a pool of a few connections, the other order
        deadlocks)."""
        started = utcnow()
        with self.lock:
            if not self.looked_for_saved:
                with transaction() as session:
                    self._load_saved(session)
                self.looked_for_saved = True
            if self.last_id == 0:
                return self._read_everything(transaction, started)
            return self._read_new(transaction, started)

    def _read_everything(
        self, transaction: Callable[[], AbstractContextManager[Session]], started: dt.datetime
    ) -> int:
        """The first read without saved curves: every row, up to the newest id now, a few trials per
        transaction (so that a search of ten million rows never holds the database for long: on SQLite
        the master has one connection), each trial's curves built from all its points at once."""
        with transaction() as session:
            trial_ids = list(
                session.scalars(
                    select(TrialModel.id)
                    .where(TrialModel.experiment_id == self.experiment_id)
                    .order_by(TrialModel.id)
                )
            )
            newest = session.scalar(select(func.max(MetricModel.id))) or 0
            mine = set(trial_ids)
            recent = {i for i, t in self._ids_after(session, newest - LAG_IDS) if t in mine and i <= newest}
        if not newest:
            return self.generation
        for start in range(0, len(trial_ids), TRIALS_PER_READ):
            with transaction() as session:
                rows = session.execute(
                    select(*_COLUMNS).where(
                        MetricModel.trial_id.in_(trial_ids[start : start + TRIALS_PER_READ]),
                        MetricModel.id <= newest,
                    )
                )
                self._load_all(rows)
        self.generation += 1
        for key in self.changed:
            self.changed[key] = self.generation
        self.last_id, self.recent, self.read_at = newest, recent, started
        return self.generation

    def _read_new(
        self, transaction: Callable[[], AbstractContextManager[Session]], started: dt.datetime
    ) -> int:
        """The rows after the last read, of the trials that can have any."""
        with transaction() as session:
            # Only a trial with a live run, or one that ended after the last read (less a margin for rows
            # in flight), can have rows not read yet: an experiment that is not running costs one small
            # query, however many rows it has.
            since = (self.read_at or started) - dt.timedelta(seconds=ENDED_RECENTLY_S)
            self.read_at = started
            live = self._live_trials(session, since)
            if not live:
                return self.generation
            ids = self._unread_ids(session, live)
            if not ids:
                return self.generation
            ids.sort()
            self.generation += 1
            for chunk in range(0, len(ids), 500):
                for _, trial_id, group, steps, metrics in session.execute(
                    select(*_COLUMNS)
                    .where(MetricModel.id.in_(ids[chunk : chunk + 500]))
                    .order_by(MetricModel.id)
                ):
                    self._add(trial_id, group, steps, metrics)
            self.last_id = max(self.last_id, ids[-1])
            cut = self.last_id - LAG_IDS
            self.recent = {i for i in self.recent if i > cut}
            self.recent.update(i for i in ids if i > cut)
            return self.generation

    def _live_trials(self, session: Session, since: dt.datetime) -> set[int]:
        """The experiment's trials with a live run, or with a run that ended after `since`."""
        return set(
            session.scalars(
                select(TrialRunModel.trial_id)
                .join(TrialModel, TrialModel.id == TrialRunModel.trial_id)
                .where(
                    TrialModel.experiment_id == self.experiment_id,
                    or_(
                        TrialRunModel.state.in_(LIVE_RUN_STATES),
                        TrialRunModel.end_time > since,
                    ),
                )
            )
        )

    def _unread_ids(self, session: Session, live: set[int]) -> list[int]:
        """The ids of the `live` trials' rows not read yet, from ``LAG_IDS`` before the newest id seen (or
        scanned) on; advances ``scanned_to``."""
        floor = max(0, max(self.last_id, self.scanned_to) - LAG_IDS)
        ids = []
        for row_id, trial_id in self._ids_after(session, floor):
            self.scanned_to = max(self.scanned_to, row_id)
            if trial_id in live and row_id not in self.recent:
                ids.append(row_id)
        return ids

    @staticmethod
    def _ids_after(session: Session, floor: int) -> list[tuple[int, int]]:
        """(id, trial id) of every metric row after ``floor``, whatever its experiment, read by the primary
        key's range: filtering by trial in SQL would let the database walk every row of each trial instead
        (the index that starts with ``trial_id``), ten million entries for a large search."""
        # Through the driver's own cursor: SQLAlchemy's rows cost ~2 µs each, five times the query, and a
        # refresh reads LAG_IDS of them every time. ``floor`` is an int, written into the SQL as one.
        cursor = session.connection().connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(f"SELECT id, trial_id FROM metrics WHERE id > {int(floor)}")
            return list(cursor.fetchall())
        finally:
            cursor.close()

    def _load_saved(self, session: Session) -> bool:
        """Start from the curves saved in the database; whether there were any (a copy that does not read
        back is ignored, and every row is read again)."""
        mark = session.get(MetricCurveMarkModel, self.experiment_id)
        if mark is None:
            return False
        series: dict[SeriesKey, dict[int, MinMaxCurve]] = {}
        rows = session.execute(
            select(
                MetricCurveModel.trial_id,
                MetricCurveModel.group,
                MetricCurveModel.name,
                MetricCurveModel.data,
            )
            .join(TrialModel, TrialModel.id == MetricCurveModel.trial_id)
            .where(TrialModel.experiment_id == self.experiment_id)
        )
        try:
            for trial_id, group, name, data in rows:
                series.setdefault((group, name), {})[trial_id] = MinMaxCurve.from_bytes(bytes(data))
            recent = np.frombuffer(bytes(mark.recent), dtype="<i8").tolist()
        except ValueError as exc:
            log.warning(
                "experiment %d: its saved curves do not read back (%s); reading every row",
                self.experiment_id,
                exc,
            )
            return False
        self.generation += 1
        self.series = series
        self.changed = {(key, t): self.generation for key, per_trial in series.items() for t in per_trial}
        self.saved_generation = self.generation
        self.last_id, self.recent, self.read_at = int(mark.last_id), set(recent), mark.updated_at
        return True

    def unsaved(self) -> bool:
        with self.lock:
            return self.generation > self.saved_generation

    def save(self, transaction: Callable[[], AbstractContextManager[Session]]) -> int:
        """Write the curves changed since the last save (each changed trial's curves whole) and how far they
        read, in one transaction; returns how many curves were written."""
        with self.lock:
            generation = self.generation
            if generation <= self.saved_generation or not self.last_id:
                return 0
            trials = {t for (_, t), g in self.changed.items() if g > self.saved_generation}
            rows = self._curve_rows(trials)
            last_id, read_at = self.last_id, self.read_at or utcnow()
            recent = np.fromiter(sorted(self.recent), dtype="<i8", count=len(self.recent)).tobytes()
        with transaction() as session:
            if trials:
                session.execute(delete(MetricCurveModel).where(MetricCurveModel.trial_id.in_(sorted(trials))))
            if rows:
                session.execute(insert(MetricCurveModel), rows)
            self._write_mark(session, last_id, recent, read_at)
        with self.lock:
            self.saved_generation = max(self.saved_generation, generation)
        return len(rows)

    def _curve_rows(self, trials: set[int]) -> list[dict[str, Any]]:
        """The ``metric_curves`` rows of `trials`' curves (held under the lock)."""
        return [
            {"trial_id": t, "group": group, "name": name, "data": per_trial[t].to_bytes()}
            for (group, name), per_trial in self.series.items()
            for t in trials & per_trial.keys()
        ]

    def _write_mark(self, session: Session, last_id: int, recent: bytes, read_at: dt.datetime) -> None:
        """Record how far the saved curves read (the experiment's ``metric_curve_marks`` row, made if new)."""
        mark = session.get(MetricCurveMarkModel, self.experiment_id)
        if mark is None:
            mark = MetricCurveMarkModel(experiment_id=self.experiment_id)
            session.add(mark)
        mark.last_id, mark.recent, mark.updated_at = last_id, recent, read_at

    def _load_all(self, rows: Iterable[Any]) -> None:
        """Rows of whole trials: their numbers gathered per (group, name, trial), then each curve built from
        its points at once."""
        for (group, name, trial_id), (steps_list, values) in _gather(rows).items():
            series = (group, name)
            self.series.setdefault(series, {})[trial_id] = MinMaxCurve.from_points(
                steps_list, values, BUCKETS_PER_CURVE
            )
            self.changed[(series, trial_id)] = 0

    def _add(self, trial_id: int, group: str, steps: int, metrics: Any) -> None:
        if isinstance(metrics, str | bytes):
            metrics = orjson.loads(metrics)
        for name, value in numeric_metrics(metrics).items():
            if len(name) > MAX_NAME:
                continue
            key = (group, name)
            per_trial = self.series.setdefault(key, {})
            curve = per_trial.get(trial_id)
            if curve is None:
                curve = per_trial[trial_id] = MinMaxCurve(max_buckets=BUCKETS_PER_CURVE)
            curve.add(int(steps), value)
            self.changed[(key, trial_id)] = self.generation

    def names(self) -> dict[str, list[str]]:
        with self.lock:
            out: dict[str, list[str]] = {}
            for group, name in sorted(self.series):
                out.setdefault(group, []).append(name)
            return out

    def sample(
        self, group: str, name: str, max_points: int, *, since_generation: int = -1
    ) -> dict[int, tuple[Ints, Floats]]:
        """Trial id → its downsampled curve (steps, values), for the trials whose curve changed after
        ``since_generation``."""
        with self.lock:
            key = (group, name)
            per_trial = self.series.get(key, {})
            chosen = [t for t in per_trial if self.changed.get((key, t), 0) > since_generation]
            return dict(zip(chosen, downsample_many([per_trial[t] for t in chosen], max_points), strict=True))


def _gather(rows: Iterable[Any]) -> dict[tuple[str, str, int], tuple[list[int], list[float]]]:
    """The numbers of metric rows, as (steps, values) per (group, name, trial); a name longer than ``MAX_NAME``
    and values that are not numbers are skipped."""
    gathered: dict[tuple[str, str, int], tuple[list[int], list[float]]] = {}
    loads = orjson.loads
    for _, trial_id, group, steps, metrics in rows:
        if isinstance(metrics, str | bytes):
            metrics = loads(metrics)
        avg = metrics.get("avgMetrics", metrics) if isinstance(metrics, dict) else None
        if not isinstance(avg, dict):
            continue
        for name, value in avg.items():
            kind = type(value)
            if kind is not float and kind is not int:  # bool, str, None, lists: not a point
                continue
            key = (group, name, trial_id)
            points = gathered.get(key)
            if points is None:
                if len(name) > MAX_NAME:
                    continue
                points = gathered[key] = ([], [])
            points[0].append(steps)
            points[1].append(value)
    return gathered


class CurveCache:
    """The master's ``ExperimentCurves``, least recently used dropped beyond ``KEEP_EXPERIMENTS``."""

    def __init__(self, keep: int = KEEP_EXPERIMENTS) -> None:
        self.keep = keep
        self._entries: OrderedDict[int, ExperimentCurves] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, experiment_id: int) -> ExperimentCurves:
        with self._lock:
            entry = self._entries.get(experiment_id)
            if entry is None:
                entry = self._entries[experiment_id] = ExperimentCurves(experiment_id)
            self._entries.move_to_end(experiment_id)
            while len(self._entries) > self.keep:
                self._entries.popitem(last=False)
            return entry

    def entries(self) -> list[tuple[int, ExperimentCurves]]:
        with self._lock:
            return list(self._entries.items())

    def forget(self, experiment_id: int) -> None:
        with self._lock:
            self._entries.pop(experiment_id, None)
