"""Browsers over HTTPS on a master that serves them apart (``MasterConfig.browsers_apart``: beyond loopback,
without a certificate of the admin's). The master then listens twice: its plain port serves ``det``, jobs and
Determined's client as before; the web UI's port serves the same app over HTTPS, with the certificate the master
generated (``hpc_master.browser_tls``), and tasks' pages beside it. On the plain port:

* a browser asking for a page (``GET``/``HEAD`` accepting ``text/html``, outside ``/api/``; a task's page
  under ``/proxy/`` without ``Authorization``, the CLI's) is sent to the same address on the web UI's port
  (307), under the host name it used;
* a login for a session cookie is refused with ``https_required``, saying where to log in, and a session
  cookie that arrives anyway is never used: over plain HTTP it would cross the network readable by anyone on
  it, and cookies ignore ports (every server on the host would get it).

A request counts as plain by its scheme, so a TLS-terminating proxy in front (``listen.forwarded_allow_ips``,
``X-Forwarded-Proto: https``) counts as HTTPS.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from hpc_master.errors import PermissionDeniedError


def https_origin(host_header: str, port: int) -> str:
    """The web UI's HTTPS origin under the host name the client used (``Host``, its port dropped)."""
    host = host_header.rsplit(":", 1)[0] if not host_header.endswith("]") else host_header
    return f"https://{host or 'localhost'}:{port}"


def _browser_port(scope: Scope) -> int | None:
    """The web UI's HTTPS port when this request came over plain HTTP to a master serving browsers apart."""
    if scope.get("scheme") not in ("http", "ws"):
        return None
    state = scope["app"].state.det if "app" in scope else None
    return getattr(state, "browser_port", None)


def refuse_plain_session(request: Request) -> None:
    """Refuse a session cookie (a login for one, or a request carrying one) over plain HTTP where the master
    serves browsers over HTTPS."""
    port = _browser_port(request.scope)
    if port is None:
        return
    where = https_origin(request.headers.get("host", ""), port)
    raise PermissionDeniedError(
        f"this master hands the web UI's session over HTTPS only: open {where}/ (over plain HTTP the session "
        "would cross the network readable, and reach every port of this host)",
        code="https_required",
    )


class BrowsersToHttps:
    """ASGI middleware: on the plain port of a master serving browsers apart, pages redirect to HTTPS."""

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        port = self.state.browser_port
        if port is None or scope["type"] != "http" or scope.get("scheme") != "http" or not _a_page(scope):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        target = https_origin(headers.get(b"host", b"").decode("latin-1"), port) + scope.get("path", "/")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        await send(
            {
                "type": "http.response.start",
                "status": 307,
                "headers": [(b"location", target.encode("latin-1")), (b"content-length", b"0")],
            }
        )
        await send({"type": "http.response.body", "body": b""})


def _a_page(scope: Scope) -> bool:
    """A browser's page: a task's too (``/proxy/``, without ``Authorization``: from HTTPS it is handed over to
    the task origin), never the API's."""
    if scope.get("method") not in ("GET", "HEAD"):
        return False
    path: str = scope.get("path", "")
    headers = dict(scope.get("headers") or [])
    if path.startswith("/api/") or (path.startswith("/proxy/") and b"authorization" in headers):
        return False
    return b"text/html" in headers.get(b"accept", b"")
