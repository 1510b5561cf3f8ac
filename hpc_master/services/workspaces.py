"""Determined's one default workspace and project ("Uncategorized", id 1 each), which every experiment and
model of this master is in, so that clients that send or expect them work (``docs/determined-client.md``).

An experiment config's ``workspace`` and ``project`` keys are stored with the config and shown as the
experiment's ``workspaceName`` and ``projectName``; they do not create workspaces or projects, nor scope access
(access is the owner's or an admin's, as for every experiment).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hpc_master.db.models import ExperimentModel, UserModel
from hpc_master.errors import NotFoundError
from hpc_master.expconf import ExperimentConfig
from hpc_master.services import access
from hpc_master.services.access import Principal
from hpc_master.services.states import ExperimentState

DEFAULT_ID = 1
DEFAULT_NAME = "Uncategorized"
PROJECT_KEY = "UNCAT"
_STATE = "WORKSPACE_STATE_UNSPECIFIED"


def names_of(config: ExperimentConfig | None) -> tuple[str, str]:
    """The workspace and project names an experiment's config gives, or the defaults."""
    if config is None:
        return DEFAULT_NAME, DEFAULT_NAME
    return config.workspace or DEFAULT_NAME, config.project or DEFAULT_NAME


def require_default(kind: str, ident: int | str) -> None:
    if ident not in (DEFAULT_ID, DEFAULT_NAME):
        raise NotFoundError(
            f"{kind} {ident} not found: this master has one {kind}, {DEFAULT_NAME!r} (id {DEFAULT_ID}), "
            "which holds every experiment and model"
        )


def _owner(session: Session) -> tuple[int, str]:
    """The first admin (the workspace's nominal owner, as Determined's is the admin who set the cluster up)."""
    row = session.execute(
        select(UserModel.id, UserModel.username)
        .where(UserModel.admin.is_(True))
        .order_by(UserModel.id)
        .limit(1)
    ).first()
    return (int(row[0]), str(row[1])) if row else (DEFAULT_ID, "admin")


def _counts(session: Session, principal: Principal) -> tuple[int, int]:
    """The experiments the caller may see (its own; all for an admin), and how many of them are active."""
    query = access.only_own(
        select(func.count()).select_from(ExperimentModel), ExperimentModel.owner_id, principal
    )
    total = session.scalar(query) or 0
    active = session.scalar(query.where(ExperimentModel.state == ExperimentState.ACTIVE)) or 0
    return int(total), int(active)


def workspace_to_api(session: Session, principal: Principal) -> dict[str, Any]:
    """Determined's ``v1Workspace`` of the default workspace."""
    user_id, username = _owner(session)
    total, _ = _counts(session, principal)
    return {
        "id": DEFAULT_ID, "name": DEFAULT_NAME, "archived": False, "errorMessage": "", "immutable": True,
        "numExperiments": total, "numProjects": 1, "pinned": False, "state": _STATE, "userId": user_id,
        "username": username,
    }  # fmt: skip


def project_to_api(session: Session, principal: Principal) -> dict[str, Any]:
    """Determined's ``v1Project`` of the default project."""
    user_id, username = _owner(session)
    total, active = _counts(session, principal)
    return {
        "id": DEFAULT_ID, "name": DEFAULT_NAME, "key": PROJECT_KEY, "archived": False, "errorMessage": "",
        "immutable": True, "notes": [], "numActiveExperiments": active, "numExperiments": total,
        "numRuns": 0, "state": _STATE, "userId": user_id, "username": username, "workspaceId": DEFAULT_ID,
        "workspaceName": DEFAULT_NAME, "description": "",
    }  # fmt: skip
