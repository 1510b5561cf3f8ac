"""The audit log (``services.audit``): ``GET /api/v1/audit`` for admins, and ``AuditRequest``, the middleware that
names the request being served for what it records."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.types import ASGIApp, Receive, Scope, Send

from hpc_master.api import responses
from hpc_master.api.bounds import Limit, Offset
from hpc_master.api.deps import State, UserPrincipal
from hpc_master.services import audit

router = APIRouter(prefix="/api/v1", tags=["audit"])


class AuditRequest:
    """Sets ``audit.REQUEST`` to ``METHOD /path`` (never the query: it may hold what is no one's business)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = audit.REQUEST.set(f"{scope['method']} {scope['path']}"[:512])
        try:
            await self.app(scope, receive, send)
        finally:
            audit.REQUEST.reset(token)


@router.get("/audit", response_model=responses.AuditEvents)
def audit_events(
    principal: UserPrincipal, state: State, actor: str | None = None, owner: str | None = None,
    offset: Offset = 0, limit: Limit = 100,
) -> dict[str, Any]:  # fmt: skip
    """Ours, admins only: privileged and cross-user actions, newest first; ``actor`` (who acted) and ``owner``
    (whose the target was) filter them."""
    principal.require_admin()
    with state.tx() as session:
        rows = audit.events(
            session, actor=actor, owner=owner, offset=offset, limit=min(limit, 1000) if limit > 0 else 100
        )
        return {
            "events": [
                {"id": e.id, "time": e.time.isoformat().replace("+00:00", "Z"), "actorId": e.actor_id,
                 "actor": e.actor, "action": e.action, "target": e.target, "owner": e.owner,
                 "asUnix": e.as_unix, "detail": e.detail}
                for e in rows
            ]
        }  # fmt: skip
