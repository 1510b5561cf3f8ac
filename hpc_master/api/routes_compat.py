"""Routes that Determined's own CLI and SDK (``pip install determined``) call and hpc-det's ``det`` does not:
the version check (``GET /info``), users by name and id, an admin's password reset, a trial's workloads.

Paths, parameters and JSON field names are Determined's (``determined/common/api/bindings.py``), so that
its client runs unmodified (``docs/determined-client.md``).
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

from fastapi import APIRouter, Body, FastAPI, Query, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse
from sqlalchemy import select
from starlette.exceptions import HTTPException as StarletteHTTPException

from hpc_master.api import convert, responses
from hpc_master.api.bounds import Id, Limit, Offset
from hpc_master.api.deps import State, UserPrincipal, request_token
from hpc_master.auth import hash_token
from hpc_master.db.models import CheckpointModel, MetricModel, TrialModel, UserModel
from hpc_master.errors import NotFoundError
from hpc_master.services import users
from hpc_master.services.common import get_or_404
from hpc_master.services.workloads import WorkloadFilter, list_workloads
from hpc_master.version import master_version

DETERMINED_API_VERSION = "0.38.1"
"""The release of Determined whose client this master is tested with (``GET /info``'s ``version``, which
that client compares with its own before every command)."""

router = APIRouter(tags=["determined-compat"])
api = APIRouter(prefix="/api/v1", tags=["determined-compat"])


@router.get("/info", response_model=responses.Info)
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


@api.get("/users/{username}/by-username", response_model=responses.UserAnswer)
def user_by_username(username: str, principal: UserPrincipal, state: State) -> dict[str, Any]:
    with state.tx() as session:
        user = session.scalar(select(UserModel).where(UserModel.username == username))
        if user is None:
            raise NotFoundError(f"user {username!r} not found")
        return {"user": convert.user_to_api(user)}


@api.get("/users/{user_id}", response_model=responses.UserAnswer)
def get_user(user_id: Id, principal: UserPrincipal, state: State) -> dict[str, Any]:
    with state.tx() as session:
        return {"user": convert.user_to_api(get_or_404(session, UserModel, user_id, "user"))}


@api.post("/users/{user_id}/password", response_model=responses.UserAnswer)
def set_user_password(
    user_id: Id,
    password: Annotated[str, Body(max_length=1024)],
    request: Request,
    principal: UserPrincipal,
    state: State,
) -> dict[str, Any]:
    """Determined's ``SetUserPassword``: the body is the new password itself, a JSON string, in plain text
    (the master hashes it). The same rules as a password in ``PATCH /users/{id}``."""
    with state.tx() as session:
        user = users.patch_user(
            session,
            principal,
            user_id,
            password=password,
            require_passwords=state.config.passwords_required(),
            cache=state.tokens,
            keep_token_hash=hash_token(request_token(request)),
        )
        return {"user": convert.user_to_api(user)}


@api.get("/trials/{trial_id}/workloads", response_model=responses.Workloads)
def trial_workloads(
    trial_id: Id,
    principal: UserPrincipal,
    state: State,
    offset: Offset = 0,
    limit: Limit = 0,
    order_by: Annotated[str | None, Query(alias="orderBy")] = None,
    filter_option: Annotated[WorkloadFilter, Query(alias="filter")] = WorkloadFilter.UNSPECIFIED,
    include_batch_metrics: Annotated[bool, Query(alias="includeBatchMetrics")] = False,
    remove_deleted: Annotated[bool, Query(alias="removeDeletedCheckpoints")] = False,
) -> dict[str, Any]:
    """A trial's training and validation reports and checkpoints, by steps (Determined's
    ``GetTrialWorkloads``; ``sortKey`` and ``metricType`` are not supported and ignored)."""
    with state.tx() as session:
        get_or_404(session, TrialModel, trial_id, "trial")
        page = list_workloads(
            session,
            trial_id,
            filter_option=filter_option,
            offset=offset,
            limit=limit,
            descending=(order_by or "").upper() == "ORDER_BY_DESC",
            remove_deleted=remove_deleted,
        )
        items = [workload_to_api(w, batch_metrics=include_batch_metrics) for w in page.items]
    return {"workloads": items, "pagination": convert.pagination(offset, limit, page.total, len(items))}


def workload_to_api(row: MetricModel | CheckpointModel, *, batch_metrics: bool = False) -> dict[str, Any]:
    """Determined's ``WorkloadContainer``: ``training``, ``validation`` or ``checkpoint``."""
    if isinstance(row, CheckpointModel):
        return {
            "checkpoint": {
                "uuid": row.uuid,
                "state": convert.api_state(row.state),
                "totalBatches": row.steps_completed,
                "endTime": convert.iso(row.report_time),
                "resources": row.resources,
                "metadata": row.metadata_,
            }
        }
    reported = row.metrics if isinstance(row.metrics, dict) else {}
    avg = reported.get("avgMetrics", reported)
    metrics: dict[str, Any] = {"avgMetrics": avg if isinstance(avg, dict) else {}}
    if batch_metrics and "batchMetrics" in reported:
        metrics["batchMetrics"] = reported["batchMetrics"]
    return {
        row.group: {
            "metrics": metrics,
            "numInputs": 0,
            "totalBatches": row.steps_completed,
            "endTime": convert.iso(row.report_time),
        }
    }


router.include_router(api)


_CODES = {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied", 404: "not_found",
          405: "not_implemented", 413: "payload_too_large", 429: "too_many_requests"}  # fmt: skip
"""The code of an HTTP error that FastAPI or Starlette raised themselves (a body that is not JSON: 400)."""


def install(app: FastAPI) -> None:
    """Answer every HTTP error under ``/api/`` that FastAPI or Starlette raised themselves in our error shape
    (``code``, ``message``; Determined's client prints the message) instead of ``{"detail": ...}``: a route
    this master lacks says so (its 404, which that client would show as an empty error), and a body that
    is not JSON is a 400 ``invalid_argument``. Other addresses keep the handler installed before this one."""
    previous = app.exception_handlers.get(StarletteHTTPException, http_exception_handler)

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        path = request.url.path
        if not path.startswith("/api/") or exc.status_code < 400:
            answer = previous(request, exc)
            return await answer if inspect.isawaitable(answer) else answer
        code, message = _CODES.get(exc.status_code, "error"), str(exc.detail)
        if exc.status_code in (404, 405) and exc.detail in ("Not Found", "Method Not Allowed"):
            code = "not_implemented"
            message = (
                f"{request.method} {path} is not implemented by this master (hpc-det, a Slurm-native master "
                "modelled on Determined); docs/determined-client.md lists what Determined's CLI and SDK can "
                "do with it"
            )
        return JSONResponse(
            {"code": code, "message": message, "field": None},
            status_code=exc.status_code,
            headers=exc.headers,
        )

    app.add_exception_handler(StarletteHTTPException, api_error)
