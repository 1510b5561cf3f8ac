"""FastAPI's and Starlette's own HTTP errors under ``/api/`` in the master's error shape (``code``, ``message``,
``field``: ``responses.ApiError``) instead of ``{"detail": ...}``; a route this master lacks says so, for
Determined's client (``docs/determined-client.md``).
"""

from __future__ import annotations

import inspect

from fastapi import FastAPI, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

_CODES = {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied", 404: "not_found",
          405: "not_implemented", 413: "payload_too_large", 429: "too_many_requests"}  # fmt: skip
"""The code of an HTTP error that FastAPI or Starlette raised themselves (a body that is not JSON: 400)."""


def install(app: FastAPI) -> None:
    """Answer every HTTP error under ``/api/`` that FastAPI or Starlette raised themselves in our error shape
    (``code``, ``message``; Determined's client prints the message) instead of ``{"detail": ...}``: a route
    this master lacks says so (its 404, which that client would show as an empty error), and a body that
    is not JSON is a 400 ``invalid_argument``. Other addresses keep the handler installed before this one."""
    previous = app.exception_handlers.get(StarletteHTTPException, http_exception_handler)

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        path = request.url.path
        if not path.startswith("/api/") or exc.status_code < 400:
            answer = previous(request, exc)
            return await answer if inspect.isawaitable(answer) else answer
        code, message = _CODES.get(exc.status_code, "error"), str(exc.detail)
        if exc.status_code in (404, 405) and exc.detail in ("Not Found", "Method Not Allowed"):
            code = "not_implemented"
            message = (
                f"{request.method} {path} is not implemented by this master (hpc-det, a Slurm-native master "
                "modelled on Determined); docs/determined-client.md lists what Determined's CLI and SDK can "
                "do with it"
            )
        return JSONResponse(
            {"code": code, "message": message, "field": None},
            status_code=exc.status_code,
            headers=exc.headers,
        )

    app.add_exception_handler(StarletteHTTPException, api_error)
