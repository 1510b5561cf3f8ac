"""The master itself: who it is (``GET /info``, Determined's unauthenticated version check, and
``GET /api/v1/master``), and for admins ``GET /api/v1/master/config`` (``det master config``) and
``GET /api/v1/master/logs`` (``det master logs``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from hpc_master.api import responses, responses_ui
from hpc_master.api.deps import State, UserPrincipal
from hpc_master.api.streams import ndjson, open_stream
from hpc_master.master_log import MASTER_LOG, MasterLog
from hpc_master.services.master_config import effective_config
from hpc_master.version import master_version

router = APIRouter(prefix="/api/v1", tags=["master"])
bare = APIRouter(tags=["master"])
"""``GET /info``: Determined's client asks it there, without ``/api/v1``."""

FOLLOW_POLL_S = 0.25
MAX_LOG_ENTRIES = 1_000_000  # the largest limit or |offset| accepted (the ring holds 10,000)


@router.get("/master/config", response_model=responses.MasterConfigAnswer)
async def get_master_config(state: State, principal: UserPrincipal) -> dict[str, Any]:
    """The effective configuration (file, environment and command line merged, defaults resolved), secrets
    masked. Admins only: it names the database, the storage paths and the cluster's pools."""
    principal.require_admin()
    return {"config": effective_config(state.config)}


@router.get("/master/logs", **responses_ui.ndjson(responses_ui.MasterLogLine))
async def master_logs(
    request: Request,
    state: State,
    principal: UserPrincipal,
    follow: bool = False,
    limit: Annotated[int, Query(ge=0, le=MAX_LOG_ENTRIES)] = 0,
    offset: Annotated[int, Query(ge=-MAX_LOG_ENTRIES, le=MAX_LOG_ENTRIES)] = 0,
) -> StreamingResponse:
    """The master's recent log entries (the last 10,000, from memory), newline-delimited
    ``{"result": {"logEntry": {id, level, message, timestamp}}}`` as Determined's ``MasterLogs``. ``offset``
    skips that many (negative: only that many from the end), ``limit`` caps them (0: all); ``follow=true``
    keeps the stream open for new entries until the limit or the client goes. Admins only."""
    principal.require_admin()
    ring: MasterLog = getattr(request.app.state, "master_log", MASTER_LOG)

    def lines(entries: list[Any]) -> bytes:
        return ndjson({"logEntry": e.to_api()} for e in entries)

    async def stream() -> AsyncIterator[bytes]:
        first = ring.read(offset=offset, limit=limit)
        sent = len(first)
        last = first[-1].id if first else ring.last_id()
        if first:
            yield lines(first)
        while follow and not (limit and sent >= limit):
            await asyncio.sleep(FOLLOW_POLL_S)
            if await request.is_disconnected():
                return
            new = ring.read(after_id=last, limit=limit - sent if limit else 0)
            if new:
                sent += len(new)
                last = new[-1].id
                yield lines(new)

    return open_stream(state.streams, principal, stream())


@router.get("/master", response_model=responses.MasterInfo)
def master_info(state: State) -> dict[str, Any]:
    """Unauthenticated health and identity."""
    return {
        "version": master_version(),
        "masterId": state.master_id,
        "clusterId": state.cluster_id,
        "clusterName": state.config.cluster_name,
        "telemetryEnabled": False,
        "externalUrl": state.config.master_url(),
        "loginMethods": login_methods(state.config),
        # Fields Determined's client requires (``docs/determined-client.md``).
        "hasCustomLogo": False,
        "strictJobQueueControl": False,
        "rbacEnabled": False,
        "userManagementEnabled": True,
    }


def login_methods(config: Any) -> list[str]:
    """Ours: how users log in here (``password``; ``ldap``: a password of the site's directory too; ``munge``:
    ``det user login`` with no name), for the web UI's login page and scripts."""
    security = config.security
    return ["password"] + [name for name in ("ldap", "munge") if getattr(security, name).enabled]


DETERMINED_API_VERSION = "0.38.1"
"""The release of Determined whose client this master is tested with (``GET /info``'s ``version``, which
that client compares with its own before every command)."""


@bare.get("/info", tags=["determined-compat"], response_model=responses.Info)
def info(state: State) -> dict[str, Any]:
    """Determined's unauthenticated master info. ``version`` is the Determined release whose client this
    master answers (a lower one would make that client warn "Consider upgrading the master" at every
    command); hpc-det's own version is ``hpcDetVersion`` here and ``version`` at ``/api/v1/master``."""
    return {
        "version": DETERMINED_API_VERSION,
        "hpcDetVersion": master_version(),
        "master_id": state.master_id,
        "cluster_id": state.cluster_id,
        "cluster_name": state.config.cluster_name,
        "telemetry": {"enabled": False},
        "rbacEnabled": False,
        "userManagementEnabled": True,
        "strictJobQueueControl": False,
    }
