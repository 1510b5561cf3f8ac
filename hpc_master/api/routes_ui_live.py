"""Live pages: one change stream per web UI page, so the browser fetches a table again only when it changed.

``GET /api/v1/webui/changes`` (the experiment list), ``/webui/experiments/{id}/changes`` and
``/webui/trials/{id}/changes`` are newline-delimited JSON streams, one ``{"result": {...}}`` per line, as the
other UI streams. The first message maps every key of the page to a digest of what the page shows under it
(``{"experiment": "9f…", "trials": "…", "checkpoints": "…", …}``); later messages carry only the keys whose
digest changed. A digest is an opaque string: compare it with the last one seen, never order it. Digests
are the same for every stream of the same thing and across reconnections, so a browser that reconnects
fetches only what changed while it was away. A blank line is a heartbeat, every ``HEARTBEAT_S`` of quiet.

Each watched thing (an experiment, a trial, the list) has one ``Hub`` per app: a task that reads cheap
aggregates in one short transaction every ``POLL_S`` while anyone listens (in the stream threads,
``api.streams``, holding no connection while it sleeps) and wakes its listeners when a digest changes; a
thousand open pages on one experiment cost the database what one does. Aggregates, not ``version`` columns
alone: some writers (``UPDATE … SET steps_completed``, a checkpoint's ``latest_checkpoint``) change rows
without a version bump.
New metric rows are found from the table's growing primary key (``MetricsCursor``), never by scanning a
trial's metrics. Who may read: as ``GET /api/v1/experiments/{id}`` (any user; per-trial tokens refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractContextManager
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from hpc_master.api import responses_ui
from hpc_master.api.bounds import Id
from hpc_master.api.deps import State, UserPrincipal, get_principal
from hpc_master.api.streams import open_stream, stream_threads
from hpc_master.db.models import (
    CheckpointModel,
    ExperimentModel,
    MetricModel,
    SearcherOpCompletionModel,
    TrialModel,
    TrialRunModel,
)
from hpc_master.errors import ClientError
from hpc_master.services.common import get_or_404

router = APIRouter(prefix="/api/v1/webui", tags=["webui"])
log = logging.getLogger(__name__)

POLL_S = 0.5
"""How often a hub reads its aggregates: a change reaches the page within this plus one fetch."""
HEARTBEAT_S = 15.0
"""A blank line after this long without a message, so that proxies keep the stream open."""
SESSION_CHECK_S = 5.0
"""How often a stream checks that its session still stands (logged out, expired, user deactivated): it
ends when not, and the browser's reconnection is refused (401). The token cache keeps answers this long."""
METRICS_WINDOW_MAX = 50_000
"""New metric ids a hub counts per read at most; past that (a bulk import) it just says "changed"."""

Digests = dict[str, str]
Follow = Annotated[bool, Query(description="false: the first message (every digest) only, then the end")]
Transaction = Callable[[], AbstractContextManager[Session]]


def digest(rows: Iterable[Any]) -> str:
    """A short, stable fingerprint of query rows (their ``repr``: ints, floats, strings, datetimes)."""
    text = repr([tuple(r) for r in rows])
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


# ---------------------------------------------------------------- what each page watches


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


# ---------------------------------------------------------------- hubs: one reader per watched thing


class Hub:
    """Reads one thing's digests every ``POLL_S`` while it has listeners, on the event loop that made it,
    and wakes them when a digest changes. Ends (and leaves the registry) when the last listener leaves or a
    read fails; listeners then end their streams and the browser reconnects."""

    def __init__(self, read: Callable[[], Digests], registry: dict[Any, Hub], key: Any) -> None:
        self.loop = asyncio.get_running_loop()
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
                digests = await stream_threads.run(self._read)
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


def hubs(request: Request) -> dict[Any, Hub]:
    """The app's hubs by what they watch (``("experiment", 3)``), for the routes and the tests."""
    registry: dict[Any, Hub] | None = getattr(request.app.state, "live_hubs", None)
    if registry is None:
        registry = request.app.state.live_hubs = {}
    return registry


def _line(message: Digests) -> bytes:
    return orjson.dumps({"result": message}) + b"\n"


async def _session_stands(request: Request) -> bool:
    try:
        principal = await get_principal(request)
        principal.require_user()
    except ClientError:
        return False
    return True


def _hub(request: Request, key: Any, read: Callable[[], Callable[[], Digests]]) -> Hub:
    registry = hubs(request)
    hub = registry.get(key)
    if hub is None or hub.failed or hub.loop is not asyncio.get_running_loop():
        hub = registry[key] = Hub(read(), registry, key)
    return hub


def _unsent(digests: Digests, sent: Digests) -> Digests:
    """The digests that differ from (or are missing in) those a listener was last sent."""
    return {k: v for k, v in digests.items() if sent.get(k) != v}


async def _messages(
    request: Request, key: Any, read: Callable[[], Callable[[], Digests]], follow: bool
) -> AsyncIterator[bytes]:
    """What one listener is sent: every digest first, then those that changed, heartbeats between; until
    the client goes, its session ends or the hub fails (``follow=false``: the first message only). The hub
    is found (or made) as the stream starts."""
    hub = _hub(request, key, read)
    hub.join()
    try:
        sent: Digests = {}
        seen = 0
        quiet_since = checked_at = time.monotonic()
        while True:
            now = time.monotonic()
            await hub.wait(seen, min(HEARTBEAT_S - (now - quiet_since), SESSION_CHECK_S - (now - checked_at)))
            if hub.failed:
                return
            if time.monotonic() - checked_at >= SESSION_CHECK_S:
                if not await _session_stands(request):
                    return
                checked_at = time.monotonic()
            if hub.generation > seen:
                seen = hub.generation
                changed = _unsent(hub.digests, sent)
                sent = dict(hub.digests)
                if changed:
                    quiet_since = time.monotonic()
                    yield _line(changed)
                    if not follow:
                        return
                    continue
            if time.monotonic() - quiet_since >= HEARTBEAT_S:
                quiet_since = time.monotonic()
                yield b"\n"
    finally:
        hub.leave()


def _changes(
    request: Request,
    state: State,
    principal: UserPrincipal,
    key: Any,
    read: Callable[[], Callable[[], Digests]],
    follow: bool = True,
) -> StreamingResponse:
    # No proxy buffering; and no keep-alive: a browser that aborts a kept-alive response may read on to
    # reuse the connection (Chromium drains it for seconds), leaving the stream open on the server.
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "close"}
    return open_stream(state.streams, principal, _messages(request, key, read, follow), headers=headers)


def _exists(state: State, model: type[ExperimentModel] | type[TrialModel], key: int, what: str) -> None:
    with state.tx() as session:
        get_or_404(session, model, key, what)


# ---------------------------------------------------------------- routes


@router.get("/changes", **responses_ui.ndjson(responses_ui.ChangesLine))
async def list_changes(
    request: Request, state: State, principal: UserPrincipal, follow: Follow = True
) -> StreamingResponse:
    """The experiment list's change stream: ``experiments`` and ``trials`` digests (see the module)."""
    return _changes(request, state, principal, ("list",), lambda: ListChanges(state.tx), follow)


@router.get(
    "/experiments/{experiment_id}/changes",
    **responses_ui.ndjson(responses_ui.ChangesLine),
)
async def experiment_changes(
    experiment_id: Id, request: Request, state: State, principal: UserPrincipal, follow: Follow = True
) -> StreamingResponse:
    """The experiment page's change stream: ``experiment``, ``trialStates``, ``trials``, ``runs``,
    ``checkpoints`` and ``validations`` digests (an ``experiment`` of ``""``: it was deleted)."""
    await run_in_threadpool(_exists, state, ExperimentModel, experiment_id, "experiment")
    return _changes(
        request, state, principal, ("experiment", experiment_id),
        lambda: ExperimentChanges(state.tx, experiment_id), follow,
    )  # fmt: skip


@router.get(
    "/trials/{trial_id}/changes",
    **responses_ui.ndjson(responses_ui.ChangesLine),
)
async def trial_changes(
    trial_id: Id, request: Request, state: State, principal: UserPrincipal, follow: Follow = True
) -> StreamingResponse:
    """The trial page's change stream: ``trial``, ``runs``, ``checkpoints`` and ``metrics`` digests (a
    ``trial`` of ``""``: it was deleted)."""
    await run_in_threadpool(_exists, state, TrialModel, trial_id, "trial")
    return _changes(
        request, state, principal, ("trial", trial_id), lambda: TrialChanges(state.tx, trial_id), follow
    )
