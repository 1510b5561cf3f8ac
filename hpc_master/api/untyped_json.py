"""A request body without ``Content-Type`` is read as JSON, as Determined's gateway reads it.

Determined's client (``requests`` with ``data=`` a JSON string) sends every body, its login's included,
without a ``Content-Type``, and FastAPI reads such a body as bytes, which then fails validation (400). This
middleware names the type such a request left out. It changes nothing else: the body is still counted and
bounded by ``app.BodyLimit`` while it is read, a body of any other declared type is still refused, and a
request that carries cookies (a browser: the web UI's session, ``api.session_cookie``) keeps the strict rule,
so that no page can post an untyped body with a user's cookies attached.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_JSON = (b"content-type", b"application/json")


class UntypedBodyAsJson:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in BODY_METHODS and _untyped_body(scope["headers"]):
            scope = {**scope, "headers": [*scope["headers"], _JSON]}
        await self.app(scope, receive, send)


def _untyped_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """A body (declared length above 0, or chunked) with no ``Content-Type``, from a caller without cookies."""
    has_body = False
    for name, value in headers:
        if name in (b"content-type", b"cookie"):
            return False
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            has_body = True
    return has_body
