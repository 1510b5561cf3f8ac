"""Trials: get, kill, metrics queries, logs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from hpc_master.api import convert
from hpc_master.api.bounds import Id, Limit, Offset
from hpc_master.api.deps import State, UserPrincipal
from hpc_master.db.models import ExperimentModel, TrialModel, TrialRunModel
from hpc_master.services import experiments as exps
from hpc_master.services import logs, notify
from hpc_master.services import metrics as metric_svc
from hpc_master.services.checkpoint_usage import StorageTotals, trial_totals
from hpc_master.services.common import get_or_404
from hpc_master.services.lifecycle import live_run_of
from hpc_master.services.states import TERMINAL_TRIAL_STATES

router = APIRouter(prefix="/api/v1", tags=["trials"])

LOG_POLL_INTERVAL_S = 0.5


@router.get("/trials/{trial_id}")
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
        return {"trial": convert.trial_to_api(trial, runs, storage=totals)}


@router.post("/trials/{trial_id}/kill")
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


@router.get("/trials/{trial_id}/metrics")
def trial_metrics(
    trial_id: Id,
    state: State,
    principal: UserPrincipal,
    group: str | None = None,
    offset: Offset = 0,
    limit: Limit = 0,
) -> dict[str, Any]:
    return _metrics(state, trial_id, group, offset, limit)


@router.get("/trials/{trial_id}/metrics/training_metrics")
def training_metrics(trial_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    return _metrics(state, trial_id, "training", 0, 0)


@router.get("/trials/{trial_id}/metrics/validation_metrics")
def validation_metrics(trial_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    return _metrics(state, trial_id, "validation", 0, 0)


@router.get("/trials/{trial_id}/logs")
async def trial_logs(
    trial_id: Id, state: State, principal: UserPrincipal, follow: bool = False
) -> StreamingResponse:
    """Newline-delimited JSON, one ``{"result": {...}}`` per line (Determined's streaming shape).

    With ``follow=true`` the stream stays open, sending appended lines, until the trial is terminal. Logs
    are the owner's and admins' only (scripts print what they would not put in a metric).
    """

    def snapshot() -> tuple[list[logs.LogSource], bool]:
        with state.tx() as session:
            trial = get_or_404(session, TrialModel, trial_id, "trial")
            exps.can_modify(
                principal, get_or_404(session, ExperimentModel, trial.experiment_id, "experiment")
            )
            done = trial.state in TERMINAL_TRIAL_STATES and live_run_of(session, trial_id) is None
            return logs.log_sources(session, trial_id), done

    sources, done = await run_in_threadpool(snapshot)  # 404 before the stream starts

    async def stream() -> AsyncIterator[bytes]:
        cursor = logs.LogCursor(offsets={})
        nonlocal sources, done
        while True:
            final = done or not follow
            lines = await run_in_threadpool(logs.read_new_lines, trial_id, sources, cursor, final=final)
            if lines:
                yield "".join(json.dumps({"result": line}) + "\n" for line in lines).encode()
            if final:
                return
            await asyncio.sleep(LOG_POLL_INTERVAL_S)
            sources, done = await run_in_threadpool(snapshot)

    return StreamingResponse(stream(), media_type="application/x-ndjson")
