"""Tasks' pages on an origin of their own (``task_proxy`` in master.yaml), never the master's.

A notebook, a TensorBoard or any task serves whatever HTML and JavaScript its user (or its code) writes. Served
on the master's origin, that script could call the API with the session of whoever opens the page (Open
OnDemand #5824; JupyterHub's CVE-2024-28233). So ``/proxy/<task id>/`` serves a browser on the task origin only:

* on the master's origin, a browser's ``GET /proxy/<id>/…`` with the web UI's session (its owner's: admins
  open other users' tasks with a bearer token only) is handed over: the master mints a one-time code (60 s,
  bound to the web UI session and the task) and redirects to ``<task origin>/_det/task-login``, which
  trades it for a cookie of the task origin's own (``det_task``, ``HttpOnly``, its path the task's prefix);
  a browser's other requests there are refused and its WebSockets closed. A request with a bearer token is a
  script's (a browser never adds ``Authorization`` by itself, nor can a page set it on a WebSocket): it is
  answered on either origin;
* on the task origin only ``/proxy/…`` and the hand-over answer; the API and the web UI are not there. Its
  cookie authorizes that one task's pages and nothing else; it stands on the web UI session it was handed
  over from (logging out, a password change or a deactivation ends it) and is never forwarded to the task's
  server. Its responses carry a Content-Security-Policy that keeps their scripts' connections and forms on
  that origin.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from hpc_master.auth import hash_token

HANDOFF_PATH = "/_det/task-login"
TASK_COOKIE = "det_task"
HANDOFF_TTL_S = 60.0
TASK_SESSION_TTL_S = 12 * 3600.0
CSP = "connect-src 'self'; form-action 'self'; frame-ancestors 'self'; base-uri 'self'"


def authority(origin: str) -> str:
    """``host:port`` of an origin, lower-cased, with its scheme's default port spelled out."""
    parts = urlsplit(origin)
    host = (parts.hostname or "").lower()
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


def request_authority(scope: Scope) -> str:
    """``host:port`` the client addressed (its ``Host`` header)."""
    host = ""
    for key, value in scope.get("headers") or []:
        if key == b"host":
            host = value.decode("latin-1").strip().lower()
            break
    scheme = "https" if scope.get("scheme") in ("https", "wss") else "http"
    return authority(f"{scheme}://{host}") if host else ""


def on_task_origin(scope: Scope, task_origin: str, task_port: int | None = None) -> bool:
    """Whether a request came for the task origin: addressed to it, or arrived on its own listener (whatever
    name the client used for the host)."""
    server = scope.get("server")
    if task_port and server and server[1] == task_port:
        return True
    return request_authority(scope) == authority(task_origin)


@dataclass(frozen=True)
class Grant:
    session_hash: str
    """The SHA-256 of the web UI session it was handed over from."""
    task_id: str
    expires: float


class TaskSessions:
    """Hand-over codes and the task origin's sessions, in memory: after a restart a task's page goes through
    the hand-over again (its 401 leads back to the master's origin), which the web UI's session still allows."""

    def __init__(self) -> None:
        self._codes: dict[str, Grant] = {}
        self._sessions: dict[str, Grant] = {}
        self._lock = threading.Lock()

    def hand_off(self, session_token: str, task_id: str) -> str:
        """A one-time code that the task origin trades for a session of `task_id` on the same web UI session."""
        return self._issue(self._codes, hash_token(session_token), task_id, HANDOFF_TTL_S)

    def redeem(self, code: str, task_id: str) -> str | None:
        """A new task session for a valid code of `task_id` (once); None otherwise."""
        with self._lock:
            grant = self._codes.pop(hash_token(code), None)
        if not _valid(grant, task_id):
            return None
        assert grant is not None
        return self._issue(self._sessions, grant.session_hash, task_id, TASK_SESSION_TTL_S)

    def get(self, token: str, task_id: str) -> Grant | None:
        with self._lock:
            grant = self._sessions.get(hash_token(token))
        return grant if _valid(grant, task_id) else None

    def _issue(self, table: dict[str, Grant], session_hash: str, task_id: str, ttl_s: float) -> str:
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._prune(table)
            table[hash_token(token)] = Grant(session_hash, task_id, time.monotonic() + ttl_s)
        return token

    @staticmethod
    def _prune(table: dict[str, Grant]) -> None:
        if len(table) > 10_000:
            now = time.monotonic()
            for key in [k for k, g in table.items() if g.expires < now]:
                table.pop(key, None)


def _valid(grant: Grant | None, task_id: str) -> bool:
    return grant is not None and grant.task_id == task_id and grant.expires >= time.monotonic()


def task_sessions(state: Any) -> TaskSessions:
    found = getattr(state, "task_sessions", None)
    if found is None:
        found = TaskSessions()
        state.task_sessions = found
    return found


def task_login_url(task_origin: str, code: str, next_path: str) -> str:
    return f"{task_origin}{HANDOFF_PATH}?code={quote(code)}&next={quote(next_path, safe='/')}"


_NOT_HERE = (
    b'{"code":"not_found","message":"this address serves tasks\' pages only (/proxy/<task id>/): the master\'s'
    b' API and web UI are on its own address"}'
)


class TaskOriginGate:
    """ASGI middleware: on the task origin, only ``/proxy/…`` and the hand-over answer exist."""

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state  # its task origin is known once the master has bound its port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not on_task_origin(
            scope, self.state.task_origin, self.state.task_port
        ):
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        if path.startswith("/proxy/") or path == HANDOFF_PATH:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "tasks' pages only"})
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(_NOT_HERE)).encode())]
        await send({"type": "http.response.start", "status": 404, "headers": headers})
        await send({"type": "http.response.body", "body": _NOT_HERE})
