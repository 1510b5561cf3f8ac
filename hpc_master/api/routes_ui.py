"""The web UI: its pages and assets at ``/``, and the data routes its charts read.

Data routes follow Determined's paths and field names where Determined has one
(``/api/v1/experiments/{id}/metrics-stream/{metric-names,trials-sample,trials-snapshot}``,
``/api/v1/trials/time-series``); streams are newline-delimited JSON, one ``{"result": {...}}`` per message,
sent once (``periodSeconds=0``) or again every ``periodSeconds`` with what changed. What only the UI needs is
under ``/api/v1/webui/``. Every route is a read any user may make (experiments are the team's to look at);
per-trial tokens are refused, as everywhere but the harness routes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import FileResponse, HTMLResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from hpc_master.api import convert, responses, responses_ui, routes_ui_live
from hpc_master.api.bounds import INT32_MAX, Count64, Id, Limit, Offset
from hpc_master.api.deps import State, UserPrincipal
from hpc_master.api.streams import open_stream, stream_threads
from hpc_master.db.models import ExperimentModel, TrialModel, UserModel
from hpc_master.services import access, redact
from hpc_master.services import webui as ui
from hpc_master.services.common import get_or_404
from hpc_master.services.curves.experiment import CurveCache, ExperimentCurves
from hpc_master.services.experiments import owner_id_of, searcher_metric
from hpc_master.services.stored_config import experiment_config
from slurm_backend.cli import SlurmCli
from slurm_backend.cluster_view import DEFAULT_TTL_S, CachedClusterView, ClusterView
from webui import ASSETS_DIR

router = APIRouter(prefix="/api/v1", tags=["webui"])
pages = APIRouter(include_in_schema=False)

MaxDatapoints = Annotated[int, Query(alias="maxDatapoints", ge=10, le=10_000)]
PeriodSeconds = Annotated[float, Query(alias="periodSeconds", ge=0, le=60)]
MetricName = Annotated[str, Query(alias="metricName", min_length=1, max_length=256)]
Group = Annotated[str | None, Query(max_length=64)]
MetricType = Annotated[str | None, Query(alias="metricType", max_length=64)]
KEEPALIVE_S = 15.0

_METRIC_TYPES = {"METRIC_TYPE_TRAINING": "training", "METRIC_TYPE_VALIDATION": "validation"}


def _group(group: str | None, metric_type: str | None, default: str = "validation") -> str:
    """Determined's newer ``group``, or its older ``metricType`` enum."""
    if group:
        return group
    if metric_type:
        return _METRIC_TYPES.get(metric_type.upper(), metric_type.lower())
    return default


def _curves(request: Request, experiment_id: int) -> ExperimentCurves:
    cache: CurveCache = request.app.state.curves
    return cache.get(experiment_id)


def _line(result: dict[str, Any] | bytes) -> bytes:
    """One stream line; bytes are a line already serialised (a cached first message)."""
    if isinstance(result, bytes):
        return result
    return orjson.dumps({"result": result}) + b"\n"


def _stream(
    state: State,
    principal: UserPrincipal,
    first: Callable[[], tuple[dict[str, Any] | bytes, Any]],
    then: Callable[[Any], tuple[dict[str, Any] | None, Any]],
    period_s: float,
) -> StreamingResponse:
    """One message from ``first()``; with a period, every ``period_s`` the message ``then(cursor)`` makes
    (None: nothing changed; a keepalive is sent every ``KEEPALIVE_S`` instead). One of the caller's streams
    while it is open; its reads run in the stream threads (``api.streams``)."""

    async def messages() -> AsyncIterator[bytes]:
        message, cursor = await stream_threads.run(first)
        yield _line(message)
        quiet_since = time.monotonic()
        while period_s > 0:
            await asyncio.sleep(period_s)
            update, cursor = await stream_threads.run(then, cursor)
            if update is not None:
                quiet_since = time.monotonic()
                yield _line(update)
            elif time.monotonic() - quiet_since > KEEPALIVE_S:
                quiet_since = time.monotonic()
                yield b"\n"

    return open_stream(state.streams, principal, messages())


# ---------------------------------------------------------------- Determined's metrics streams


@router.get(
    "/experiments/{experiment_id}/metrics-stream/metric-names",
    **responses_ui.ndjson(responses_ui.MetricNamesLine),
)
async def metric_names(
    experiment_id: Id, request: Request, state: State, principal: UserPrincipal, period_s: PeriodSeconds = 0
) -> StreamingResponse:
    """Every metric reported by the experiment's trials: ``trainingMetrics``, ``validationMetrics`` and, for
    any group, ``metricNames`` (``[{group, metricNames}]``), with the ``searcherMetric``."""
    curves = _curves(request, experiment_id)

    def names(_cursor: Any = None) -> tuple[dict[str, Any], Any]:
        with state.tx() as session:
            experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
            metric, _ = searcher_metric(experiment_config(experiment))
        curves.refresh(state.tx)  # never inside a transaction: it takes the curves' lock first
        by_group = curves.names()
        return {
            "searcherMetric": metric or "",
            "trainingMetrics": by_group.get("training", []),
            "validationMetrics": by_group.get("validation", []),
            "metricNames": [{"group": g, "metricNames": n} for g, n in by_group.items()],
        }, by_group

    def changed(cursor: Any) -> tuple[dict[str, Any] | None, Any]:
        message, by_group = names()
        return (message if by_group != cursor else None), by_group

    await run_in_threadpool(_owner_of, state, experiment_id)  # 404 before the stream starts
    return _stream(state, principal, names, changed, period_s)


def _owner_of(state: State, experiment_id: int) -> int:
    """The experiment's owner (``redact.shown`` of its trials' hparams); 404 when there is no experiment."""
    with state.tx() as session:
        return owner_id_of(session, experiment_id)


@router.get(
    "/experiments/{experiment_id}/metrics-stream/trials-sample",
    **responses_ui.ndjson(responses_ui.TrialsSampleLine),
)
async def trials_sample(
    experiment_id: Id,
    request: Request,
    state: State,
    principal: UserPrincipal,
    metric_name: MetricName,
    group: Group = None,
    metric_type: MetricType = None,
    max_trials: Annotated[int, Query(alias="maxTrials", ge=0, le=INT32_MAX)] = 0,
    max_datapoints: MaxDatapoints = 1000,
    start_batches: Annotated[Count64, Query(alias="startBatches")] = 0,
    end_batches: Annotated[Count64 | None, Query(alias="endBatches")] = None,
    period_s: PeriodSeconds = 0,
) -> StreamingResponse:
    """Every trial's curve of one metric, downsampled on the server (each bucket's min and max point, so
    the shape survives): ``{trials: [{trialId, hparams, data: [{batches, value}]}], promotedTrials,
    demotedTrials}``. ``maxTrials`` 0 (the default) means all of them: unlike Determined's WebUI (its
    top 100), a search of hundreds of trials is drawn whole. Later messages carry only trials whose curve
    changed (replace those trials' data)."""
    name = metric_name
    chosen = _group(group, metric_type)
    curves = _curves(request, experiment_id)
    owner_id = await run_in_threadpool(_owner_of, state, experiment_id)  # 404 before the stream starts

    def sample(since: int) -> tuple[dict[str, Any], int]:
        generation = curves.refresh(state.tx)  # never inside a transaction: it takes the curves' lock first
        series = curves.sample(chosen, name, max_datapoints, since_generation=since)
        ids = sorted(series)
        with state.tx() as session:
            if max_trials and len(ids) > max_trials:
                ids = _best_trials(session, experiment_id, ids, max_trials)
            hparams: dict[int, Any] = dict(
                session.execute(
                    TrialModel.__table__.select()
                    .with_only_columns(TrialModel.id, TrialModel.hparams)
                    .where(TrialModel.id.in_(ids))
                ).all()
            )
        trials = []
        for trial_id in ids:
            steps, values = series[trial_id]
            if start_batches or end_batches is not None:
                keep = (steps >= start_batches) & (
                    steps <= (end_batches if end_batches is not None else steps)
                )
                steps, values = steps[keep], values[keep]
            trials.append(
                {
                    "trialId": trial_id,
                    "hparams": redact.shown(hparams.get(trial_id) or {}, principal, owner_id),
                    "data": [
                        {"batches": s, "value": v}
                        for s, v in zip(steps.tolist(), values.tolist(), strict=True)
                    ],
                }
            )
        return {
            "trials": trials,
            "promotedTrials": [t["trialId"] for t in trials],
            "demotedTrials": [],
        }, generation

    # Per query and per what the caller may see of the hparams (the owner's and admins' line, or the masked one).
    reveal = redact.reveals(principal, owner_id)
    rendered_key = (chosen, name, max_datapoints, max_trials, start_batches, end_batches, reveal)

    def first() -> tuple[dict[str, Any] | bytes, int]:
        # The whole first message, serialised, is kept per query until a new row changes the curves: a
        # 1,000-trial experiment's is ~35 MB of JSON, and building it again costs over a second.
        generation = curves.refresh(state.tx)
        line = curves.rendered_line(rendered_key, generation)
        if line is None:
            message, generation = sample(-1)
            line = _line(message)
            curves.keep_rendered_line(rendered_key, generation, line)
        return line, generation

    def then(since: int) -> tuple[dict[str, Any] | None, int]:
        message, generation = sample(since)
        return (message if message["trials"] else None), generation

    return _stream(state, principal, first, then, period_s)


def _best_trials(session: Any, experiment_id: int, ids: list[int], n: int) -> list[int]:
    experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
    _, smaller = searcher_metric(experiment_config(experiment))
    rows = session.execute(
        TrialModel.__table__.select()
        .with_only_columns(TrialModel.id, TrialModel.best_validation)
        .where(TrialModel.id.in_(ids))
    ).all()
    missing = float("inf") if smaller else float("-inf")
    rows.sort(key=lambda r: r[1] if r[1] is not None else missing, reverse=not smaller)
    return sorted(r[0] for r in rows[:n])


@router.get(
    "/experiments/{experiment_id}/metrics-stream/trials-snapshot",
    **responses_ui.ndjson(responses_ui.TrialsSnapshotLine),
)
async def trials_snapshot(
    experiment_id: Id,
    state: State,
    principal: UserPrincipal,
    metric_name: MetricName,
    batches_processed: Annotated[Count64, Query(alias="batchesProcessed")],
    group: Group = None,
    metric_type: MetricType = None,
    batches_margin: Annotated[Count64, Query(alias="batchesMargin")] = 0,
    period_s: PeriodSeconds = 0,
) -> StreamingResponse:
    """Each trial's metric at the report nearest ``batchesProcessed`` (± ``batchesMargin``), with its
    hyperparameters: ``{trials: [{trialId, hparams, metric, batchesProcessed}]}`` (the hyperparameter plots)."""
    chosen = _group(group, metric_type)
    owner_id = await run_in_threadpool(_owner_of, state, experiment_id)  # 404 before the stream starts

    def snapshot(_cursor: Any = None) -> tuple[dict[str, Any], Any]:
        with state.tx() as session:
            rows = ui.trials_snapshot(
                session, experiment_id, chosen, metric_name, batches_processed, batches_margin
            )
            trials = [
                {
                    "trialId": t.id,
                    "hparams": redact.shown(t.hparams, principal, owner_id),
                    "metric": value,
                    "batchesProcessed": at,
                }
                for t, value, at in rows
            ]
        return {"trials": trials}, trials

    def changed(cursor: Any) -> tuple[dict[str, Any] | None, Any]:
        message, trials = snapshot()
        return (message if trials != cursor else None), trials

    return _stream(state, principal, snapshot, changed, period_s)


@router.get("/trials/time-series", response_model=responses_ui.TimeSeries)
def trials_time_series(
    state: State,
    principal: UserPrincipal,
    trial_ids: Annotated[list[Id], Query(alias="trialIds", min_length=1, max_length=100)],
    metric_names: Annotated[list[str] | None, Query(alias="metricNames", max_length=100)] = None,
    group: Group = None,
    metric_type: MetricType = None,
    max_datapoints: MaxDatapoints = 1000,
    start_batches: Annotated[Count64, Query(alias="startBatches")] = 0,
    end_batches: Annotated[Count64 | None, Query(alias="endBatches")] = None,
) -> dict[str, Any]:
    """Determined's ``CompareTrials``: per trial, per group, downsampled data points
    ``{batches, values: {name: value}, time}`` (each metric's bucket min and max kept)."""
    chosen = _group(group, metric_type, default="") or None
    names = [n[:256] for n in metric_names or []]
    out = []
    with state.tx() as session:
        for trial_id in trial_ids:
            trial = get_or_404(session, TrialModel, trial_id, "trial")
            series = ui.time_series(
                session, trial_id, chosen, names, max_datapoints, start_batches, end_batches
            )
            out.append(
                {
                    "trial": convert.trial_to_api(
                        trial, principal, owner_id_of(session, trial.experiment_id)
                    ),
                    "metrics": [
                        {"group": g, "type": _type_of(g), "data": d} for g, d in sorted(series.items())
                    ],
                }
            )
    return {"trials": out}


def _type_of(group: str) -> str:
    return {"training": "METRIC_TYPE_TRAINING", "validation": "METRIC_TYPE_VALIDATION"}.get(
        group, "METRIC_TYPE_UNSPECIFIED"
    )


# ---------------------------------------------------------------- what only the UI asks


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
def ui_session(state: State, principal: UserPrincipal) -> dict[str, Any]:
    """Who the browser is logged in as (the UI's first request; 401 sends it to the login page)."""
    with state.tx() as session:
        user = get_or_404(session, UserModel, principal.user_id, "user")
        return {"user": convert.user_to_api(user), "passwordsRequired": state.config.passwords_required()}


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
