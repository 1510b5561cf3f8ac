"""``/proxy/{task_id}/…``: HTTP and WebSocket traffic to a notebook's or TensorBoard's server on its node, served
on the task origin only (``task_origin.py``: the master's own origin hands a browser over to it).

Compute nodes are not reachable from a laptop; the master is. The proxy lets through only the task's owner
(the task origin's cookie, handed over from the web UI's session, or a bearer token) and admins with a
bearer token: an admin's browser never opens another user's page with the admin's session. For a cookie,
requests that change something must come from the task's own pages (``Sec-Fetch-Site`` or ``Origin``).
The master's and the task origin's cookies and ``Authorization`` never reach the server; the proxy adds the
task's server token (``service_token``, which the server requires: other users on the cluster network
cannot use the port directly).

Each request costs one cached lookup (task → address and token, kept ``TARGET_TTL_S``) and the forward
itself; the bodies stream both ways. A WebSocket is pumped both ways until either side closes, and is closed
when the job ends (the server's end of the connection goes away).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect

from hpc_master.api import session_cookie, task_origin
from hpc_master.api.deps import AppState, app_state
from hpc_master.api.routes_tasks import TASK_ID_PATTERN
from hpc_master.auth import hash_token
from hpc_master.db.models import TaskModel, utcnow
from hpc_master.errors import PermissionDeniedError, UnauthenticatedError
from hpc_master.services import access, users
from hpc_master.services.access import Principal
from hpc_master.tasks.service import TaskState

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

log = logging.getLogger(__name__)
router = APIRouter(include_in_schema=False)

TARGET_TTL_S = 2.0
WS_RECHECK_S = 5.0
"""An open WebSocket's session is checked again this often: a logout, a deactivation or the task's end closes
it within this (Jupyter's terminals and kernels otherwise outlive them)."""
ACTIVITY_WRITE_S = 10.0  # idle timeouts are this precise; a busy page writes once per this
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
     "transfer-encoding", "upgrade", "host", "authorization", "cookie", "content-length"}
)  # fmt: skip
OUR_COOKIES = frozenset(
    {*session_cookie.SESSION_COOKIES, session_cookie.CSRF_COOKIE, task_origin.TASK_COOKIE}
)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
METHODS = ["GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"]


class ProxyError(Exception):
    def __init__(self, status: int, code: str, message: str, *, retry: bool = False) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.retry = status, code, message, retry


@dataclass(frozen=True)
class Target:
    task_id: str
    address: str
    token: str
    description: str


class Targets:
    """Task id → where its server is and its token, for a few seconds (the proxy's one lookup per request),
    and when each task's activity was last written."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], tuple[float, Target]] = {}
        self._written: dict[str, float] = {}
        self.client: httpx.AsyncClient | None = None

    def http(self) -> httpx.AsyncClient:
        if self.client is None:
            self.client = httpx.AsyncClient(
                timeout=httpx.Timeout(None, connect=10.0), follow_redirects=False, trust_env=False,
                limits=httpx.Limits(max_connections=512, max_keepalive_connections=64),
            )  # fmt: skip
        return self.client

    def get(self, key: tuple[str, str]) -> Target | None:
        hit = self._cache.get(key)
        if hit is not None and time.monotonic() - hit[0] < TARGET_TTL_S:
            return hit[1]
        self._cache.pop(key, None)
        return None

    def put(self, key: tuple[str, str], target: Target) -> None:
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[key] = (time.monotonic(), target)

    def forget(self, task_id: str) -> None:
        for key in [k for k in self._cache if k[1] == task_id]:
            self._cache.pop(key, None)

    def due(self, task_id: str) -> bool:
        now = time.monotonic()
        if now - self._written.get(task_id, float("-inf")) < ACTIVITY_WRITE_S:
            return False
        self._written[task_id] = now
        return True


def targets(state: AppState) -> Targets:
    found = getattr(state, "proxy_targets", None)
    if found is None:
        found = Targets()
        state.proxy_targets = found  # type: ignore[attr-defined]
    return found


def _token(headers: Any, cookies: dict[str, str]) -> tuple[str, bool]:
    """(token, from the task origin's cookie)."""
    header = headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip(), False
    cookie = cookies.get(task_origin.TASK_COOKIE, "").strip()
    if cookie:
        return cookie, True
    raise ProxyError(401, "unauthenticated", "open the task from the web UI (or send a bearer token)")


_same_origin = session_cookie.from_own_pages


def _lookup(
    state: AppState, token: str, task_id: str, by_cookie: bool, *, own_only: bool | None = None
) -> Target:
    """The task's target for a bearer token, for a task-origin cookie (`by_cookie`: it stands on a web UI
    session), or for the web UI's own session token (the hand-over: `own_only`, as for a cookie)."""
    with state.tx() as session:
        try:
            if by_cookie:
                grant = task_origin.task_sessions(state).get(token, task_id)
                if grant is None:
                    raise UnauthenticatedError("this task's session has ended: open the task from the web UI")
                principal: Principal = users.authenticate_hash(session, grant.session_hash, state.tokens)
            else:
                principal = users.authenticate(session, token, state.tokens)
            principal.require_user()
        except UnauthenticatedError as e:
            raise ProxyError(401, "unauthenticated", str(e)) from None
        except PermissionDeniedError as e:
            raise ProxyError(403, "permission_denied", str(e)) from None
        return _owned_target(session, principal, task_id, by_cookie if own_only is None else own_only)


def _owned_target(session: Any, principal: Principal, task_id: str, by_cookie: bool) -> Target:
    task = session.get(TaskModel, task_id)
    if task is None or not access.task_visible(principal, task.owner_id):
        raise ProxyError(404, "not_found", f"task {task_id} not found")
    if by_cookie and not access.is_own(principal, task.owner_id):
        raise ProxyError(
            403, "permission_denied",
            f"task {task_id} is another user's: an admin reaches it with a bearer token, never with the "
            "web UI's session (its pages would run with the admin's session)",
        )  # fmt: skip
    return _ready_target(task, task_id)


def _ready_target(task: TaskModel, task_id: str) -> Target:
    """Where the task's server is and its token, once it runs and answers; else why not (410, 503, 502)."""
    if task.state == TaskState.TERMINATED:
        raise ProxyError(
            410, "ended", f"task {task_id} has ended: {task.exit_status or 'no reason recorded'}"
        )
    if task.state == TaskState.TERMINATING:
        raise ProxyError(410, "ended", f"task {task_id} is ending: its job is being cancelled")
    if task.state != TaskState.RUNNING or not task.service_address:
        where = f"waiting in Slurm ({task.pending_reason})" if task.pending_reason else "starting"
        raise ProxyError(503, "not_ready", f"task {task_id} is {where}", retry=True)
    if not task.service_token:
        raise ProxyError(
            502, "no_token", f"task {task_id} has no server token on record (an older master started it): "
            "kill it and start it again",
        )  # fmt: skip
    return Target(task_id, task.service_address, task.service_token, task.description)


async def resolve(
    state: AppState, headers: Any, cookies: dict[str, str], task_id: str, method: str
) -> Target:
    if not _valid_id(task_id):
        raise ProxyError(404, "not_found", f"task {task_id} not found")
    token, by_cookie = _token(headers, cookies)
    if by_cookie and method not in SAFE_METHODS and not _same_origin(headers):
        raise ProxyError(403, "csrf", "a request from another site cannot use your session")
    key = (hash_token(token), task_id)
    cache = targets(state)
    target = cache.get(key)
    if target is None:
        target = await run_in_threadpool(_lookup, state, token, task_id, by_cookie)
        cache.put(key, target)
    if cache.due(task_id):
        await run_in_threadpool(_touch, state, task_id)
    return target


def _valid_id(task_id: str) -> bool:
    import re

    return re.fullmatch(TASK_ID_PATTERN.strip("^$"), task_id) is not None


def _touch(state: AppState, task_id: str) -> None:
    with contextlib.suppress(Exception), state.tx() as session:
        task = session.get(TaskModel, task_id)
        if task is not None and task.state == TaskState.RUNNING:
            task.last_activity = utcnow()


def upstream_path(task_id: str, raw_path: bytes) -> str:
    """The path to ask the task's server for: what the client sent (still percent-encoded, as the server's
    own routing expects), refused when any segment, decoded as often as it decodes, is ``.`` or ``..``: the
    server would resolve it out of ``/proxy/<task id>/`` (``..%2F``, ``%252e%252e/``, ``..\\``)."""
    from urllib.parse import unquote

    prefix = f"/proxy/{task_id}/"
    raw = raw_path.decode("latin-1")
    if not raw.startswith(prefix):
        raise ProxyError(400, "bad_path", f"not a path under {prefix}")
    rest = raw[len(prefix) :]
    decoded, previous = rest, None
    while decoded != previous:
        previous, decoded = decoded, unquote(decoded)
    for segment in decoded.replace("\\", "/").split("/"):
        if segment.strip() in (".", ".."):
            raise ProxyError(
                400, "bad_path", f"a path under {prefix} cannot name . or .. (it would leave it)"
            )
    return prefix + rest


def _forward_headers(headers: Any, token: str, host: str) -> list[tuple[str, str]]:
    out = [(k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP]
    cookies = [
        c.strip()
        for c in headers.get("cookie", "").split(";")
        if c.strip() and c.split("=", 1)[0].strip() not in OUR_COOKIES
    ]
    if cookies:
        out.append(("cookie", "; ".join(cookies)))
    out += [("authorization", f"token {token}"), ("host", host)]
    if not any(k.lower() == "accept-encoding" for k, _ in out):
        # The client asked for no encoding: without this, httpx would ask the server for gzip on its behalf and
        # the client would get a compressed body it cannot read.
        out.append(("accept-encoding", "identity"))
    return out


def _error_response(request: Request, err: ProxyError, master: str = "") -> Response:
    """`master`: the master's origin, when the request came to the task origin (a 401 goes back there, to be
    handed over again or to log in)."""
    if err.status == 401 and "text/html" in request.headers.get("accept", "") and request.method == "GET":
        from urllib.parse import quote

        where = f"{master}{quote(request.url.path)}" if master else f"/login?next={quote(request.url.path)}"
        return Response(status_code=303, headers={"location": where})
    if err.retry and "text/html" in request.headers.get("accept", ""):
        page = (
            "<!doctype html><meta charset=utf-8><meta http-equiv=refresh content=2><title>Starting…</title>"
            f"<body style='font:16px system-ui;margin:3em'><h1>Starting…</h1><p>{_html(err.message)}. "
            "This page reloads until the server answers.</p>"
        )
        return HTMLResponse(page, status_code=503, headers={"retry-after": "2"})
    if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
        return _error_page(err, master)
    return JSONResponse({"code": err.code, "message": err.message}, status_code=err.status)


_ERROR_TITLES = {403: "Not yours to open", 404: "No such task", 410: "This task has ended"}


def _error_page(err: ProxyError, master: str) -> Response:
    """A browser's page for a refusal (the same status and words as the JSON a script gets), with the way back
    to the web UI's task list; nothing of the page it asked for."""
    title = _ERROR_TITLES.get(err.status, "The task's page is unavailable")
    page = (
        f"<!doctype html><meta charset=utf-8><title>{title} · hpc-det</title>"
        f"<body style='font:16px system-ui;margin:3em'><h1>{title}</h1><p>{_html(err.message)}.</p>"
        f"<p><a href='{_html(master)}/tasks'>Your tasks</a></p>"
    )
    return HTMLResponse(
        page, status_code=err.status,
        headers={"content-security-policy": "default-src 'none'; style-src 'unsafe-inline'", "x-error-code": err.code},
    )  # fmt: skip


def _html(text: str) -> str:
    import html

    return html.escape(text)


@router.get("/det/interactive/{task_id}/{rest:path}")
def determined_interactive(task_id: str) -> Response:
    """Determined's address of a notebook or TensorBoard (what its ``det notebook open`` and ``det tensorboard
    open`` open, under ``PUBLIC_URL`` /det): the task's page here is the proxy's, which checks who asks."""
    if not _valid_id(task_id):
        return JSONResponse({"code": "not_found", "message": f"no task {task_id[:64]!r}"}, status_code=404)
    return Response(status_code=303, headers={"location": f"/proxy/{task_id}/"})


@router.get(task_origin.HANDOFF_PATH)
def task_login(request: Request, code: str = "", next: str = "") -> Response:  # the URL's name
    """The task origin's half of the hand-over: a one-time code from the master's origin becomes this origin's
    cookie for the one task `next` names, and the browser goes on to `next`."""
    state = app_state(request)
    parts = next.split("/")
    task_id = parts[2] if len(parts) > 3 and parts[1] == "proxy" else ""
    token = task_origin.task_sessions(state).redeem(code, task_id) if _valid_id(task_id) and code else None
    if token is None:
        page = (
            "<!doctype html><meta charset=utf-8><title>Link expired</title><body style='font:16px system-ui;"
            "margin:3em'><h1>This link has expired</h1><p>Open the task again from the web UI: "
            f"<a href='{_html(state.config.master_url())}/tasks'>Tasks</a>.</p>"
        )
        return HTMLResponse(page, status_code=400, headers={"content-security-policy": task_origin.CSP})
    response = Response(status_code=303, headers={"location": next})
    response.set_cookie(
        task_origin.TASK_COOKIE, token, path=f"/proxy/{task_id}/", httponly=True, samesite="lax",
        secure=state.task_origin.startswith("https:"), max_age=int(task_origin.TASK_SESSION_TTL_S),
    )  # fmt: skip
    return response


def _a_browser_elsewhere(scope: Any, headers: Any, state: AppState) -> bool:
    """A browser's request (no ``Authorization``: a browser never adds it by itself, nor can a page set it on a
    WebSocket) that did not come to the task origin. A bearer token's request is a script's (the CLI, the SDK,
    an admin's): it is answered wherever it comes."""
    if "authorization" in headers:
        return False
    return not task_origin.on_task_origin(scope, state.task_origin, state.task_port)


def _hand_over(request: Request, state: AppState, task_id: str) -> Response:
    """A browser on the master's origin asks for a task's page: with its own web UI session (from the master's
    own pages, or typed) it is sent to the task origin with a one-time code; otherwise to the login page."""
    origin = state.task_origin
    token = session_cookie.cookie_token(request)
    where = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    if request.method not in ("GET", "HEAD"):
        return JSONResponse(
            {"code": "wrong_origin", "message": f"tasks' pages are served at {origin}{where}, not here"},
            status_code=421, headers={"location": f"{origin}{where}"},
        )  # fmt: skip
    try:
        if token is None:
            raise ProxyError(401, "unauthenticated", "log in to the web UI first")
        if not session_cookie.from_own_pages(request.headers):
            raise ProxyError(403, "cross_site", "a task is opened from the master's own pages")
        _lookup(state, token, task_id, by_cookie=False, own_only=True)
    except ProxyError as err:
        return _error_response(request, err)
    code = task_origin.task_sessions(state).hand_off(token, task_id)
    return Response(status_code=303, headers={"location": task_origin.task_login_url(origin, code, where)})


@router.api_route("/proxy/{task_id}/{path:path}", methods=METHODS)
async def proxy_http(task_id: str, path: str, request: Request) -> Response:
    state = app_state(request)
    if not _valid_id(task_id):
        return _error_response(request, ProxyError(404, "not_found", f"task {task_id[:64]!r} not found"))
    if _a_browser_elsewhere(request.scope, request.headers, state):
        return await run_in_threadpool(_hand_over, request, state, task_id)
    try:
        target = await resolve(state, request.headers, dict(request.cookies), task_id, request.method)
        url = f"http://{target.address}{upstream_path(task_id, request.scope.get('raw_path') or b'')}"
    except ProxyError as err:
        return _error_response(request, err, state.config.master_url())
    if request.url.query:
        url += f"?{request.url.query}"
    client = targets(state).http()
    PROXIED[0] += 1
    upstream_request = client.build_request(
        request.method, url, headers=_forward_headers(request.headers, target.token, request.headers.get("host", "")),
        content=await request.body() if request.method not in SAFE_METHODS else None,
    )  # fmt: skip
    try:
        upstream = await client.send(upstream_request, stream=True)
    except httpx.HTTPError as e:
        return _unreachable(state, task_id, e)
    response = StreamingResponse(
        upstream.aiter_raw(), status_code=upstream.status_code, background=BackgroundTask(upstream.aclose)
    )
    response.raw_headers = [
        (k.encode("latin-1"), v.encode("latin-1"))
        for k, v in upstream.headers.multi_items()
        if k.lower() not in HOP_BY_HOP - {"content-length"}
    ] + [(b"content-security-policy", task_origin.CSP.encode())]  # its scripts stay on this origin
    return response


def _unreachable(state: AppState, task_id: str, error: Exception) -> Response:
    targets(state).forget(task_id)
    log.info("task %s: its server does not answer: %r", task_id, error)  # never echoed to the client
    return JSONResponse(
        {"code": "upstream_unreachable", "message": f"task {task_id}'s server does not answer"},
        status_code=502,
    )


OPEN_SOCKETS = [0]
"""WebSockets proxied to tasks' servers now (notebooks' kernels, terminals): the master's /metrics."""
PROXIED = [0]
"""HTTP requests proxied to tasks' servers so far."""


@router.websocket("/proxy/{task_id}/{path:path}")
async def proxy_ws(websocket: WebSocket, task_id: str, path: str) -> None:
    state: AppState = websocket.app.state.det
    if _a_browser_elsewhere(websocket.scope, websocket.headers, state):
        await websocket.close(code=1008, reason="tasks' pages and their sockets are on the task origin")
        return
    if not _same_origin(websocket.headers):
        await websocket.close(code=1008, reason="a WebSocket from another site cannot use your session")
        return
    try:
        target = await resolve(state, websocket.headers, dict(websocket.cookies), task_id, "GET")
        url = f"ws://{target.address}{upstream_path(task_id, websocket.scope.get('raw_path') or b'')}"
    except ProxyError as err:
        await websocket.close(code=1008, reason=err.message[:120])
        return
    if websocket.url.query:
        url += f"?{websocket.url.query}"
    upstream = await _connect_upstream(websocket, url, target.token, task_id)
    if upstream is None:
        return
    await websocket.accept(subprotocol=upstream.subprotocol)

    async def downstream() -> None:
        async for data in upstream:
            if isinstance(data, str):
                await websocket.send_text(data)
            else:
                await websocket.send_bytes(data)

    async def upstream_pump() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            await upstream.send(text if text is not None else message.get("bytes") or b"")

    async def keep_active() -> None:
        while True:
            await asyncio.sleep(ACTIVITY_WRITE_S)
            await run_in_threadpool(_touch, state, task_id)

    token, by_cookie = _token(websocket.headers, dict(websocket.cookies))

    async def recheck() -> None:
        while True:
            await asyncio.sleep(WS_RECHECK_S)
            try:
                await run_in_threadpool(_lookup, state, token, task_id, by_cookie)
            except ProxyError as err:
                ended.append(err.message)
                return

    ended: list[str] = []
    pumps = [asyncio.create_task(c) for c in (downstream(), upstream_pump(), keep_active(), recheck())]
    OPEN_SOCKETS[0] += 1  # one event loop: no lock needed
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        OPEN_SOCKETS[0] -= 1
        await _close_both(websocket, upstream, pumps, ended)


async def _connect_upstream(
    websocket: WebSocket, url: str, token: str, task_id: str
) -> ClientConnection | None:
    """The WebSocket to the task's server, with the client's subprotocols; None when it refused (the client's
    is then closed, 1011)."""
    from websockets.asyncio.client import connect

    protocols = [
        p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()
    ]
    try:
        return await connect(
            url, additional_headers={"Authorization": f"token {token}"},
            subprotocols=protocols or None, max_size=None, open_timeout=10, ping_interval=None,  # type: ignore[arg-type]
        )  # fmt: skip
    except Exception as e:  # refused, timed out, a handshake the server rejected
        log.info("task %s: its server refused a WebSocket: %r", task_id, e)  # never echoed to the client
        await websocket.close(code=1011, reason="the task's server refused the WebSocket")
        return None


async def _close_both(
    websocket: WebSocket, upstream: ClientConnection, pumps: list[asyncio.Task[None]], ended: list[str]
) -> None:
    """Stop the pumps and close both ends: the client's with the server's code, or 1008 and why when the
    session or the task ended."""
    for p in pumps:
        p.cancel()
    code = upstream.close_code or 1000
    await upstream.close()
    with contextlib.suppress(RuntimeError, WebSocketDisconnect):
        if ended:  # the session or the task ended: policy violation, with why
            await websocket.close(code=1008, reason=ended[0][:120])
        else:
            await websocket.close(code=1001 if code in (1005, 1006) else code)


async def close(state: AppState) -> None:
    client = getattr(state, "proxy_targets", None)
    if client is not None and client.client is not None:
        await client.client.aclose()
