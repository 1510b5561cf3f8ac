"""Usage (``services.usage``): Determined's resource allocation routes, which its ``det resources`` calls: JSON under
``/api/v1/resources/allocation/`` and CSV under ``/resources/allocation/``. Query parameters are taken in
Determined's snake_case (what its CLI sends) or camelCase (its REST documentation). The CSV routes are left
out of the OpenAPI document, which describes JSON answers only. Admins see everyone's
usage; other users their own."""

from __future__ import annotations

import csv
import datetime as dt
import io
from typing import Any

from fastapi import APIRouter, Request, Response

from hpc_master.api import responses
from hpc_master.api.deps import State, UserPrincipal
from hpc_master.errors import ClientError
from hpc_master.services import usage

router = APIRouter(prefix="/api/v1/resources/allocation", tags=["usage", "determined-compat"])
bare = APIRouter(prefix="/resources/allocation", tags=["usage", "determined-compat"])
PERIODS: dict[str, usage.Period] = {
    "RESOURCE_ALLOCATION_AGGREGATION_PERIOD_DAILY": "daily",
    "RESOURCE_ALLOCATION_AGGREGATION_PERIOD_MONTHLY": "monthly",
}


def _param(request: Request, snake: str) -> str:
    head, *rest = snake.split("_")
    value = request.query_params.get(snake) or request.query_params.get(
        head + "".join(w.title() for w in rest)
    )
    if not value:
        raise ClientError(f"{snake}: required", field=snake)
    return value


def _timestamp(request: Request, snake: str) -> dt.datetime:
    value = _param(request, snake)
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ClientError(
            f"{snake}: expected a time such as 2026-12-01T00:00:00Z, got {value[:64]!r}", field=snake
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def _raw(request: Request, state: Any, principal: Any) -> list[usage.RunUsage]:
    after, before = _timestamp(request, "timestamp_after"), _timestamp(request, "timestamp_before")
    with state.tx() as session:
        return usage.runs_in(session, state.config, principal, after, before)


def _aggregated(request: Request, state: Any, principal: Any) -> list[dict[str, Any]]:
    first, last = usage.day_range(_param(request, "start_date"), _param(request, "end_date"))
    name = request.query_params.get("period") or "RESOURCE_ALLOCATION_AGGREGATION_PERIOD_DAILY"
    if name not in PERIODS:
        raise ClientError(f"period: expected one of {', '.join(PERIODS)}, got {name[:64]!r}", field="period")
    end = dt.datetime(last.year, last.month, last.day, tzinfo=dt.UTC) + dt.timedelta(days=1)
    start = dt.datetime(first.year, first.month, first.day, tzinfo=dt.UTC)
    with state.tx() as session:
        runs = usage.runs_in(session, state.config, principal, start, end)
    return usage.aggregated(runs, first, last, PERIODS[name])


def _entry(run: usage.RunUsage) -> dict[str, Any]:
    return {
        "kind": "trial",
        "startTime": run.start.isoformat().replace("+00:00", "Z"),
        "endTime": run.end.isoformat().replace("+00:00", "Z"),
        "experimentId": run.experiment_id,
        "username": run.username,
        "userId": run.user_id,
        "labels": list(run.labels),
        "seconds": run.seconds,
        "slots": run.slots,
        # Ours:
        "slotSeconds": run.slot_seconds,
        "trialId": run.trial_id,
        "trialRunId": run.run_number,
        "slurmJobId": run.slurm_job_id,
        "resourcePool": run.resource_pool,
        "workspace": run.workspace,
        "slurmAccount": run.slurm_account,
    }


@router.get("/raw", response_model=responses.UsageRaw)
def raw(request: Request, state: State, principal: UserPrincipal) -> dict[str, Any]:
    """Each trial run that held slots between ``timestamp_after`` and ``timestamp_before``, clipped to them:
    ``seconds`` (Determined's) and ``slotSeconds`` (ours: seconds × slots)."""
    return {"resourceEntries": [_entry(r) for r in _raw(request, state, principal)]}


@router.get("/aggregated", response_model=responses.UsageAggregated)
def aggregated(request: Request, state: State, principal: UserPrincipal) -> dict[str, Any]:
    """Slot-seconds per day (or month) from ``start_date`` to ``end_date``, both included, in total and by user,
    label, resource pool, and (ours) workspace and Slurm account."""
    return {"resourceEntries": _aggregated(request, state, principal)}


RAW_COLUMNS = ("experimentId", "trialId", "trialRunId", "slurmJobId", "kind", "username", "startTime",
               "endTime", "seconds", "slots", "slotSeconds", "resourcePool", "workspace", "slurmAccount", "labels")  # fmt: skip


def _csv(header: list[str], rows: list[list[Any]], name: str) -> Response:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    headers = {"content-disposition": f'attachment; filename="{name}.csv"'}
    return Response(out.getvalue(), media_type="text/csv; charset=utf-8", headers=headers)


@bare.get("/raw", response_class=Response, include_in_schema=False)
def raw_csv(request: Request, state: State, principal: UserPrincipal) -> Response:
    """``/api/v1/resources/allocation/raw`` as CSV (Determined's ``det resources raw`` without ``--json``)."""
    rows = []
    for run in _raw(request, state, principal):
        entry = _entry(run)
        rows.append([";".join(entry[c]) if c == "labels" else entry[c] for c in RAW_COLUMNS])
    return _csv(list(RAW_COLUMNS), rows, "allocation-raw")


@bare.get("/allocations-csv", response_class=Response, include_in_schema=False)
def allocations_csv(request: Request, state: State, principal: UserPrincipal) -> Response:
    """Determined's ``det resources allocations``: one line per allocation (here: per trial run)."""
    return raw_csv(request, state, principal)


@bare.get("/aggregated", response_class=Response, include_in_schema=False)
def aggregated_csv(request: Request, state: State, principal: UserPrincipal) -> Response:
    """``/api/v1/resources/allocation/aggregated`` as CSV: ``period_start, aggregation_type, aggregation_key,
    seconds`` (``total`` with an empty key, then ``username``, ``experiment_label``, ``resource_pool``,
    ``workspace`` and ``slurm_account``)."""
    kinds = {"byUsername": "username", "byExperimentLabel": "experiment_label", "byResourcePool": "resource_pool",
             "byWorkspace": "workspace", "bySlurmAccount": "slurm_account"}  # fmt: skip
    rows: list[list[Any]] = []
    for entry in _aggregated(request, state, principal):
        rows.append([entry["periodStart"], "total", "", entry["seconds"]])
        for key, kind in kinds.items():
            rows += [[entry["periodStart"], kind, name, seconds] for name, seconds in entry[key].items()]
    return _csv(
        ["period_start", "aggregation_type", "aggregation_key", "seconds"], rows, "allocation-aggregated"
    )
