"""The FastAPI application: routers, the one exception handler, startup."""

from __future__ import annotations

import hashlib
import logging
import math
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError, ResponseValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.orm.exc import StaleDataError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hpc_master import owner_key
from hpc_master.api import (
    http_errors,
    observability,
    proxy,
    responses,
    responses_ui,
    routes_allocations,
    routes_audit,
    routes_checkpoints,
    routes_experiments,
    routes_master,
    routes_metrics,
    routes_models,
    routes_tasks,
    routes_trials,
    routes_ui,
    routes_usage,
    routes_users,
    routes_workspaces,
)
from hpc_master.api.browser_origin import BrowsersToHttps
from hpc_master.api.deps import AppState, get_principal
from hpc_master.api.fast_ingest import MetricsFastPath
from hpc_master.api.task_origin import TaskOriginGate
from hpc_master.api.untyped_json import UntypedBodyAsJson
from hpc_master.db.engine import make_engine, make_sessionmaker, transaction
from hpc_master.db.migrate import upgrade_to_head
from hpc_master.errors import ClientError, PayloadTooLargeError, TooManyRequestsError
from hpc_master.masterconf import MasterConfig
from hpc_master.services.lifecycle import watch_stop_requests
from hpc_master.services.users import TokenCache, end_login_sessions, ensure_default_users
from hpc_master.version import master_version

log = logging.getLogger("hpc_master")

MAX_BODY_BYTES = 140 * 1024 * 1024
"""The 95 MB context limit, base64-encoded, plus room for the config."""
ANONYMOUS_BODY_BYTES = 64 * 1024
"""The largest body read before the bearer token is checked (a login's is a few hundred bytes)."""


def _error(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    return JSONResponse({"code": code, "message": message, "field": field}, status_code=status)


def _validation_field(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    return ".".join(parts) or None


class BodyLimit:
    """Bounds every request body while it is read, and reads no large body before authentication.

    A body declared over ``MAX_BODY_BYTES`` is refused (413) before anything reads it. A body that is chunked
    (no declared length) or declared over ``ANONYMOUS_BODY_BYTES`` needs a valid bearer token first, checked
    as ``deps.get_principal`` does (401 otherwise, with nothing read: unauthenticated callers send only small
    bodies). Then ``receive`` counts the bytes as they arrive and fails as soon as they pass the limit
    (``MAX_BODY_BYTES``, or ``ANONYMOUS_BODY_BYTES`` for a small declared body), so nothing buffers the rest.
    Whoever was reading (FastAPI's body parsing, a route, the metrics fast path) and whatever it made of the
    failure, the answer is this middleware's 413; refusals close the connection, leaving the body unread.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length, chunked = _declared_body(scope)
        limit = MAX_BODY_BYTES
        if length is not None and length > limit:
            await _refuse(scope, receive, send, _too_large(limit))
            return
        if chunked or (length is not None and length > ANONYMOUS_BODY_BYTES):
            refusal = await _authenticate(scope)
            if refusal is not None:
                await _refuse(scope, receive, send, refusal)
                return
        else:
            limit = ANONYMOUS_BODY_BYTES
        await self._run_counted(scope, receive, send, limit)

    async def _run_counted(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        """Run the app with the body counted as it arrives: past `limit`, the app's answer is replaced by a
        413 (unless it had started)."""
        counted = _CountedReceive(receive, limit)
        started = False

        async def send_unless_cut(message: Message) -> None:
            nonlocal started
            if counted.exceeded:
                return  # the app's answer to a body cut short: the 413 below replaces it
            started = True
            await send(message)

        try:
            await self.app(scope, counted, send_unless_cut)
        except Exception:
            if not counted.exceeded:
                raise
        if counted.exceeded and not started:
            await _refuse(scope, receive, send, _too_large(limit))


def _declared_body(scope: Scope) -> tuple[int | None, bool]:
    """The request's declared body length (None when not a number or not declared), and whether it is
    chunked."""
    length: int | None = None
    chunked = False
    for name, value in scope["headers"]:
        if name == b"content-length":
            length = int(value) if value.isdigit() else None
        elif name == b"transfer-encoding":
            chunked = True  # the length is known only once the body is read
    return length, chunked


class _CountedReceive:
    """``receive`` that raises ``PayloadTooLargeError`` once the body passes ``limit`` bytes."""

    __slots__ = ("exceeded", "left", "limit", "receive")

    def __init__(self, receive: Receive, limit: int) -> None:
        self.receive = receive
        self.limit = limit
        self.left = limit
        self.exceeded = False

    async def __call__(self) -> Message:
        if self.exceeded:
            raise _too_large(self.limit)
        message = await self.receive()
        body = message.get("body")
        if body:
            self.left -= len(body)
            if self.left < 0:
                self.exceeded = True
                raise _too_large(self.limit)
        return message


def _too_large(limit: int) -> PayloadTooLargeError:
    size = f"{limit // 2**20} MB" if limit >= 2**20 else f"{limit // 1024} KiB"
    return PayloadTooLargeError(f"request body is larger than {size}")


async def _authenticate(scope: Scope) -> ClientError | None:
    """Why the request's bearer token does not authenticate it (None: it does)."""
    try:
        await get_principal(Request(scope))
    except ClientError as exc:
        return exc
    return None


async def _refuse(scope: Scope, receive: Receive, send: Send, error: ClientError) -> None:
    """Answer with the error instead of reading (the rest of) the body, and close the connection."""
    response = _error(error.http_status, error.code, error.message, error.field)
    response.headers["connection"] = "close"
    await response(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ClientError)
    async def client_error(_request: Request, exc: ClientError) -> JSONResponse:
        response = _error(exc.http_status, exc.code, exc.message, exc.field)
        if isinstance(exc, TooManyRequestsError):  # 429: when to try again, in whole seconds
            response.headers["retry-after"] = str(max(1, math.ceil(exc.retry_after_s)))
        return response

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":  # its loc is a position in the text, not a field
            ctx = first.get("ctx")
            reason = (ctx.get("error") if isinstance(ctx, dict) else None) or first.get("msg")
            return _error(400, "invalid_argument", f"the request body is not valid JSON: {reason}")
        return _error(
            400, "invalid_argument", str(first.get("msg")), _validation_field(tuple(first.get("loc", ())))
        )

    @app.exception_handler(ValidationError)
    async def body_validation_error(_request: Request, exc: ValidationError) -> JSONResponse:
        # Bodies a route validates itself (model_validate_json on the hot path).
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        return _error(
            400, "invalid_argument", str(first.get("msg")), _validation_field(tuple(first.get("loc", ())))
        )

    @app.exception_handler(ResponseValidationError)
    async def answer_off_shape(request: Request, exc: ResponseValidationError) -> JSONResponse:
        # The answer the route built is not the shape it documents (``responses``): a bug of ours. Logged
        # with where it differs, never with the values (they may be a user's secrets).
        where = sorted({(".".join(map(str, e.get("loc", ()))), str(e.get("type"))) for e in exc.errors()})
        log.error(
            "%s %s: the answer is not its documented shape: %s", request.method, request.url.path, where
        )
        return _error(500, "internal", "the master built an answer that does not match its documented shape")

    @app.exception_handler(StaleDataError)
    async def stale(_request: Request, _exc: StaleDataError) -> JSONResponse:
        return _error(409, "stale", "the object changed concurrently; retry")

    @app.exception_handler(IntegrityError)
    async def integrity(_request: Request, _exc: IntegrityError) -> JSONResponse:
        return _error(409, "conflict", "the request conflicts with stored data")

    # A safety net: the API models bound every number (``bounds``), so a value the database cannot hold
    # (SQLite's OverflowError beyond 64 bits, PostgreSQL's DataError: out of range, too long, a NUL byte)
    # should not reach it; if one does, it is still the request's fault.
    @app.exception_handler(OverflowError)
    async def overflow(_request: Request, _exc: OverflowError) -> JSONResponse:
        return _error(400, "invalid_argument", "a number in the request is out of range")

    @app.exception_handler(DataError)
    async def data_error(_request: Request, _exc: DataError) -> JSONResponse:
        return _error(400, "invalid_argument", "a value in the request does not fit the database")


def build_state(config: MasterConfig, engine: Engine | None = None) -> AppState:
    engine = engine or make_engine(config.db_url())
    upgrade_to_head(engine)
    sessions = make_sessionmaker(engine)
    with transaction(sessions) as session:
        ensure_default_users(
            session,
            require_passwords=config.passwords_required(),
            admin_password=config.security.admin_password,
        )
        if not config.passwords_required():  # a personal master: its tokens die with each instance
            end_login_sessions(session)
    url = engine.url.render_as_string(hide_password=True)
    cluster_id = str(uuid.UUID(hashlib.sha256(url.encode()).hexdigest()[:32]))
    # A master without passwords (loopback) admits blank-password logins only with its owner's key.
    key_digest = None if config.passwords_required() else owner_key.create(config.listen.port)
    return AppState(
        config=config,
        engine=engine,
        sessions=sessions,
        tokens=TokenCache(),
        master_id=str(uuid.uuid4()),
        cluster_id=cluster_id,
        owner_key_digest=key_digest,
        task_origin=config.task_origin(),
    )


def create_app(config: MasterConfig | None = None, *, engine: Engine | None = None) -> FastAPI:
    """Build the app: migrate the database, create first-start users, mount the routers."""
    config = config or MasterConfig()
    app = FastAPI(
        title="hpc-det master",
        version=master_version(),
        docs_url="/docs",
        openapi_url="/openapi.json",
    )
    app.state.det = build_state(config, engine)
    watch_stop_requests()  # the preemption long polls wait for these instead of polling the database
    app.router.on_startup.append(app.state.det.start)
    app.router.on_shutdown.append(app.state.det.close)

    async def close_proxy() -> None:
        await proxy.close(app.state.det)

    app.router.on_shutdown.append(close_proxy)
    install_error_handlers(app)
    # One router per resource; Determined's compatibility is an OpenAPI tag (``determined-compat``), the
    # harness's routes are tagged ``harness``. The metrics routes first: the hot metrics route is matched
    # after fewer patterns, and ``/trials/time-series`` before ``/trials/{trial_id}``.
    for module in (
        routes_metrics,
        routes_allocations,
        routes_ui,
        routes_users,
        routes_experiments,
        routes_checkpoints,
        routes_models,
        routes_trials,
        routes_workspaces,  # Determined's one default workspace and project
        routes_tasks,  # commands (and every task's list and logs)
    ):
        app.include_router(module.router, responses=responses.ERRORS)
    app.include_router(routes_experiments.legacy, responses=responses.ERRORS)  # before the UI's /experiments/
    app.include_router(routes_master.router, responses=responses.ERRORS)  # /api/v1/master...
    app.include_router(routes_master.bare, responses=responses.ERRORS)  # GET /info
    app.include_router(routes_audit.router, responses=responses.ERRORS)  # admins: the audit log
    app.include_router(observability.router, responses=responses.ERRORS)  # /health, /metrics: no login
    app.include_router(routes_usage.router, responses=responses.ERRORS)  # det resources (JSON)
    app.include_router(routes_usage.bare, responses=responses.ERRORS)  # det resources (CSV)
    app.include_router(proxy.router)  # /proxy/{task_id}/: notebooks and TensorBoards, owner-only
    routes_ui.install(app)  # the web UI's pages at /, its assets at /webui/
    http_errors.install(app)  # after the UI's: a missing /api/ route's 404 says so, for Determined's client
    openapi = app.openapi
    app.openapi = lambda: responses_ui.errors_as_json(openapi())  # type: ignore[method-assign]
    app.add_middleware(routes_audit.AuditRequest)  # names the request for the audit log (services.audit)
    app.add_middleware(MetricsFastPath)
    app.add_middleware(TaskOriginGate, state=app.state.det)  # on the task origin, tasks' pages only
    app.add_middleware(BrowsersToHttps, state=app.state.det)  # pages on the plain port go to HTTPS
    app.add_middleware(UntypedBodyAsJson)  # Determined's client sends JSON without a Content-Type
    app.add_middleware(BodyLimit)  # outermost: refuses oversize bodies before anything reads them
    return app
