"""What the web UI's change streams watch (``api.routes_ui_live``): digests of what each page shows, and one
``Hub`` per watched thing that reads them.

Each watched thing (an experiment, a trial, the experiment list) has one ``Hub`` per app: a task that reads
cheap aggregates in one short transaction every ``POLL_S`` while anyone listens (its reads run where the
caller's ``run`` puts them: the API's stream threads, holding no connection while it sleeps) and wakes its
listeners when a digest changes; a thousand open pages on one experiment cost the database what one does.
Aggregates, not ``version`` columns alone: some writers (``UPDATE … SET steps_completed``, a checkpoint's
``latest_checkpoint``) change rows without a version bump. New metric rows are found from the table's growing
primary key (``MetricsCursor``), never by scanning a trial's metrics. A digest is an opaque string.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from hpc_master.db.models import (
    CheckpointModel,
    ExperimentModel,
    MetricModel,
    SearcherOpCompletionModel,
    TrialModel,
    TrialRunModel,
)

log = logging.getLogger(__name__)


POLL_S = 0.5
"""How often a hub reads its aggregates: a change reaches the page within this plus one fetch."""


METRICS_WINDOW_MAX = 50_000
"""New metric ids a hub counts per read at most; past that (a bulk import) it just says "changed"."""


Digests = dict[str, str]


Transaction = Callable[[], AbstractContextManager[Session]]


def digest(rows: Iterable[Any]) -> str:
    """A short, stable fingerprint of query rows (their ``repr``: ints, floats, strings, datetimes)."""
    text = repr([tuple(r) for r in rows])
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class MetricsCursor:
    """New metric rows of one scope (a trial, or an experiment's validations), found by the metrics table's
    primary key: each read counts the scope's rows among those inserted since the last read (a range of
    the primary key, however many metrics the trials already have). Its digest is (first id, count): a new
    cursor (a restarted hub) gives a different digest only if metrics were inserted in between, so nothing
    inserted while no hub watched is missed. On PostgreSQL a row committed after a row with a higher id is
    missed by this cursor; the same transaction's ``steps_completed`` raise is seen by the trial digests."""

    def __init__(self) -> None:
        self.start: int | None = None
        self.last = 0
        self.count = 0

    def read(self, session: Session, scope: ColumnElement[bool]) -> str:
        top = int(session.scalar(select(func.max(MetricModel.id))) or 0)
        if self.start is None:
            self.start = self.last = top
        elif top > self.last:
            if top - self.last > METRICS_WINDOW_MAX:
                self.count += 1
            else:
                self.count += int(
                    session.scalar(
                        select(func.count())
                        .select_from(MetricModel)
                        .where(MetricModel.id > self.last, MetricModel.id <= top, scope)
                    )
                    or 0
                )
            self.last = top
        return f"{self.start}:{self.count}"


def _experiment_row(session: Session, experiment_id: int) -> str:
    e = ExperimentModel
    row = session.execute(
        select(
            e.version, e.state, e.archived, e.progress, e.end_time, e.name, e.description, e.resource_pool
        ).where(e.id == experiment_id)
    ).first()
    return digest([row]) if row is not None else ""


def _checkpoints(session: Session, where: ColumnElement[bool]) -> str:
    c = CheckpointModel
    return digest(
        session.execute(
            select(c.state, func.count(), func.max(c.report_time), func.sum(c.steps_completed))
            .where(where)
            .group_by(c.state)
            .order_by(c.state)
        )
    )


class ExperimentChanges:
    """The experiment page: ``experiment`` (its row: header, rungs), ``trialStates`` (how many trials in
    each state: the header's counts), ``trials`` (the trials table's columns), ``runs`` (each trial's Slurm
    jobs), ``checkpoints`` and ``validations`` (new validation reports: the table's latest validation)."""

    def __init__(self, tx: Transaction, experiment_id: int) -> None:
        self._tx = tx
        self._id = experiment_id
        self._validations = MetricsCursor()

    def __call__(self) -> Digests:
        t, r = TrialModel, TrialRunModel
        mine = select(t.id).where(t.experiment_id == self._id).scalar_subquery()
        with self._tx() as session:
            experiment = _experiment_row(session, self._id)
            trials = list(
                session.execute(
                    select(
                        t.state,
                        func.count(),
                        func.max(t.id),
                        func.sum(t.version),
                        func.sum(t.steps_completed),
                        func.sum(t.restarts + t.run_id),
                        func.count(t.best_validation),
                        func.sum(t.best_validation),
                        func.sum(t.searcher_metric),
                        func.count(t.latest_checkpoint),
                        func.count(t.end_time),
                        func.sum(t.progress),
                    )
                    .where(t.experiment_id == self._id)
                    .group_by(t.state)
                    .order_by(t.state)
                )
            )
            runs = session.execute(
                select(
                    r.state,
                    func.count(),
                    func.max(r.id),
                    func.sum(r.version),
                    func.count(r.slurm_job_id),
                    func.count(r.node_list),
                    func.count(r.start_time),
                    func.count(r.end_time),
                    func.count(r.pending_reason),
                )
                .where(r.trial_id.in_(mine))
                .group_by(r.state)
                .order_by(r.state)
            )
            return {
                "experiment": experiment,
                "trialStates": digest((row[0], row[1]) for row in trials),
                "trials": digest(trials),
                "runs": digest(runs),
                "checkpoints": _checkpoints(session, CheckpointModel.trial_id.in_(mine)),
                # ``+ 0``: SQLite would otherwise walk every metric of the experiment's trials by the
                # (trial_id, …) index instead of the few new ids.
                "validations": self._validations.read(
                    session, (MetricModel.trial_id + 0).in_(mine) & (MetricModel.group == "validation")
                ),
            }


class TrialChanges:
    """The trial page: ``trial`` (its row: the header), ``runs`` (its Slurm jobs), ``checkpoints`` and
    ``metrics`` (new reports of any group: its charts)."""

    def __init__(self, tx: Transaction, trial_id: int) -> None:
        self._tx = tx
        self._id = trial_id
        self._metrics = MetricsCursor()

    def __call__(self) -> Digests:
        t, r = TrialModel, TrialRunModel
        with self._tx() as session:
            trial = session.execute(
                select(
                    t.version,
                    t.state,
                    t.steps_completed,
                    t.restarts,
                    t.run_id,
                    t.best_validation,
                    t.searcher_metric,
                    t.latest_checkpoint,
                    t.progress,
                    t.end_time,
                    t.early_exit_reason,
                    t.pause_reason,
                    t.exit_message,
                ).where(t.id == self._id)
            ).first()
            runs = session.execute(
                select(
                    r.id,
                    r.version,
                    r.state,
                    r.slurm_job_id,
                    r.node_list,
                    r.exit_reason,
                    r.exit_message,
                    r.start_time,
                    r.end_time,
                    r.pending_reason,
                )
                .where(r.trial_id == self._id)
                .order_by(r.id)
            )
            return {
                "trial": digest([trial]) if trial is not None else "",
                "runs": digest(runs),
                "checkpoints": _checkpoints(session, CheckpointModel.trial_id == self._id),
                "metrics": self._metrics.read(session, (MetricModel.trial_id + 0) == self._id),
            }


class ListChanges:
    """The experiment list: ``experiments`` (each state's count, versions, progress) and ``trials`` (how
    many there are, and the searcher's last completion: a new best metric comes with one). Index-only or
    primary-key reads but for the experiments table itself."""

    def __init__(self, tx: Transaction) -> None:
        self._tx = tx

    def __call__(self) -> Digests:
        e = ExperimentModel
        with self._tx() as session:
            experiments = session.execute(
                select(
                    e.state,
                    e.archived,
                    func.count(),
                    func.max(e.id),
                    func.sum(e.version),
                    func.sum(e.progress),
                    func.count(e.end_time),
                )
                .group_by(e.state, e.archived)
                .order_by(e.state, e.archived)
            )
            trials = session.execute(
                select(
                    select(func.count()).select_from(TrialModel).scalar_subquery(),
                    select(func.max(TrialModel.id)).scalar_subquery(),
                    select(func.max(SearcherOpCompletionModel.id)).scalar_subquery(),
                )
            )
            return {"experiments": digest(experiments), "trials": digest(trials)}


class Hub:
    """Reads one thing's digests every ``POLL_S`` while it has listeners, on the event loop that made it,
    and wakes them when a digest changes. Ends (and leaves the registry) when the last listener leaves or a
    read fails; listeners then end their streams and the browser reconnects."""

    def __init__(
        self,
        read: Callable[[], Digests],
        registry: dict[Any, Hub],
        key: Any,
        run: Callable[[Callable[[], Digests]], Awaitable[Digests]],
    ) -> None:
        """`run(read)` runs a read away from the event loop (the API's stream threads)."""
        self.loop = asyncio.get_running_loop()
        self._run_read = run
        self.digests: Digests = {}
        self.generation = 0
        self.failed = False
        self.listeners = 0
        self._read = read
        self._registry = registry
        self._key = key
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def join(self) -> None:
        self.listeners += 1
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    def leave(self) -> None:
        self.listeners -= 1

    async def _run(self) -> None:
        try:
            while self.listeners > 0:
                digests = await self._run_read(self._read)
                if digests != self.digests:
                    self.digests = digests
                    self.generation += 1
                    self._wake()
                await asyncio.sleep(POLL_S)
        except Exception:
            log.warning("live updates of %s stopped: reading the database failed", self._key, exc_info=True)
            self.failed = True
            self._wake()
        finally:
            self._task = None
            if self._registry.get(self._key) is self and (self.failed or self.listeners <= 0):
                del self._registry[self._key]

    def _wake(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def wait(self, after: int, timeout_s: float) -> None:
        """Until a generation after ``after``, a failure, or ``timeout_s``."""
        if self.generation > after or self.failed:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout=max(0.0, timeout_s))
