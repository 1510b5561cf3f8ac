"""Determined's workspace and project routes, over the one default workspace and project
(``services.workspaces``): ``det workspace list|describe``, ``det project list|describe`` and the SDK's
``get_workspace``/``get_project`` find "Uncategorized" (id 1); any other name or id is a 404 that says why."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from hpc_master.api import convert, responses
from hpc_master.api.bounds import Id, Limit, Offset
from hpc_master.api.deps import State, UserPrincipal
from hpc_master.services import workspaces as ws

router = APIRouter(prefix="/api/v1", tags=["workspaces"])
Name = Annotated[str | None, Query(max_length=256)]


def _matches(name: str | None, exact: str | None = None) -> bool:
    """Determined's filters: ``name`` a case-insensitive part of the name, ``nameCaseSensitive`` the name."""
    if exact is not None and exact != ws.DEFAULT_NAME:
        return False
    return not name or name.casefold() in ws.DEFAULT_NAME.casefold()


def _page(
    items: list[dict[str, Any]], offset: int, limit: int
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    page = items[offset:][: limit if limit > 0 else None]
    return page, convert.pagination(offset, limit, len(items), len(page))


@router.get("/workspaces", response_model=responses.Workspaces)
def list_workspaces(
    state: State, principal: UserPrincipal, name: Name = None, offset: Offset = 0, limit: Limit = 0,
    name_case_sensitive: Annotated[str | None, Query(alias="nameCaseSensitive", max_length=256)] = None,
) -> dict[str, Any]:  # fmt: skip
    with state.tx() as session:
        found = [ws.workspace_to_api(session, principal)] if _matches(name, name_case_sensitive) else []
    page, pagination = _page(found, offset, limit)
    return {"workspaces": page, "pagination": pagination}


@router.get("/workspaces/{workspace_id}", response_model=responses.WorkspaceAnswer)
def get_workspace(workspace_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    ws.require_default("workspace", workspace_id)
    with state.tx() as session:
        return {"workspace": ws.workspace_to_api(session, principal)}


@router.get("/workspaces/{workspace_id}/projects", response_model=responses.Projects)
def list_projects(
    workspace_id: Id, state: State, principal: UserPrincipal, name: Name = None, offset: Offset = 0,
    limit: Limit = 0,
) -> dict[str, Any]:  # fmt: skip
    ws.require_default("workspace", workspace_id)
    with state.tx() as session:
        found = [ws.project_to_api(session, principal)] if _matches(name) else []
    page, pagination = _page(found, offset, limit)
    return {"projects": page, "pagination": pagination}


@router.get("/projects/{project_id}", response_model=responses.ProjectAnswer)
def get_project(project_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    ws.require_default("project", project_id)
    with state.tx() as session:
        return {"project": ws.project_to_api(session, principal)}
