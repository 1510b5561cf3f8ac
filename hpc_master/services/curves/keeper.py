"""Keeps learning curves ready before anyone asks: a background thread of the master that folds new metric
rows into their experiments' curves (``services.curves.experiment``) every few seconds and saves the curves in the
database, so the web UI's first request for an experiment (even the first after a restart) reads a few MB of
saved buckets plus the rows since, never every row of a large search.

Each pass asks which experiments have metric rows past the newest id it has seen (re-reading the last
``LAG_IDS`` ids, as ``ExperimentCurves.refresh`` does, for rows committed late on PostgreSQL), refreshes
those, and saves each experiment whose curves changed, at most every ``save_every_s`` (a curve changed for
the first time is saved at once). The saved copy is only a head start: a refresh always reads the rows after
what was saved, so a master killed between two saves loses nothing, it re-reads a little more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from hpc_master.db.models import MetricCurveMarkModel, MetricModel, TrialModel
from hpc_master.services.curves.experiment import LAG_IDS, CurveCache, ExperimentCurves

log = logging.getLogger(__name__)

Transaction = Callable[[], AbstractContextManager[Session]]


class CurveKeeper:
    def __init__(
        self,
        cache: CurveCache,
        transaction: Transaction,
        *,
        interval_s: float = 5.0,
        save_every_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache = cache
        self.transaction = transaction
        self.interval_s = interval_s
        self.save_every_s = save_every_s
        self.clock = clock
        self.seen: int | None = None
        """The newest metric id a pass has looked at (None: not started; then the newest saved mark)."""
        self._saved_at: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> list[int]:
        """One pass: refresh the experiments with new rows, save what is due. Returns the experiments
        refreshed."""
        with self.transaction() as session:
            newest = session.scalar(select(func.max(MetricModel.id))) or 0
            if self.seen is None:
                self.seen = session.scalar(select(func.max(MetricCurveMarkModel.last_id))) or 0
            experiments: list[int] = []
            if newest > self.seen or self.seen == 0:
                query = (
                    select(TrialModel.experiment_id)
                    .join(MetricModel, MetricModel.trial_id == TrialModel.id)
                    .distinct()
                )
                if self.seen:
                    query = query.where(MetricModel.id > self.seen - LAG_IDS)
                experiments = sorted(session.scalars(query))
        for experiment_id in experiments:
            curves = self.cache.get(experiment_id)
            curves.refresh(self.transaction)
            self._save(experiment_id, curves, everything=False)  # now: more experiments may evict it
        self.seen = max(self.seen, newest)
        self.save_due()
        return experiments

    def save_due(self, *, everything: bool = False) -> int:
        """Save the cached experiments whose curves changed (those saved within ``save_every_s`` wait,
        unless ``everything``). Returns how many were saved."""
        return sum(self._save(i, curves, everything=everything) for i, curves in self.cache.entries())

    def _save(self, experiment_id: int, curves: ExperimentCurves, *, everything: bool) -> bool:
        if not curves.unsaved():
            return False
        now = self.clock()
        last = self._saved_at.get(experiment_id)
        if not everything and last is not None and now - last < self.save_every_s:
            return False
        try:
            curves.save(self.transaction)
        except SQLAlchemyError as exc:  # deleted meanwhile, or the database is away: the next pass retries
            log.warning("experiment %d: saving its learning curves failed: %s", experiment_id, exc)
            return False
        self._saved_at[experiment_id] = now
        return True

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="curve-keeper", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread and save every curve that changed since its last save."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        try:
            self.save_due(everything=True)
        except Exception:  # shutting down: what is not saved is read again at the next start
            log.exception("saving the learning curves at shutdown failed")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run_once()
            except Exception:  # a pass that fails (database away) is retried at the next
                log.exception("the curve keeper's pass failed")
