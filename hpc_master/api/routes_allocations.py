"""Allocations (a trial run's job): the preemption signal its harness long-polls, and its acknowledgement."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from hpc_master.api import responses
from hpc_master.api.bounds import AllocationId, TimeoutSeconds
from hpc_master.api.deps import AnyPrincipal, State, check_trial_access
from hpc_master.api.streams import MAX_LONG_POLL_S, long_poll
from hpc_master.errors import PermissionDeniedError
from hpc_master.services import harness, notify
from hpc_master.services.access import Principal

router = APIRouter(prefix="/api/v1", tags=["allocations", "harness"])

PREEMPTION_POLL_S = 10.0
"""How often a waiting preemption long poll re-reads the database without having been woken."""


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
