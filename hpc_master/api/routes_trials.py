"""Trials: get, kill, metrics queries, logs."""

from __future__ import annotations

import enum
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import StringConstraints
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from hpc_master.api import convert, responses, responses_ui
from hpc_master.api.bounds import Count32, Id, Limit, Offset, TimeoutSeconds
from hpc_master.api.deps import AnyPrincipal, State, UserPrincipal, check_trial_access
from hpc_master.api.schemas import (
    CompletedOperationRequest,
    EarlyExitRequest,
    ProgressRequest,
    RunnerMetadataRequest,
)
from hpc_master.api.streams import MAX_LONG_POLL_S, long_poll, ndjson, open_stream, stream_threads
from hpc_master.db.models import CheckpointModel, ExperimentModel, MetricModel, TrialModel, TrialRunModel
from hpc_master.errors import ClientError
from hpc_master.services import access, harness, log_follow, logs, notify
from hpc_master.services import experiments as exps
from hpc_master.services.access import Principal
from hpc_master.services.checkpoints.usage import StorageTotals, trial_totals
from hpc_master.services.common import get_or_404
from hpc_master.services.lifecycle import live_run_of
from hpc_master.services.states import TERMINAL_TRIAL_STATES
from hpc_master.services.workloads import WorkloadFilter, list_workloads

router = APIRouter(prefix="/api/v1", tags=["trials"])


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

    spec = log_follow.Follow(
        stream_threads.run, snapshot, state.log_reader, follow=follow, limit=limit, tail=tail,
        keep=wanted.matches, trial_id=trial_id,
    )  # fmt: skip

    async def stream() -> AsyncIterator[bytes]:
        async for lines in log_follow.batches(spec, sources_, done):
            yield ndjson(lines)

    return open_stream(state.streams, principal, stream())


@router.get("/trials/{trial_id}/workloads", tags=["determined-compat"], response_model=responses.Workloads)
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


OP_LONG_POLL_S = 20  # under the harness's 30 s request timeout


@router.post("/trials/{trial_id}/progress", tags=["harness"], response_model=responses.Empty)
def report_progress(
    trial_id: Id, body: ProgressRequest, principal: AnyPrincipal, state: State
) -> dict[str, Any]:
    with state.tx() as session:
        check_trial_access(session, principal, trial_id, write=True)
        harness.set_progress(session, trial_id, body.progress)
    return {}


@router.post("/trials/{trial_id}/runner/metadata", tags=["harness"], response_model=responses.Empty)
def runner_metadata(
    trial_id: Id, body: RunnerMetadataRequest, principal: AnyPrincipal, state: State
) -> dict[str, Any]:
    with state.tx() as session:
        check_trial_access(session, principal, trial_id, write=True)
        harness.set_runner_state(session, trial_id, body.metadata.state)
    return {}


@router.post("/trials/{trial_id}/early_exit", tags=["harness"], response_model=responses.Empty)
def early_exit(trial_id: Id, body: EarlyExitRequest, principal: AnyPrincipal, state: State) -> dict[str, Any]:
    with state.tx() as session:
        check_trial_access(session, principal, trial_id, write=True)
        harness.report_early_exit(session, trial_id, body.early_exit.reason)
    return {}


@router.get(
    "/trials/{trial_id}/searcher/operation", tags=["harness"], response_model=responses.SearcherOperation
)
async def searcher_operation(
    trial_id: Id,
    principal: AnyPrincipal,
    state: State,
    request: Request,
    timeoutSeconds: TimeoutSeconds = OP_LONG_POLL_S,
) -> dict[str, Any]:
    """The trial's next operation (Determined ≤ 0.37).

    Right after the harness completed an operation the searcher may not have acted on it yet (the
    lifecycle loop does, within a tick): this waits up to ``timeoutSeconds`` (≤ 60) for its answer rather
    than hand the completed operation out again, then says ``pending`` (ask again). A trial being paused
    (by the searcher until a promotion, or by the user) gets no operation, so its script ends and it pauses.
    It waits as ``signals/preemption`` does, under the same cap, and stops waiting when the client has gone.
    """
    with long_poll(state.streams, principal):
        return await _wait_for_operation(trial_id, principal, state, request, timeoutSeconds)


async def _wait_for_operation(
    trial_id: int, principal: Principal, state: State, request: Request, timeout_s: int
) -> dict[str, Any]:
    def read() -> tuple[int | None, harness.OpState]:
        with state.tx() as session:
            check_trial_access(session, principal, trial_id, write=False)
            return harness.searcher_operation(session, trial_id, deliver=principal.trial_id == trial_id)

    deadline = time.monotonic() + max(0, min(timeout_s, MAX_LONG_POLL_S))
    while True:
        passes = notify.searcher_passes()  # before the read: a pass that ends during it is not missed
        length, op_state = await run_in_threadpool(read)
        if op_state is not harness.OpState.WAITING:
            break
        # Nothing changes for this trial until the loop's next pass over the searchers (or a pause, which
        # the loop's pass also follows): wait for the loop to say it made one, then read again.
        if not await notify.next_searcher_pass(passes, deadline - time.monotonic()):
            return {"op": None, "completed": False, "pending": True}
        if await request.is_disconnected():
            return {"op": None, "completed": False, "pending": True}  # nobody is listening
    return _op_answer(length, op_state)


def _op_answer(length: int | None, op_state: harness.OpState) -> dict[str, Any]:
    ready = op_state is harness.OpState.READY and length is not None
    return {
        "op": {"validateAfter": {"length": length}} if ready else None,
        "completed": op_state is harness.OpState.DONE,
    }


@router.post(
    "/trials/{trial_id}/searcher/completed_operation",
    tags=["harness"],
    response_model=responses.CompletedOperation,
)
def completed_operation(
    trial_id: Id, body: CompletedOperationRequest, principal: AnyPrincipal, state: State
) -> dict[str, Any]:
    """Records the completion. When the answer to the next ``GET .../searcher/operation`` is already known
    (the trial reached ``max_length``, or is being stopped), it comes back as ``next``, in the same shape, so
    the harness need not ask (one request less at the end of every trial); otherwise the harness asks."""
    with state.tx() as session:
        check_trial_access(session, principal, trial_id, write=True)
        harness.complete_searcher_operation(
            session, trial_id, body.op.validate_after.length, body.searcher_metric
        )
        length, op_state = harness.searcher_operation(
            session, trial_id, deliver=principal.trial_id == trial_id
        )
    notify.changed()
    return {} if op_state is harness.OpState.WAITING else {"next": _op_answer(length, op_state)}
