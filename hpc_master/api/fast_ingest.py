"""The metrics hot path: ``POST /api/v1/trials/{id}/metrics/batch`` answered below FastAPI when all is well.

Harnesses send a batch of metric rows every few steps; at 100 rows per batch, FastAPI's routing, dependency
resolution and response handling cost as much as storing the rows. This ASGI middleware takes the request
only on its happy path: a bearer token the token cache already knows, a body that validates against
``MetricsBatchRequest``, a per-trial token for this trial (or a user token), and a group commit that
succeeds. A plain training batch of the trial's own token (``ingest.plain``) skips pydantic and is stored
by the metrics writer in driver SQL (SQLite's, or one ``unnest`` INSERT per batch on PostgreSQL). Anything else (an unknown token, a bad body, a trial that is gone, a database error) is handed
to the FastAPI route with the body replayed, which answers exactly as it always does (ingest is idempotent,
so a batch the fast path tried and failed is safe to try again). The answer, ``{"accepted", "duplicates"}``
after the commit, is the route's.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

from sqlalchemy.orm import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hpc_master.api.deps import AppState, check_trial_access
from hpc_master.api.schemas import MetricItem, MetricsBatchRequest
from hpc_master.auth import hash_token
from hpc_master.ingest.plain import plain_training_rows
from hpc_master.services import harness, notify
from hpc_master.services.access import Principal
from hpc_master.services.metrics import MetricReport, ingest_metrics, pg_ingest_raw, sqlite_ingest_raw

_PATH = re.compile(r"/api/v1/trials/([0-9]{1,18})/metrics/batch")
MAX_FAST_BODY = 8 * 1024 * 1024
"""Larger bodies (over ~50,000 rows) take the ordinary route."""

_HEADERS = [(b"content-type", b"application/json")]


def _bearer(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            token = token.strip()
            return token if scheme.lower() == "bearer" and token else None
    return None


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def ingest_batch(principal: Principal, trial_id: int, reports: list[MetricReport]) -> Any:
    """The writer's unit of work for one batch (shared with the FastAPI route)."""

    def apply(session: Session) -> tuple[int, int]:
        if principal.trial_id != trial_id:
            check_trial_access(session, principal, trial_id, write=True)
        result = ingest_metrics(session, trial_id, reports)
        harness.record_validations_for_searcher(session, trial_id, reports)
        return result

    return apply


def _ingest_body(principal: Principal, trial_id: int, body: bytes) -> Any:
    """``ingest_batch`` for a body parsed only if the writer needs it (its raw or worker form failed or did
    not apply); its result also says whether the batch held validations."""

    def apply(session: Session) -> tuple[int, int, bool]:
        reports = reports_of(MetricsBatchRequest.model_validate_json(body).metrics)
        accepted, duplicates = ingest_batch(principal, trial_id, reports)(session)
        return accepted, duplicates, any(r.group == "validation" for r in reports)

    return apply


def reports_of(items: list[MetricItem], group: str | None = None) -> list[MetricReport]:
    """Validated items as the services take them (``group`` overrides theirs: the single-report route)."""
    return [
        MetricReport(
            trial_run_id=i.trial_run_id,
            steps_completed=i.steps_completed,
            group=group or i.group,
            metrics=i.metrics,
            report_time=i.report_time,
        )
        for i in items
    ]


class MetricsFastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        match = _PATH.fullmatch(scope["path"])
        length = _declared_length(scope)
        if match is None or length is None or length > MAX_FAST_BODY:
            await self.app(scope, receive, send)
            return
        state: AppState = scope["app"].state.det
        token = _bearer(scope)
        principal = state.tokens.get(hash_token(token)) if token else None
        body, more = await _read_body(receive, length)
        if principal is None or more:
            await self.app(scope, _replay(body, more, receive), send)
            return
        trial_id = int(match.group(1))
        if principal.trial_id is not None and principal.trial_id != trial_id:
            await self.app(scope, _replay(body, more, receive), send)  # the route answers 403
            return
        own = principal.trial_id == trial_id
        try:
            if own and state.writer.takes_body and b'"validation"' not in body:
                # The trial's own harness on a SQLite file: the ingest worker parses and stores the body.
                # (Validations go through pydantic here, as before: the worker would hand them back.)
                rows = body.count(b'"stepsCompleted"')  # an estimate, for the writer's group size
                result = await state.writer.run(
                    _ingest_body(principal, trial_id, body), rows, body=(trial_id, body)
                )
            elif (
                own and state.writer.takes_raw and (rows_ := plain_training_rows(body, trial_id)) is not None
            ):
                # Plain training metrics of the trial's own harness: encoded here, stored in driver SQL.
                store = pg_ingest_raw if state.writer.raw_dialect == "postgresql" else sqlite_ingest_raw
                raw = partial(store, trial_id=trial_id, rows=rows_)
                result = await state.writer.run(_ingest_body(principal, trial_id, body), len(rows_), raw)
            else:
                reports = reports_of(MetricsBatchRequest.model_validate_json(body).metrics)
                result = await state.writer.run(ingest_batch(principal, trial_id, reports), len(reports))
                result = (*result, any(r.group == "validation" for r in reports))
        except Exception:  # a bad body (ValidationError), a trial that is gone, a database error
            await self.app(scope, _replay(body, more, receive), send)  # the route gives the error
            return
        accepted, duplicates, *validations = result
        state.fast_ingests += 1
        if any(validations):
            notify.changed()  # the searcher reacts to validations
        payload = b'{"accepted":%d,"duplicates":%d}' % (accepted, duplicates)
        headers = [*_HEADERS, (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


async def _read_body(receive: Receive, limit: int) -> tuple[bytes, bool]:
    """The body, up to ``limit`` bytes; ``more`` is True if the client sent more than it declared."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), True  # disconnected: let the route see it
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), size > limit
        if size > limit:
            return b"".join(chunks), True


def _replay(body: bytes, more: bool, receive: Receive) -> Receive:
    """A ``receive`` that gives the route the body already read, then whatever is still to come."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return replay
