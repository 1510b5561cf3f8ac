"""Determined's experiment routes that its CLI and SDK call and hpc-det's ``det`` does not (paths, fields and
answers are Determined's, ``determined/common/api/bindings.py``; ``docs/determined-client.md``):

- ``GET /api/v1/experiments/{id}/model_def`` (``GetModelDef``: ``det e download-model-def``, the SDK's
  ``Experiment.download_code()``): the context uploaded with the experiment, as the master stored it, a
  gzip'd tar in ``b64Tgz``;
- ``GET /api/v1/experiments/{id}/file_tree`` and ``POST /api/v1/experiments/{id}/file`` (``GetModelDefTree``,
  ``GetModelDefFile``): its files, and one of them;
- ``PUT`` and ``DELETE /api/v1/experiments/{id}/labels/{label}`` (the SDK's ``add_label``, ``remove_label``).

The context is read from the database only, never from a path a request names. Only the experiment's owner
and admins may read it (it is code, which may hold what other users should not see, as the config's
secret-looking values are masked for them) or change its labels.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import APIRouter, Path, Response
from sqlalchemy.orm import Session

from hpc_master.api import responses
from hpc_master.api.bounds import Id
from hpc_master.api.deps import State, UserPrincipal
from hpc_master.api.schemas import ApiModel
from hpc_master.db.models import ExperimentModel
from hpc_master.errors import ClientError, NotFoundError
from hpc_master.services import access
from hpc_master.services import context as ctx
from hpc_master.services.access import Principal
from hpc_master.services.common import get_or_404
from hpc_master.services.experiment_patch import MAX_LABEL_CHARS, change_label

router = APIRouter(prefix="/api/v1", tags=["determined-compat"])

LabelPath = Annotated[str, Path(min_length=1, max_length=MAX_LABEL_CHARS)]


class ModelDefFileRequest(ApiModel):
    """Determined's ``v1GetModelDefFileRequest``."""

    experiment_id: Id | None = None
    path: str = ""


def _stored_context(session: Session, principal: Principal, experiment_id: int) -> bytes:
    experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
    access.experiment_private(principal, experiment)
    archive = experiment.context_archive
    if archive is None:
        raise NotFoundError(f"experiment {experiment_id} has no stored model definition")
    return archive


@router.get("/experiments/{experiment_id}/model_def", response_model=responses.ModelDef)
def model_def(experiment_id: Id, principal: UserPrincipal, state: State) -> Response:
    with state.tx() as session:
        archive = _stored_context(session, principal, experiment_id)
    # Up to the context's limit (95 MB): written out directly rather than through the JSON encoder.
    body = b'{"b64Tgz":"' + base64.b64encode(archive) + b'"}'
    return Response(content=body, media_type="application/json")


@router.get("/experiments/{experiment_id}/file_tree", response_model=responses.FileTree)
def file_tree(experiment_id: Id, principal: UserPrincipal, state: State) -> dict[str, Any]:
    with state.tx() as session:
        archive = _stored_context(session, principal, experiment_id)
    return {"files": ctx.context_tree(archive)}


@router.post("/experiments/{experiment_id}/file", response_model=responses.FileContent)
def model_def_file(
    experiment_id: Id, body: ModelDefFileRequest, principal: UserPrincipal, state: State
) -> dict[str, Any]:
    if body.experiment_id not in (None, experiment_id):
        raise ClientError(
            f"the body's experimentId {body.experiment_id} is not experiment {experiment_id}",
            field="experimentId",
        )
    if not 1 <= len(body.path) <= 4096:
        raise ClientError("path is 1 to 4096 characters", field="path")
    with state.tx() as session:
        archive = _stored_context(session, principal, experiment_id)
    return {"file": base64.b64encode(ctx.context_file(archive, body.path)).decode()}


@router.put("/experiments/{experiment_id}/labels/{label}", response_model=responses.Labels)
def put_label(experiment_id: Id, label: LabelPath, principal: UserPrincipal, state: State) -> dict[str, Any]:
    with state.tx() as session:
        return {"labels": change_label(session, principal, experiment_id, label, add=True)}


@router.delete("/experiments/{experiment_id}/labels/{label}", response_model=responses.Labels)
def delete_label(
    experiment_id: Id, label: LabelPath, principal: UserPrincipal, state: State
) -> dict[str, Any]:
    with state.tx() as session:
        return {"labels": change_label(session, principal, experiment_id, label, add=False)}
