"""The routes of docs/harness-api.md, called by the in-job harness with a per-trial token."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from hpc_master.api import convert, responses
from hpc_master.api.bounds import AllocationId, Id, TimeoutSeconds
from hpc_master.api.deps import AnyPrincipal, State, check_checkpoint_access, check_trial_access
from hpc_master.api.fast_ingest import ingest_batch, reports_of
from hpc_master.api.schemas import (
    CompletedOperationRequest,
    EarlyExitRequest,
    MetricsBatchRequest,
    ProgressRequest,
    ReportCheckpointRequest,
    ReportMetricsRequest,
    RunnerMetadataRequest,
)
from hpc_master.api.streams import long_poll
from hpc_master.db.models import TrialModel
from hpc_master.errors import PermissionDeniedError
from hpc_master.services import harness, notify
from hpc_master.services.access import Principal
from hpc_master.services.checkpoints import records as ckpts
from hpc_master.services.checkpoints import views as checkpoint_views
from hpc_master.services.common import get_or_404
from hpc_master.services.metrics import ingest_metrics

router = APIRouter(prefix="/api/v1", tags=["harness"])

PREEMPTION_POLL_S = 10.0
"""How often a waiting preemption long poll re-reads the database without having been woken."""
MAX_LONG_POLL_S = 60
OP_LONG_POLL_S = 20  # under the harness's 30 s request timeout


_BATCH_SCHEMA = MetricsBatchRequest.model_json_schema(
    by_alias=True, ref_template="#/components/schemas/{model}"
)
_BATCH_SCHEMA.pop("$defs", None)


@router.post(
    "/trials/{trial_id}/metrics/batch",
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


@router.post("/trials/{trial_id}/metrics", response_model=responses.Empty)
def report_metrics(
    trial_id: Id, body: ReportMetricsRequest, principal: AnyPrincipal, state: State
) -> dict[str, Any]:
    with state.tx() as session:
        check_trial_access(session, principal, trial_id, write=True)
        reports = reports_of([body.metrics], body.group)
        ingest_metrics(session, trial_id, reports)
        harness.record_validations_for_searcher(session, trial_id, reports)
    return {}


@router.post("/checkpoints", response_model=responses.Empty)
def report_checkpoint(body: ReportCheckpointRequest, principal: AnyPrincipal, state: State) -> dict[str, Any]:
    c = body.checkpoint
    steps = c.metadata.get("steps_completed", 0)
    with state.tx() as session:
        check_trial_access(session, principal, c.trial_id, write=True)
        ckpts.report_checkpoint(
            session,
            ckpts.CheckpointReport(
                uuid=c.uuid,
                trial_id=c.trial_id,
                trial_run_id=c.trial_run_id,
                steps_completed=steps if isinstance(steps, int) else 0,
                resources=c.resources,
                metadata=c.metadata,
                state=c.state,
                report_time=c.report_time,
            ),
        )
    return {}


@router.get("/checkpoints/{uuid}", response_model=responses.CheckpointAnswer)
def get_checkpoint(uuid: str, principal: AnyPrincipal, state: State) -> dict[str, Any]:
    """Determined's ``GetCheckpoint`` (its client's ``det checkpoint describe|download``,
    ``client.get_checkpoint``), and the harness's read of a checkpoint's metadata."""
    with state.tx() as session:
        view = checkpoint_views.get_view(session, uuid)
        check_checkpoint_access(principal, view.checkpoint, view.experiment.owner_id, write=False)
        return {"checkpoint": convert.checkpoint_to_api(view, principal, state.config.checkpoint_dir())}


@router.post("/trials/{trial_id}/progress", response_model=responses.Empty)
def report_progress(
    trial_id: Id, body: ProgressRequest, principal: AnyPrincipal, state: State
) -> dict[str, Any]:
    with state.tx() as session:
        check_trial_access(session, principal, trial_id, write=True)
        harness.set_progress(session, trial_id, body.progress)
    return {}


@router.post("/trials/{trial_id}/runner/metadata", response_model=responses.Empty)
def runner_metadata(
    trial_id: Id, body: RunnerMetadataRequest, principal: AnyPrincipal, state: State
) -> dict[str, Any]:
    with state.tx() as session:
        check_trial_access(session, principal, trial_id, write=True)
        harness.set_runner_state(session, trial_id, body.metadata.state)
    return {}


@router.post("/trials/{trial_id}/early_exit", response_model=responses.Empty)
def early_exit(trial_id: Id, body: EarlyExitRequest, principal: AnyPrincipal, state: State) -> dict[str, Any]:
    with state.tx() as session:
        check_trial_access(session, principal, trial_id, write=True)
        harness.report_early_exit(session, trial_id, body.early_exit.reason)
    return {}


@router.get("/allocations/{allocation_id}/signals/preemption", response_model=responses.Preemption)
async def preemption_signal(
    allocation_id: AllocationId,
    principal: AnyPrincipal,
    state: State,
    request: Request,
    timeoutSeconds: TimeoutSeconds = 0,
) -> dict[str, Any]:
    """Long poll: answers as soon as preemption is requested, or after ``timeoutSeconds`` (≤ 60).

    A job that ended leaves its poll open until the connection closes; the poll stops re-reading then (every
    trial's last poll would otherwise re-read the database until its timeout). While it waits it holds one of
    its trial's ``security.max_long_polls_per_trial`` (a user's token: one of the user's streams)."""
    trial_id, run_number = harness.parse_allocation_id(allocation_id)
    with long_poll(state.streams, principal):
        return await _wait_for_preemption(trial_id, run_number, principal, state, request, timeoutSeconds)


async def _wait_for_preemption(
    trial_id: int, run_number: int, principal: Principal, state: State, request: Request, timeout_s: int
) -> dict[str, Any]:
    def check() -> bool:
        with state.tx() as session:
            check_trial_access(session, principal, trial_id, write=False)
            # Only the trial's own harness is told to stop; anyone else's look changes nothing.
            own = principal.trial_id == trial_id
            return harness.preemption_state(session, trial_id, run_number, deliver=own)

    deadline = time.monotonic() + max(0, min(timeout_s, MAX_LONG_POLL_S))
    while True:
        requests = notify.stop_requests()  # before the read: a request committed during it is not missed
        preempt = await run_in_threadpool(check)
        if preempt or time.monotonic() >= deadline:
            return {"preempt": preempt}
        # Woken when a stop request commits (lifecycle.watch_stop_requests); the slow re-read is a backstop.
        wait_s = min(PREEMPTION_POLL_S, max(0.0, deadline - time.monotonic()))
        await notify.next_stop_request((trial_id, run_number), requests, wait_s)
        if await request.is_disconnected():
            return {"preempt": False}  # nobody is listening


@router.post("/allocations/{allocation_id}/signals/ack_preemption", response_model=responses.Empty)
def ack_preemption(allocation_id: AllocationId, principal: AnyPrincipal, state: State) -> dict[str, Any]:
    trial_id, run_number = harness.parse_allocation_id(allocation_id)
    if principal.trial_id != trial_id:
        raise PermissionDeniedError(
            f"only the harness of trial {trial_id} (its own token) acknowledges its stop"
        )
    with state.tx() as session:
        check_trial_access(session, principal, trial_id, write=True)
        harness.ack_preemption(session, trial_id, run_number)
    return {}


@router.get("/trials/{trial_id}/searcher/operation", response_model=responses.SearcherOperation)
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


@router.post("/trials/{trial_id}/searcher/completed_operation", response_model=responses.CompletedOperation)
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


@router.get(
    "/experiments/{experiment_id}/searcher/best_searcher_validation_metric",
    response_model=responses.BestMetric,
)
def best_searcher_validation_metric(
    experiment_id: Id, principal: AnyPrincipal, state: State
) -> dict[str, Any]:
    with state.tx() as session:
        if principal.trial_id is not None:
            trial = get_or_404(session, TrialModel, principal.trial_id, "trial")
            if trial.experiment_id != experiment_id:
                raise PermissionDeniedError("this token belongs to another experiment")
        return {"metric": harness.best_searcher_validation(session, experiment_id)}
