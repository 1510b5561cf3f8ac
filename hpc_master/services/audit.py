"""The audit log: who did what as whom, for the privileged and cross-user actions (``AuditEventModel``, append-only
by migration 0011's triggers).

Recorded in the transaction of the action itself, so that a refused or failed action leaves no record and a
done one always has its record:

- an admin acting on another user's experiment (its changes, its code, its trials' logs), model or task:
  ``cross_user``, called by the access policy (``services.access``) and the tasks' lookup; ``as_unix`` is the
  owner's Unix account, as which the master acts on the owner's jobs and files;
- user accounts created or changed by an admin (``users``), and by a munge or LDAP login (first logins,
  admin rights set from a Unix group: ``unix_users``).

The action is the request (``POST /api/v1/experiments/5/kill``: ``REQUEST``, set by ``api.audit_context``) or,
outside a request, what the master did. Admins read the log at ``GET /api/v1/audit``.
"""

from __future__ import annotations

import contextvars
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from hpc_master.db.models import AuditEventModel, UserModel

REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("audit_request", default="")
"""The request being served (``METHOD /path``), for the ``action`` of what it records."""


def record(
    session: Session, *, actor_id: int | None, actor: str, target: str, action: str = "",
    owner: str | None = None, as_unix: str | None = None, detail: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    session.add(AuditEventModel(
        actor_id=actor_id, actor=actor[:128], action=(action or REQUEST.get() or "(no request)")[:512],
        target=target[:256], owner=owner, as_unix=as_unix, detail=detail,
    ))  # fmt: skip


def cross_user(
    session: Session | None, *, actor_id: int, actor: str, owner_id: int | None, target: str
) -> None:
    """Record an admin's action on ``owner_id``'s ``target``, when the admin is not its owner."""
    if session is None or owner_id is None or owner_id == actor_id:
        return
    owner = session.get(UserModel, owner_id)
    record(
        session, actor_id=actor_id, actor=actor, target=target,
        owner=owner.username if owner else str(owner_id), as_unix=owner.unix_username if owner else None,
    )  # fmt: skip


def events(
    session: Session, *, actor: str | None = None, owner: str | None = None, offset: int = 0, limit: int = 100
) -> list[AuditEventModel]:
    """The newest first, filtered by who acted or whose the target was."""
    query = select(AuditEventModel).order_by(AuditEventModel.id.desc())
    if actor is not None:
        query = query.where(AuditEventModel.actor == actor)
    if owner is not None:
        query = query.where(AuditEventModel.owner == owner)
    return list(session.scalars(query.offset(offset).limit(limit)))
