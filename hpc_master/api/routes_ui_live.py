"""Live pages: one change stream per web UI page, so the browser fetches a table again only when it changed.

``GET /api/v1/webui/changes`` (the experiment list), ``/webui/experiments/{id}/changes`` and
``/webui/trials/{id}/changes`` are newline-delimited JSON streams, one ``{"result": {...}}`` per line, as the
other UI streams. The first message maps every key of the page to a digest of what the page shows under it
(``{"experiment": "9f…", "trials": "…", "checkpoints": "…", …}``); later messages carry only the keys whose
digest changed. A digest is an opaque string: compare it with the last one seen, never order it. Digests
are the same for every stream of the same thing and across reconnections, so a browser that reconnects
fetches only what changed while it was away. A blank line is a heartbeat, every ``HEARTBEAT_S`` of quiet.

What each page watches, and the one ``Hub`` per watched thing that reads it for all its listeners, are in
``services.changes``; a hub's reads run in the stream threads (``api.streams``). Who may read: as ``GET /api/v1/experiments/{id}`` (any user; per-trial tokens refused).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from hpc_master.api import responses_ui
from hpc_master.api.bounds import Id
from hpc_master.api.deps import State, UserPrincipal, get_principal
from hpc_master.api.streams import ndjson, open_stream, stream_threads
from hpc_master.db.models import (
    ExperimentModel,
    TrialModel,
)
from hpc_master.errors import ClientError
from hpc_master.services.changes import Digests, ExperimentChanges, Hub, ListChanges, TrialChanges
from hpc_master.services.common import get_or_404

router = APIRouter(prefix="/api/v1/webui", tags=["webui"])
log = logging.getLogger(__name__)

HEARTBEAT_S = 15.0
"""A blank line after this long without a message, so that proxies keep the stream open."""
SESSION_CHECK_S = 5.0
"""How often a stream checks that its session still stands (logged out, expired, user deactivated): it
ends when not, and the browser's reconnection is refused (401). The token cache keeps answers this long."""

Follow = Annotated[bool, Query(description="false: the first message (every digest) only, then the end")]


def hubs(request: Request) -> dict[Any, Hub]:
    """The app's hubs by what they watch (``("experiment", 3)``), for the routes and the tests."""
    registry: dict[Any, Hub] | None = getattr(request.app.state, "live_hubs", None)
    if registry is None:
        registry = request.app.state.live_hubs = {}
    return registry


def _line(message: Digests) -> bytes:
    return ndjson([message], browser=True)


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
        hub = registry[key] = Hub(read(), registry, key, stream_threads.run)
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
