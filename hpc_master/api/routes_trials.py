"""Trials: get, kill, metrics queries, logs."""

from __future__ import annotations

import asyncio
import enum
import json
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from pydantic import StringConstraints
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from hpc_master.api import convert, responses, responses_ui
from hpc_master.api.bounds import Count32, Id, Limit, Offset
from hpc_master.api.deps import State, UserPrincipal
from hpc_master.api.streams import open_stream, stream_threads
from hpc_master.db.models import ExperimentModel, TrialModel, TrialRunModel
from hpc_master.errors import ClientError
from hpc_master.services import access, logs, notify
from hpc_master.services import experiments as exps
from hpc_master.services import metrics as metric_svc
from hpc_master.services.checkpoints.usage import StorageTotals, trial_totals
from hpc_master.services.common import get_or_404
from hpc_master.services.lifecycle import live_run_of
from hpc_master.services.states import TERMINAL_TRIAL_STATES

router = APIRouter(prefix="/api/v1", tags=["trials"])

LOG_POLL_INTERVAL_S = 0.5


@router.get("/trials/{trial_id}", response_model=responses.TrialAnswer)
def get_trial(trial_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    with state.tx() as session:
        trial = get_or_404(session, TrialModel, trial_id, "trial")
        runs = list(
            session.scalars(
                select(TrialRunModel)
                .where(TrialRunModel.trial_id == trial_id)
                .order_by(TrialRunModel.run_number)
            )
        )
        totals = trial_totals(session, [trial_id]).get(trial_id, StorageTotals())
        owner_id = exps.owner_id_of(session, trial.experiment_id)
        return {"trial": convert.trial_to_api(trial, principal, owner_id, runs, storage=totals)}


@router.post("/trials/{trial_id}/kill", response_model=responses.Empty)
def kill_trial(trial_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    with state.tx() as session:
        exps.kill_trial(session, principal, trial_id)
    notify.changed()
    return {}


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


class LogOrder(enum.StrEnum):
    UNSPECIFIED = "ORDER_BY_UNSPECIFIED"
    ASC = "ORDER_BY_ASC"
    DESC = "ORDER_BY_DESC"


MAX_FILTER_VALUES = 1024
FilterValues = Annotated[
    list[Annotated[str, StringConstraints(max_length=256)]], Query(max_length=MAX_FILTER_VALUES)
]


def _refuse_unsupported(**given: object) -> None:
    """Determined's filters that our logs cannot answer: refused, naming the parameter, not ignored."""
    why = {
        "agentIds": "which node wrote each line",
        "containerIds": "which container wrote each line",
        "timestampBefore": "a time for each line",
        "timestampAfter": "a time for each line",
    }
    for field, value in given.items():
        if value:
            raise ClientError(
                f"this master cannot filter trial logs by {field}: its logs are the Slurm job's output files, "
                f"which do not record {why[field]} (docs/determined-client.md)",
                code="not_supported",
                field=field,
            )


@router.get(
    "/trials/{trial_id}/logs",
    **responses_ui.ndjson(responses_ui.TrialLogLine),
)
async def trial_logs(
    trial_id: Id,
    state: State,
    principal: UserPrincipal,
    follow: bool = False,
    limit: Limit = 0,
    order_by: Annotated[LogOrder, Query(alias="orderBy")] = LogOrder.UNSPECIFIED,
    rank_ids: Annotated[list[Count32], Query(alias="rankIds", max_length=MAX_FILTER_VALUES)] = [],  # noqa: B006
    levels: Annotated[list[logs.LogLevel], Query(max_length=16)] = [],  # noqa: B006
    stdtypes: FilterValues = [],  # noqa: B006
    sources: FilterValues = [],  # noqa: B006
    agent_ids: Annotated[FilterValues, Query(alias="agentIds")] = [],  # noqa: B006
    container_ids: Annotated[FilterValues, Query(alias="containerIds")] = [],  # noqa: B006
    timestamp_before: Annotated[str | None, Query(alias="timestampBefore", max_length=64)] = None,
    timestamp_after: Annotated[str | None, Query(alias="timestampAfter", max_length=64)] = None,
    search_text: Annotated[str, Query(alias="searchText", max_length=1024)] = "",
    enable_regex: Annotated[bool, Query(alias="enableRegex")] = False,
) -> StreamingResponse:
    """Newline-delimited JSON, one ``{"result": {...}}`` per line: Determined's ``TrialLogs`` stream, whose
    entries ``services.logs`` describes.

    With ``follow=true`` the stream stays open, sending appended lines, until the trial is terminal (one of
    the caller's ``security.max_streams_per_user`` streams while it is open, ``api.streams``). Logs
    are the owner's and admins' only (scripts print what they would not put in a metric). Determined's
    parameters: ``limit`` (at most that many lines; with ``orderBy=ORDER_BY_DESC`` the last ones, newest
    first, as its client's ``--tail`` asks), ``rankIds``, ``levels``, ``stdtypes``, ``sources`` and
    ``searchText`` (a substring) filter; ``agentIds``, ``containerIds``, ``timestampBefore/After`` and
    ``enableRegex`` are refused with a message, as the files do not record what they filter on.
    """
    _refuse_unsupported(
        agentIds=agent_ids, containerIds=container_ids, timestampBefore=timestamp_before,
        timestampAfter=timestamp_after,
    )  # fmt: skip
    if enable_regex:
        raise ClientError(
            "this master searches trial logs for plain text only", code="not_supported", field="enableRegex"
        )
    tail = order_by == LogOrder.DESC
    if tail and follow:
        raise ClientError("a log stream that follows cannot be read newest first", field="orderBy")
    wanted = logs.LogFilter(
        rank_ids=frozenset(rank_ids), levels=frozenset(levels) - {logs.LogLevel.UNSPECIFIED},
        stdtypes=frozenset(stdtypes), sources=frozenset(sources), search_text=search_text,
    )  # fmt: skip

    def snapshot() -> tuple[list[logs.LogSource], bool]:
        with state.tx() as session:
            trial = get_or_404(session, TrialModel, trial_id, "trial")
            access.experiment_private(
                principal, get_or_404(session, ExperimentModel, trial.experiment_id, "experiment")
            )
            done = trial.state in TERMINAL_TRIAL_STATES and live_run_of(session, trial_id) is None
            return logs.log_sources(session, trial_id, state.config.job_storage_dir()), done

    sources_, done = await run_in_threadpool(snapshot)  # 404 before the stream starts

    def encode(lines: Iterable[dict[str, object]]) -> bytes:
        return "".join(json.dumps({"result": line}) + "\n" for line in lines).encode()

    async def stream() -> AsyncIterator[bytes]:
        cursor = logs.LogCursor(offsets={})
        nonlocal sources_, done
        sent = 0
        last: deque[dict[str, object]] = deque(maxlen=limit if limit > 0 else None)
        while True:
            final = done or not follow
            lines, more = await stream_threads.run(
                logs.read_new_lines, trial_id, sources_, cursor, final=final, reader=state.log_reader
            )
            lines = [line for line in lines if wanted.matches(line)]
            if tail:
                last.extend(lines)
            elif lines:
                if limit > 0:
                    lines = lines[: limit - sent]
                sent += len(lines)
                yield encode(lines)
                if limit > 0 and sent >= limit:
                    return
            if more:
                continue
            if final:
                if tail:
                    yield encode(reversed(last))
                return
            await asyncio.sleep(LOG_POLL_INTERVAL_S)
            sources_, done = await stream_threads.run(snapshot)

    return open_stream(state.streams, principal, stream())
