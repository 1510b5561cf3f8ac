"""The web UI: its pages and assets at ``/``, and what only the UI asks, under ``/api/v1/webui/`` (the
experiment list, the trials table, ASHA's rungs, the cluster, the session, the vocabulary). The charts read Determined's
metrics streams (``routes_metrics``); the pages' change streams are ``routes_ui_live``. Every data route is a
read any user may make (experiments are the team's to look at); per-trial tokens are refused, as everywhere
but the harness routes.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from hpc_master.api import convert, responses, responses_ui, routes_ui_live, session_cookie
from hpc_master.api.bounds import Id, Limit, Offset
from hpc_master.api.deps import State, UserPrincipal
from hpc_master.db.models import ExperimentModel, UserModel
from hpc_master.services import access
from hpc_master.services import webui as ui
from hpc_master.services.common import get_or_404
from hpc_master.services.curves.experiment import CurveCache
from hpc_master.services.vocabulary import vocabulary
from hpc_master.tasks.service import task_vocabulary
from slurm_backend.cli import SlurmCli
from slurm_backend.cluster_view import DEFAULT_TTL_S, CachedClusterView, ClusterView
from webui import ASSETS_DIR

router = APIRouter(prefix="/api/v1", tags=["webui"])
pages = APIRouter(include_in_schema=False)


@router.get("/webui/experiments", response_model=responses_ui.UiExperiments)
def ui_experiments(
    state: State,
    principal: UserPrincipal,
    name: Annotated[str, Query(max_length=512)] = "",
    states: Annotated[list[Annotated[str, Query(max_length=64)]] | None, Query(max_length=20)] = None,
    users: Annotated[list[Annotated[str, Query(max_length=128)]] | None, Query(max_length=100)] = None,
    archived: bool | None = None,
    sort_by: Annotated[str, Query(alias="sortBy", max_length=32)] = "id",
    order_by: Annotated[str, Query(alias="orderBy", max_length=32)] = "ORDER_BY_DESC",
    offset: Offset = 0,
    limit: Limit = 100,
) -> dict[str, Any]:
    """The experiment list: filter by name (substring), state, owner and archived; sort by ``id``, ``name``,
    ``owner``, ``state``, ``progress``, ``startTime``, ``endTime`` or ``resourcePool``. Each experiment as
    ``GET /api/v1/experiments`` has it, plus ``numTrials`` and ``bestSearcherMetric``."""
    with state.tx() as session:
        rows, total = ui.list_experiments(
            session,
            name=name,
            states=states or [],
            users=users or [],
            archived=archived,
            sort_by=sort_by,
            descending=order_by.upper() in ("ORDER_BY_DESC", "DESC"),
            offset=offset,
            limit=limit,
        )
        items = []
        for row in rows:
            item = convert.experiment_to_api(
                row.experiment, row.username, None, viewer=principal, with_config=False
            )
            item["numTrials"] = row.num_trials
            item["bestSearcherMetric"] = row.best_metric
            item["canModify"] = access.owns(principal, row.experiment.owner_id)
            items.append(item)
    return {"experiments": items, "pagination": convert.pagination(offset, limit, total, len(items))}


@router.get("/webui/experiments/{experiment_id}/trials", response_model=responses_ui.UiTrials)
def ui_trials(experiment_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    """The trials table: each trial as ``GET /api/v1/experiments/{id}/trials`` has it, plus its current run
    (``slurmJobId``, ``nodeList``, ``runState``, live or not) and its latest validation (``latestValidation``:
    ``{stepsCompleted, metrics}``)."""
    with state.tx() as session:
        experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
        items = []
        for trial, run, latest in ui.trial_rows(session, experiment_id):
            item = convert.trial_to_api(trial, principal, experiment.owner_id)
            item["currentRun"] = convert.run_to_api(run) if run is not None else None
            item["runLive"] = ui.run_is_live(run)
            item["latestValidation"] = {"stepsCompleted": latest[0], "metrics": latest[1]} if latest else None
            items.append(item)
    return {"trials": items}


@router.get("/webui/experiments/{experiment_id}/rungs", response_model=responses_ui.Rungs)
def ui_rungs(experiment_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    """ASHA's brackets and rungs (``services.webui.searcher_rungs``): each rung's trials with their metric
    and ``status`` (promoted, paused — waiting for promotion —, running, stopped) and ``resumed``."""
    with state.tx() as session:
        experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
        return ui.searcher_rungs(session, experiment)


@router.get("/webui/cluster", response_model=responses_ui.Cluster)
def ui_cluster(request: Request, state: State, principal: UserPrincipal) -> dict[str, Any]:
    """The cluster page: Slurm's partitions as ``resourcePools`` and its nodes as ``agents`` (Determined's
    names: a GPU is a slot; ``slotsAvailable`` counts a pool's GPUs, ``slotsUsed`` those jobs hold), read from
    ``scontrol`` at most once per ``cacheSeconds`` whoever asks (``fetchedAt`` says when; ``error`` why Slurm
    could not be read), and the platform's queued trial runs (``queued``: PENDING runs, with Slurm's
    ``pendingReason`` and ``pendingSince`` once known, and where they wait: ``waitingIn`` slurm or master)."""
    cache: CachedClusterView = request.app.state.cluster_view
    view = cache.get()
    with state.tx() as session:
        queued = []
        for q in ui.queued_runs(session):
            item = convert.run_to_api(q.run)
            item.update(
                trialId=q.run.trial_id,
                experimentId=q.experiment_id,
                experimentName=q.experiment_name,
                owner=q.username,
            )
            queued.append(item)
    return {**cluster_to_api(view), "cacheSeconds": cache.ttl_s, "queued": queued}


def cluster_to_api(view: ClusterView) -> dict[str, Any]:
    pools = []
    for p in view.partitions:
        total, used, free = view.partition_gpus(p.name)
        pools.append(
            {
                "name": p.name,
                "description": f"Slurm partition {p.name}",
                "type": "RESOURCE_POOL_TYPE_STATIC",
                "defaultComputePool": p.default,
                "state": p.state,
                "maxTime": p.max_time,
                "priorityTier": p.priority_tier,
                "preemptMode": p.preempt_mode,
                "numAgents": len(p.nodes),
                "agentIds": list(p.nodes),
                "slotType": "TYPE_CUDA",
                "slotsAvailable": total,
                "slotsUsed": used,
                "slotsFree": free,
            }
        )
    agents = [
        {
            "id": n.name,
            "state": n.state,
            "enabled": n.available,
            "reason": n.reason,
            "resourcePools": list(n.partitions),
            "gpuType": n.gpu_type,
            "numSlots": n.gpus_total,
            "slotsUsed": n.gpus_used,
            "slotsFree": n.gpus_free,
            "cpus": n.cpus_total,
            "cpusUsed": n.cpus_alloc,
            "memoryMb": n.mem_mb,
            "memoryUsedMb": n.mem_alloc_mb,
        }
        for n in view.nodes
    ]
    return {
        "resourcePools": pools,
        "agents": agents,
        "fetchedAt": convert.iso(dt.datetime.fromtimestamp(view.fetched_at, dt.UTC)),
        "error": view.error,
    }


@router.get("/webui/session", response_model=responses.Session)
def ui_session(request: Request, state: State, principal: UserPrincipal) -> dict[str, Any]:
    """Who the browser is logged in as (the UI's first request; 401 sends it to the login page), and the CSRF
    value its state-changing requests carry (no cookie of the master is readable by a script)."""
    token = session_cookie.cookie_token(request) if "authorization" not in request.headers else None
    with state.tx() as session:
        user = get_or_404(session, UserModel, principal.user_id, "user")
        return {
            "user": convert.user_to_api(user),
            "passwordsRequired": state.config.passwords_required(),
            "csrfToken": session_cookie.csrf_token_for(token) if token else None,
        }


@router.get("/webui/vocabulary", response_model=responses_ui.Vocabulary)
def ui_vocabulary(principal: UserPrincipal) -> dict[str, object]:
    """The states, actions and words of the master's own tables (the UI asks once per session)."""
    return {**vocabulary(), **task_vocabulary()}


# ---------------------------------------------------------------- pages and assets

_INDEX = ASSETS_DIR / "index.html"
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-cache",
}


def _index() -> FileResponse:
    return FileResponse(_INDEX, media_type="text/html", headers=_SECURITY_HEADERS)


@pages.get("/")
@pages.get("/login")
@pages.get("/experiments")
@pages.get("/cluster")
@pages.get("/tasks")
def index_page() -> FileResponse:
    return _index()


@pages.get("/experiments/{rest:path}")
@pages.get("/trials/{rest:path}")
def detail_page(rest: str) -> FileResponse:
    """Any id, valid or not: the page itself says when there is no such experiment or trial."""
    return _index()


_NOT_FOUND = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Not found · hpc-det</title>
<link rel="stylesheet" href="/webui/css/app.css"></head><body><main class="notfound"><h1>Page not found</h1>
<p>There is no page at this address.</p><p><a href="/experiments">Go to the experiments</a></p></main></body></html>
"""


def install(app: FastAPI) -> None:
    """Mount the UI on ``app`` (``router``, the data routes, is included by ``create_app``): pages, assets at ``/webui/``, and an HTML page (not JSON, never
    a stack trace) for an unknown address outside ``/api``."""
    app.state.curves = CurveCache()
    app.state.cluster_view = CachedClusterView(SlurmCli(timeout_s=10.0), ttl_s=DEFAULT_TTL_S)
    app.include_router(routes_ui_live.router, responses=responses.ERRORS)  # the pages' change streams
    app.include_router(pages)
    app.mount("/webui", StaticFiles(directory=ASSETS_DIR, check_dir=True), name="webui")

    async def not_found(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if (
            exc.status_code == 404
            and request.method == "GET"
            and not request.url.path.startswith("/api/")
            and "text/html" in request.headers.get("accept", "")
        ):
            return HTMLResponse(_NOT_FOUND, status_code=404, headers=_SECURITY_HEADERS)
        return await http_exception_handler(request, exc)

    app.add_exception_handler(StarletteHTTPException, not_found)
