"""The model registry on Determined's routes (``{model_name}``: a model's name, or its id when all digits):

- ``GET /api/v1/models`` (filters, sort, pagination) → ``{"models", "pagination"}``;
- ``POST /api/v1/models`` (``name``, ``description``, ``metadata``, ``labels``, ``notes``) → ``{"model"}``;
- ``GET|PATCH|DELETE /api/v1/models/{model_name}``, ``POST …/archive``, ``POST …/unarchive``;
- ``GET /api/v1/models/{model_name}/versions`` → ``{"model", "modelVersions", "pagination"}``;
- ``POST /api/v1/models/{model_name}/versions`` (``checkpointUuid``, …) → ``{"modelVersion"}``, its
  ``checkpoint`` as ``GET /api/v1/checkpoints/{uuid}`` gives it;
- ``GET|PATCH|DELETE /api/v1/models/{model_name}/versions/{model_version_num}``;
- ``GET /api/v1/model/labels``.

Users only (a per-trial token is refused); who may change what: ``services.models_registry``.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from sqlalchemy.orm import Session

from hpc_master.api import convert, responses, responses_checkpoints
from hpc_master.api.bounds import Count32, Id, Int32, Limit
from hpc_master.api.deps import State, UserPrincipal
from hpc_master.api.schemas import (
    PatchModelRequest,
    PatchModelVersionRequest,
    PostModelRequest,
    PostModelVersionRequest,
)
from hpc_master.db.models import ModelVersionModel, RegistryModel
from hpc_master.errors import NotFoundError
from hpc_master.services import models_registry as reg
from hpc_master.services import notify
from hpc_master.services.access import Principal

router = APIRouter(prefix="/api/v1", tags=["models"])

ModelName = Annotated[str, Path(min_length=1, max_length=256)]
"""A model's name, or its id (all digits)."""
QueryText = Annotated[str, Query(max_length=256)]
QueryList = Annotated[list[Annotated[str, Query(max_length=256)]] | None, Query(max_length=100)]


def _page(items: Sequence[Any], offset: int, limit: int) -> tuple[list[Any], int]:
    """Determined's pagination: a negative offset counts from the end; a limit of 0 or less is no limit."""
    start = max(len(items) + offset, 0) if offset < 0 else offset
    page = list(items[start:]) if limit <= 0 else list(items[start : start + limit])
    return page, start


def _model_json(session: Session, model: RegistryModel) -> dict[str, Any]:
    (view,) = reg.model_views(session, [model])
    return convert.model_to_api(view.model, view.username, view.num_versions)


def _versions_json(
    session: Session,
    principal: Principal,
    model: RegistryModel,
    versions: Sequence[ModelVersionModel],
    default_root: pathlib.Path,
) -> list[dict[str, Any]]:
    """Determined's ``v1ModelVersion``s, each checkpoint as ``GET /api/v1/checkpoints/{uuid}`` gives it (its
    experiment's config masked for users other than the owner and admins); `default_root`: the master's
    checkpoint root (``MasterConfig.checkpoint_dir()``)."""
    views = reg.version_views(session, model, versions)
    checkpoints = convert.checkpoints_to_api([v.checkpoint for v in views], principal, default_root)
    return [
        convert.model_version_to_api(
            v.version,
            convert.model_to_api(v.model.model, v.model.username, v.model.num_versions),
            checkpoint,
            v.username,
        )
        for v, checkpoint in zip(views, checkpoints, strict=True)
    ]


# ---------------------------------------------------------------- models


@router.get("/models", response_model=responses_checkpoints.Models)
def get_models(
    state: State,
    principal: UserPrincipal,
    sort_by: Annotated[str | None, Query(alias="sortBy", max_length=64)] = None,
    order_by: Annotated[str | None, Query(alias="orderBy", max_length=64)] = None,
    offset: Int32 = 0,
    limit: Limit = 0,
    name: QueryText = "",
    description: QueryText = "",
    labels: QueryList = None,
    archived: bool | None = None,
    users: QueryList = None,
    user_ids: Annotated[list[Id] | None, Query(alias="userIds", max_length=100)] = None,
    model_id: Annotated[Count32, Query(alias="id")] = 0,
    workspace_names: Annotated[
        list[Annotated[str, Query(max_length=256)]] | None, Query(alias="workspaceNames", max_length=100)
    ] = None,
    workspace_ids: Annotated[list[Id] | None, Query(alias="workspaceIds", max_length=100)] = None,
) -> dict[str, Any]:
    query = reg.ModelQuery(
        sort_by=sort_by, order_by=order_by, name=name, description=description, labels=labels or (),
        archived=archived, users=users or (), user_ids=user_ids or (), model_id=model_id,
        workspace_names=workspace_names or (), workspace_ids=workspace_ids or (),
    )  # fmt: skip
    with state.tx() as session:
        views = reg.list_models(session, query)
        page, start = _page(views, offset, limit)
        models = [convert.model_to_api(v.model, v.username, v.num_versions) for v in page]
    return {"models": models, "pagination": convert.pagination(start, limit, len(views), len(models))}


def _require_the_workspace(name: str | None, ident: int | None) -> None:
    if name not in (None, "", reg.WORKSPACE_NAME) or ident not in (None, 0, reg.WORKSPACE_ID):
        raise NotFoundError(
            f"workspace {name or ident} not found (models live in {reg.WORKSPACE_NAME!r}, id "
            f"{reg.WORKSPACE_ID}: this master has no other workspace)",
            field="workspaceName" if name else "workspaceId",
        )


@router.post("/models", response_model=responses_checkpoints.ModelAnswer)
def post_model(body: PostModelRequest, state: State, principal: UserPrincipal) -> dict[str, Any]:
    _require_the_workspace(body.workspace_name, body.workspace_id)
    with state.tx() as session:
        model = reg.create_model(
            session, principal, name=body.name, description=body.description or "",
            metadata=body.metadata or {}, labels=body.labels or [], notes=body.notes or "",
        )  # fmt: skip
        return {"model": _model_json(session, model)}


@router.get("/models/{model_name}", response_model=responses_checkpoints.ModelAnswer)
def get_model(model_name: ModelName, state: State, principal: UserPrincipal) -> dict[str, Any]:
    with state.tx() as session:
        return {"model": _model_json(session, reg.find_model(session, model_name))}


@router.patch("/models/{model_name}", response_model=responses_checkpoints.ModelAnswer)
def patch_model(
    model_name: ModelName, body: PatchModelRequest, state: State, principal: UserPrincipal
) -> dict[str, Any]:
    _require_the_workspace(body.workspace_name, body.workspace_id)
    changes = body.model_dump(exclude_none=True, exclude={"workspace_name", "workspace_id"})
    with state.tx() as session:
        model = reg.patch_model(session, principal, model_name, changes)
        return {"model": _model_json(session, model)}


@router.post("/models/{model_name}/archive", response_model=responses.Empty)
def archive_model(model_name: ModelName, state: State, principal: UserPrincipal) -> dict[str, Any]:
    with state.tx() as session:
        reg.set_archived(session, principal, model_name, True)
    return {}


@router.post("/models/{model_name}/unarchive", response_model=responses.Empty)
def unarchive_model(model_name: ModelName, state: State, principal: UserPrincipal) -> dict[str, Any]:
    with state.tx() as session:
        reg.set_archived(session, principal, model_name, False)
    return {}


@router.delete("/models/{model_name}", response_model=responses.Empty)
def delete_model(model_name: ModelName, state: State, principal: UserPrincipal) -> dict[str, Any]:
    """Delete the model and its versions; their checkpoints are collectible again (a GC is requested)."""
    with state.tx() as session:
        reg.delete_model(session, principal, model_name)
    notify.changed()
    return {}


@router.get("/model/labels", response_model=responses.Labels)
def get_model_labels(state: State, principal: UserPrincipal) -> dict[str, Any]:
    """Every label of every model, most used first (Determined's ``GetModelLabels``)."""
    with state.tx() as session:
        return {"labels": reg.model_labels(session)}


# ---------------------------------------------------------------- versions


@router.get("/models/{model_name}/versions", response_model=responses_checkpoints.ModelVersions)
def get_model_versions(
    model_name: ModelName,
    state: State,
    principal: UserPrincipal,
    sort_by: Annotated[str | None, Query(alias="sortBy", max_length=64)] = None,
    order_by: Annotated[str | None, Query(alias="orderBy", max_length=64)] = None,
    offset: Int32 = 0,
    limit: Limit = 0,
) -> dict[str, Any]:
    with state.tx() as session:
        model, versions = reg.list_versions(session, model_name, sort_by=sort_by, order_by=order_by)
        page, start = _page(versions, offset, limit)
        items = _versions_json(session, principal, model, page, state.config.checkpoint_dir())
        return {
            "model": _model_json(session, model),
            "modelVersions": items,
            "pagination": convert.pagination(start, limit, len(versions), len(items)),
        }


@router.post("/models/{model_name}/versions", response_model=responses_checkpoints.ModelVersionAnswer)
def post_model_version(
    model_name: ModelName, body: PostModelVersionRequest, state: State, principal: UserPrincipal
) -> dict[str, Any]:
    """Register a checkpoint as the model's next version (the model's owner or an admin, a checkpoint of
    their own experiment): it is never garbage-collected while registered. The path names the model (a
    ``modelName`` in the body is ignored, as grpc-gateway does)."""
    with state.tx() as session:
        model, version = reg.register_version(
            session, principal, model_name, body.checkpoint_uuid, name=body.name or "",
            comment=body.comment or "", notes=body.notes or "", metadata=body.metadata or {},
            labels=body.labels or [],
        )  # fmt: skip
        return {
            "modelVersion": _versions_json(
                session, principal, model, [version], state.config.checkpoint_dir()
            )[0]
        }


@router.get(
    "/models/{model_name}/versions/{model_version_num}",
    response_model=responses_checkpoints.ModelVersionAnswer,
)
def get_model_version(
    model_name: ModelName, model_version_num: Id, state: State, principal: UserPrincipal
) -> dict[str, Any]:
    with state.tx() as session:
        model, version = reg.get_version(session, model_name, model_version_num)
        return {
            "modelVersion": _versions_json(
                session, principal, model, [version], state.config.checkpoint_dir()
            )[0]
        }


@router.patch(
    "/models/{model_name}/versions/{model_version_num}",
    response_model=responses_checkpoints.ModelVersionAnswer,
)
def patch_model_version(
    model_name: ModelName,
    model_version_num: Id,
    body: PatchModelVersionRequest,
    state: State,
    principal: UserPrincipal,
) -> dict[str, Any]:
    with state.tx() as session:
        model, version = reg.patch_version(
            session, principal, model_name, model_version_num, body.model_dump(exclude_none=True)
        )
        return {
            "modelVersion": _versions_json(
                session, principal, model, [version], state.config.checkpoint_dir()
            )[0]
        }


@router.delete("/models/{model_name}/versions/{model_version_num}", response_model=responses.Empty)
def delete_model_version(
    model_name: ModelName, model_version_num: Id, state: State, principal: UserPrincipal
) -> dict[str, Any]:
    """Delete the version; its checkpoint is collectible again at the experiment's next GC (requested)."""
    with state.tx() as session:
        reg.delete_version(session, principal, model_name, model_version_num)
    notify.changed()
    return {}
