"""Metrics: a trial's reports (the harness posts them, singly or in batches: idempotent on steps) and their reads
(``GET /api/v1/trials/{id}/metrics``, by group), Determined's metric streams for trials (tagged
``determined-compat``), and the curves the web UI's charts read, on Determined's paths and with its field names
(``/api/v1/experiments/{id}/metrics-stream/{metric-names,trials-sample,trials-snapshot}``,
``/api/v1/trials/time-series``: streams sent once with ``periodSeconds=0``, or again every ``periodSeconds``
with what changed).

Determined's metric streams for trials, which its SDK reads and hpc-det's ``det`` does not (paths, parameters
and answers are Determined's, ``determined/common/api/bindings.py``; ``docs/determined-client.md``):

- ``GET /api/v1/trials/metrics/trial_metrics?trialIds=..&group=..`` (``GetMetrics``: ``Trial.iter_metrics(group)``,
  ``client.iter_trials_metrics``);
- ``GET /api/v1/trials/metrics/training_metrics?trialIds=..`` and ``/validation_metrics`` (``GetTrainingMetrics``,
  ``GetValidationMetrics``: the SDK's older ``stream_training_metrics`` / ``stream_validation_metrics``).

Each answers newline-delimited JSON, ``{"result": {"metrics": [v1MetricsReport, ...]}}`` per page of up to
``PAGE_SIZE`` reports, trial by trial in id order, each trial's reports by steps, and ends: as Determined's
master does, these streams do not follow a running trial. Only the trials' owners and admins may read them
(every trial is checked before the stream starts, so a refusal is a plain 403 or 404). Each is one of the
caller's streams while it is sent (``api.streams``), its pages read in the stream threads.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from hpc_master.api import convert, responses, responses_ui
from hpc_master.api.bounds import Count64, Id, Limit, Offset
from hpc_master.api.deps import AnyPrincipal, State, UserPrincipal, check_trial_access
from hpc_master.api.fast_ingest import ingest_batch, reports_of
from hpc_master.api.schemas import MetricsBatchRequest, ReportMetricsRequest
from hpc_master.api.streams import ndjson, open_stream, stream_threads
from hpc_master.db.models import ExperimentModel, MetricModel, TrialModel
from hpc_master.db.widths import INT32_MAX
from hpc_master.errors import ClientError
from hpc_master.services import access, harness, notify, redact
from hpc_master.services import metrics as metric_svc
from hpc_master.services import webui as ui
from hpc_master.services.common import get_or_404
from hpc_master.services.curves.experiment import CurveCache, ExperimentCurves
from hpc_master.services.experiments import owner_id_of, searcher_metric
from hpc_master.services.metrics import ingest_metrics
from hpc_master.services.stored_config import experiment_config

router = APIRouter(prefix="/api/v1", tags=["metrics"])

_BATCH_SCHEMA = MetricsBatchRequest.model_json_schema(
    by_alias=True, ref_template="#/components/schemas/{model}"
)
_BATCH_SCHEMA.pop("$defs", None)


@router.post(
    "/trials/{trial_id}/metrics/batch",
    tags=["harness"],
    response_model=responses.BatchAccepted,
    openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {"schema": _BATCH_SCHEMA}}}
    },
)
async def report_metrics_batch(
    trial_id: Id, request: Request, principal: AnyPrincipal, state: State
) -> dict[str, Any]:
    """Idempotent on (trial, trialRunId, group, stepsCompleted): a retried batch adds nothing.

    The hot path: usually answered by ``fast_ingest.MetricsFastPath`` before FastAPI routes it; this route
    takes what the fast path hands over (unknown tokens, bad bodies, errors) and answers the same way. The
    body is parsed and validated in one step (``model_validate_json``), and the rows join the metrics
    writer's next group commit; the answer comes once they are committed.
    """
    body = MetricsBatchRequest.model_validate_json(await request.body())
    reports = reports_of(body.metrics)
    accepted, duplicates = await state.writer.run(ingest_batch(principal, trial_id, reports), len(reports))
    if any(r.group == "validation" for r in reports):
        notify.changed()  # the searcher reacts to validations
    return {"accepted": accepted, "duplicates": duplicates}


@router.post("/trials/{trial_id}/metrics", tags=["harness"], response_model=responses.Empty)
def report_metrics(
    trial_id: Id, body: ReportMetricsRequest, principal: AnyPrincipal, state: State
) -> dict[str, Any]:
    with state.tx() as session:
        check_trial_access(session, principal, trial_id, write=True)
        reports = reports_of([body.metrics], body.group)
        ingest_metrics(session, trial_id, reports)
        harness.record_validations_for_searcher(session, trial_id, reports)
    return {}


PAGE_SIZE = 1000
"""Reports per streamed message (Determined's master sends pages of 1,000)."""


MAX_TRIAL_IDS = 1000


TrialIds = Annotated[list[Id], Query(alias="trialIds", max_length=MAX_TRIAL_IDS)]


Group = Annotated[str, Query(min_length=1, max_length=64)]  # metrics.group is a String(64)


_SUB_MILLISECONDS = re.compile(r"(\.\d{3})\d*(?=Z$)")


def metrics_report_to_api(row: MetricModel) -> dict[str, Any]:
    """Determined's ``v1MetricsReport``. Its ``metrics`` are keyed as Determined stores them: a validation's
    under ``validation_metrics``, any other group's under ``avg_metrics`` (with ``batch_metrics`` when
    reported), which is where its SDK's ``TrialMetrics`` looks for them."""
    stored = convert.metrics_to_api(row.metrics if isinstance(row.metrics, dict) else {}) or {}
    avg = stored.get("avgMetrics", {})
    metrics: dict[str, Any]
    if row.group == "validation":
        metrics = {"validation_metrics": avg}
    else:
        metrics = {"avg_metrics": avg}
        if stored.get("batchMetrics") is not None:
            metrics["batch_metrics"] = stored["batchMetrics"]
    end_time = convert.iso(row.report_time) or ""
    return {
        "id": row.id,
        "trialId": row.trial_id,
        "trialRunId": row.trial_run_id,
        "totalBatches": row.steps_completed,
        # Milliseconds, as Determined's master sends (older Pythons' parsers take no more).
        "endTime": _SUB_MILLISECONDS.sub(r"\1", end_time),
        "metrics": metrics,
        "group": row.group,
        "archived": False,
    }


def _readable_trials(state: State, principal: UserPrincipal, trial_ids: list[int]) -> list[int]:
    """The ids in order, after checking each exists and is the principal's (or the principal is an admin)."""
    if not trial_ids:
        raise ClientError("must specify at least one trialId", field="trialIds")
    if len(set(trial_ids)) != len(trial_ids):
        duplicate = next(i for i in trial_ids if trial_ids.count(i) > 1)
        raise ClientError(f"duplicate id={duplicate} specified", field="trialIds")
    with state.tx() as session:
        for trial_id in trial_ids:
            trial = get_or_404(session, TrialModel, trial_id, "trial")
            experiment = get_or_404(session, ExperimentModel, trial.experiment_id, "experiment")
            access.experiment_private(principal, experiment)
    return sorted(trial_ids)


def _stream(state: State, principal: UserPrincipal, trial_ids: list[int], group: str) -> StreamingResponse:
    def pages() -> Iterator[bytes]:  # each page read in the stream threads, not the routes' pool
        for trial_id in trial_ids:
            after: tuple[int, int] | None = None
            while True:
                with state.tx() as session:
                    rows = metric_svc.metrics_page(session, trial_id, group, after=after, limit=PAGE_SIZE)
                    page = [metrics_report_to_api(row) for row in rows]
                if page:
                    yield ndjson([{"metrics": page}])
                    after = (int(page[-1]["totalBatches"]), int(page[-1]["id"]))
                if len(page) < PAGE_SIZE:
                    break

    return open_stream(state.streams, principal, stream_threads.iterate(pages()))


@router.get(
    "/trials/metrics/trial_metrics",
    tags=["determined-compat"],
    **responses_ui.ndjson(responses_ui.MetricsPageLine),
)
def trials_metrics(
    state: State,
    principal: UserPrincipal,
    group: Group,
    trial_ids: TrialIds = [],  # noqa: B006
) -> StreamingResponse:
    """Determined's ``GetMetrics``: the trials' reports of one group (``training``, ``validation``, or any
    group the trials reported)."""
    return _stream(state, principal, _readable_trials(state, principal, trial_ids), group)


@router.get(
    "/trials/metrics/training_metrics",
    tags=["determined-compat"],
    **responses_ui.ndjson(responses_ui.MetricsPageLine),
)
def trials_training_metrics(
    state: State,
    principal: UserPrincipal,
    trial_ids: TrialIds = [],  # noqa: B006
) -> StreamingResponse:
    return _stream(state, principal, _readable_trials(state, principal, trial_ids), "training")


@router.get(
    "/trials/metrics/validation_metrics",
    tags=["determined-compat"],
    **responses_ui.ndjson(responses_ui.MetricsPageLine),
)
def trials_validation_metrics(
    state: State,
    principal: UserPrincipal,
    trial_ids: TrialIds = [],  # noqa: B006
) -> StreamingResponse:
    return _stream(state, principal, _readable_trials(state, principal, trial_ids), "validation")


def _metrics(state: State, trial_id: int, group: str | None, offset: int, limit: int) -> dict[str, Any]:
    with state.tx() as session:
        get_or_404(session, TrialModel, trial_id, "trial")
        rows = metric_svc.query_metrics(session, trial_id, group, offset=offset, limit=limit)
        return {"metrics": [convert.metric_to_api(r) for r in rows]}


@router.get("/trials/{trial_id}/metrics", response_model=responses.MetricReports)
def trial_metrics(
    trial_id: Id,
    state: State,
    principal: UserPrincipal,
    group: str | None = None,
    offset: Offset = 0,
    limit: Limit = 0,
) -> dict[str, Any]:
    return _metrics(state, trial_id, group, offset, limit)


@router.get("/trials/{trial_id}/metrics/training_metrics", response_model=responses.MetricReports)
def training_metrics(trial_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    return _metrics(state, trial_id, "training", 0, 0)


@router.get("/trials/{trial_id}/metrics/validation_metrics", response_model=responses.MetricReports)
def validation_metrics(trial_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    return _metrics(state, trial_id, "validation", 0, 0)


MaxDatapoints = Annotated[int, Query(alias="maxDatapoints", ge=10, le=10_000)]


PeriodSeconds = Annotated[float, Query(alias="periodSeconds", ge=0, le=60)]


MetricName = Annotated[str, Query(alias="metricName", min_length=1, max_length=256)]


GroupFilter = Annotated[str | None, Query(max_length=64)]


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
    return ndjson([result], browser=True)


def _periodic_stream(
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


@router.get(
    "/experiments/{experiment_id}/metrics-stream/metric-names",
    tags=["webui"],
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
    return _periodic_stream(state, principal, names, changed, period_s)


def _owner_of(state: State, experiment_id: int) -> int:
    """The experiment's owner (``redact.shown`` of its trials' hparams); 404 when there is no experiment."""
    with state.tx() as session:
        return owner_id_of(session, experiment_id)


@router.get(
    "/experiments/{experiment_id}/metrics-stream/trials-sample",
    tags=["webui"],
    **responses_ui.ndjson(responses_ui.TrialsSampleLine),
)
async def trials_sample(
    experiment_id: Id,
    request: Request,
    state: State,
    principal: UserPrincipal,
    metric_name: MetricName,
    group: GroupFilter = None,
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

    return _periodic_stream(state, principal, first, then, period_s)


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
    tags=["webui"],
    **responses_ui.ndjson(responses_ui.TrialsSnapshotLine),
)
async def trials_snapshot(
    experiment_id: Id,
    state: State,
    principal: UserPrincipal,
    metric_name: MetricName,
    batches_processed: Annotated[Count64, Query(alias="batchesProcessed")],
    group: GroupFilter = None,
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

    return _periodic_stream(state, principal, snapshot, changed, period_s)


@router.get("/trials/time-series", tags=["webui"], response_model=responses_ui.TimeSeries)
def trials_time_series(
    state: State,
    principal: UserPrincipal,
    trial_ids: Annotated[list[Id], Query(alias="trialIds", min_length=1, max_length=100)],
    metric_names: Annotated[list[str] | None, Query(alias="metricNames", max_length=100)] = None,
    group: GroupFilter = None,
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
