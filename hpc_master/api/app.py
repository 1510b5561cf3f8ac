"""The FastAPI application: routers, the one exception handler, startup."""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm.exc import StaleDataError
from starlette.types import ASGIApp, Receive, Scope, Send

from hpc_master.api import routes_auth, routes_experiments, routes_harness, routes_trials
from hpc_master.api.deps import AppState
from hpc_master.api.fast_ingest import MetricsFastPath
from hpc_master.db.engine import make_engine, make_sessionmaker, transaction
from hpc_master.db.migrate import upgrade_to_head
from hpc_master.errors import ClientError, PayloadTooLargeError
from hpc_master.masterconf import MasterConfig
from hpc_master.services.lifecycle import watch_stop_requests
from hpc_master.services.users import TokenCache, ensure_default_users

log = logging.getLogger("hpc_master")

MAX_BODY_BYTES = 140 * 1024 * 1024
"""The 95 MB context limit, base64-encoded, plus room for the config."""


def master_version() -> str:
    try:
        return importlib.metadata.version("hpc-det")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"


def _error(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    return JSONResponse({"code": code, "message": message, "field": field}, status_code=status)


def _validation_field(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    return ".".join(parts) or None


class BodyLimit:
    """Refuse bodies over MAX_BODY_BYTES before reading them (declared length) or while reading."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope.get("headers", []):
                if name == b"content-length" and value.isdigit() and int(value) > MAX_BODY_BYTES:
                    err = PayloadTooLargeError(f"request body is larger than {MAX_BODY_BYTES // 2**20} MB")
                    response = _error(err.http_status, err.code, err.message)
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ClientError)
    async def client_error(_request: Request, exc: ClientError) -> JSONResponse:
        return _error(exc.http_status, exc.code, exc.message, exc.field)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
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

    @app.exception_handler(StaleDataError)
    async def stale(_request: Request, _exc: StaleDataError) -> JSONResponse:
        return _error(409, "stale", "the object changed concurrently; retry")

    @app.exception_handler(IntegrityError)
    async def integrity(_request: Request, _exc: IntegrityError) -> JSONResponse:
        return _error(409, "conflict", "the request conflicts with stored data")


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
    url = engine.url.render_as_string(hide_password=True)
    cluster_id = str(uuid.UUID(hashlib.sha256(url.encode()).hexdigest()[:32]))
    return AppState(
        config=config,
        engine=engine,
        sessions=sessions,
        tokens=TokenCache(),
        master_id=str(uuid.uuid4()),
        cluster_id=cluster_id,
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
    install_error_handlers(app)
    # The harness routes first: the hot metrics route is matched after fewer patterns.
    for module in (routes_harness, routes_auth, routes_experiments, routes_trials):
        app.include_router(module.router)
    app.add_middleware(MetricsFastPath)
    app.add_middleware(BodyLimit)  # outermost: refuses oversize bodies before anything reads them
    return app
