"""Issue 35 in a real browser: a page served by a user's notebook (a server of the test's, behind the master's
proxy, as JupyterLab is) tries every way to use the master's API with the session of the user who opened it
(fetch, XHR, a form POST, a WebSocket) and to read the master's cookies. It runs on the task origin (here a
second port of the master's host, the weaker of the two set-ups: cookies ignore ports), so the browser does
attach the session cookie to its calls; the master answers none of them. The master records every API
request that carried the session cookie and how it was answered; a control call from the web UI's own page,
counted the same way, shows that the count sees a success when there is one."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from hpc_master.db.engine import make_engine, transaction
from hpc_master.db.models import TaskModel, utcnow
from hpc_master.masterconf import parse_master_config
from tests.webui.conftest import ADMIN_PASSWORD, Page, free_port
from tests.webui.seed import seed_experiment, seed_user

pytestmark = pytest.mark.browser

SERVER_TOKEN = "notebook-server-token"
EVIL = """<!doctype html><meta charset=utf-8><title>a notebook</title><body><script>
const master = %(master)s, masterWs = master.replace("http", "ws"), exp = %(exp)d, task = %(task)s;
const out = {cookie: document.cookie, calls: {}};
const note = (k, v) => { out.calls[k] = v; };
async function attempt(name, fn) { try { note(name, await fn()); } catch (e) { note(name, "error: " + e.message); } }
(async () => {
  await attempt("fetch me", async () => (await fetch(master + "/api/v1/me", {credentials: "include"})).status);
  await attempt("fetch session", async () => (await fetch(master + "/api/v1/webui/session", {credentials: "include"})).status);
  await attempt("fetch pause no-cors", async () => (await fetch(master + `/api/v1/experiments/${exp}/pause`,
    {method: "POST", credentials: "include", mode: "no-cors"})).type);
  await attempt("fetch pause with header", async () => (await fetch(master + `/api/v1/experiments/${exp}/pause`,
    {method: "POST", credentials: "include", headers: {"X-CSRF-Token": "guess"}})).status);
  await attempt("xhr me", () => new Promise((resolve) => {
    const x = new XMLHttpRequest(); x.withCredentials = true; x.open("GET", master + "/api/v1/me");
    x.onload = () => resolve(x.status); x.onerror = () => resolve("error"); x.send(); }));
  await attempt("form pause", () => new Promise((resolve) => {
    const frame = document.createElement("iframe"); frame.name = "sink"; document.body.append(frame);
    const form = document.createElement("form"); form.method = "POST"; form.target = "sink";
    form.action = master + `/api/v1/experiments/${exp}/pause`; document.body.append(form);
    frame.onload = () => resolve("submitted"); form.submit(); setTimeout(() => resolve("timeout"), 3000); }));
  await attempt("websocket", () => new Promise((resolve) => {
    const ws = new WebSocket(masterWs + `/proxy/${task}/ws`);
    ws.onopen = () => resolve("open"); ws.onclose = (e) => resolve("closed " + e.code);
    setTimeout(() => resolve("timeout"), 3000); }));
  // What the task origin's Content-Security-Policy lets leave (images, frames): the browser attaches the
  // session (same site), the master refuses it.
  await attempt("img", () => new Promise((resolve) => {
    const i = new Image(); i.onload = () => resolve("loaded"); i.onerror = () => resolve("error");
    i.src = master + "/api/v1/me"; }));
  await attempt("iframe", () => new Promise((resolve) => {
    const f = document.createElement("iframe"); f.onload = () => resolve("loaded"); f.src = master + "/api/v1/me";
    document.body.append(f); setTimeout(() => resolve("timeout"), 3000); }));
  await attempt("iframe of the web UI's session", () => new Promise((resolve) => {
    const f = document.createElement("iframe"); f.onload = () => resolve("loaded");
    f.src = master + "/api/v1/webui/session"; document.body.append(f); setTimeout(() => resolve("timeout"), 3000); }));
  await fetch(`/proxy/${task}/report`, {method: "POST", body: JSON.stringify(out)});
})();
</script>"""


def _notebook_server(reports: list[dict[str, Any]]) -> Starlette:
    def authorized(headers: Any) -> bool:
        return headers.get("authorization") == f"token {SERVER_TOKEN}"

    async def page(request: Request) -> Response:
        if not authorized(request.headers):
            return JSONResponse({"error": "no token"}, status_code=403)
        return HTMLResponse(EVIL % request.app.state.fill)

    async def report(request: Request) -> Response:
        reports.append(json.loads(await request.body()))
        return JSONResponse({})

    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.close()

    app = Starlette(
        routes=[
            Route("/proxy/{task_id}/evil", page),
            Route("/proxy/{task_id}/report", report, methods=["POST"]),
            WebSocketRoute("/proxy/{task_id}/ws", ws),
        ]
    )
    return app


class Recorder:
    """ASGI middleware: every ``/api/`` request that carried the web UI's session cookie, and its status."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.calls: list[tuple[str, str, int]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or [])
        with_session = b"det_session=" in headers.get(b"cookie", b"")
        if scope["type"] == "websocket" or not scope.get("path", "").startswith("/api/") or not with_session:
            await self.app(scope, receive, send)
            return

        async def recording(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.calls.append((scope["method"], scope["path"], int(message["status"])))
            await send(message)

        await self.app(scope, receive, recording)


def _listen(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


def _serve(app: Any, sockets: list[socket.socket]) -> tuple[uvicorn.Server, threading.Thread]:
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    return server, thread


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    from hpc_master.api.app import create_app

    for name, sub in (("HOME", "home"), ("DET_MASTER_DATA_DIR", "data"), ("DET_MASTER_STATE_DIR", "state")):
        monkeypatch.setenv(name, str(tmp_path / sub))
    port, task_port, nb_port = free_port(), free_port(), free_port()
    url = f"sqlite:///{tmp_path / 'master.db'}"
    config = parse_master_config(
        {
            "db": {"url": url},
            "listen": {"host": "127.0.0.1", "port": port},
            "security": {"require_passwords": True, "admin_password": ADMIN_PASSWORD},
            "job_storage_root": str(tmp_path / "jobs"),
            "task_proxy": {"origin": f"http://127.0.0.1:{task_port}"},
        },
        env={},
    )
    engine = make_engine(url)
    app = create_app(config, engine=engine)
    recorder = Recorder(app)
    from sqlalchemy.orm import sessionmaker

    sessions = sessionmaker(engine, expire_on_commit=False)
    with transaction(sessions) as s:
        alice = seed_user(s, "alice", "alice-pw")
        exp, _ = seed_experiment(s, alice, name="alices-run", trials=1, points=10, state="ACTIVE")
        task = TaskModel(
            id="0f6a2a59-3f4a-4c8e-9a7b-2b1f0e5d4c3a", task_type="NOTEBOOK", owner_id=alice, description="nb",
            state="STATE_RUNNING", service_address=f"127.0.0.1:{nb_port}", service_token=SERVER_TOKEN,
            config={}, run_dir=str(tmp_path / "run"), last_activity=utcnow(), slurm_job_id="7",
        )  # fmt: skip
        s.add(task)
    reports: list[dict[str, Any]] = []
    notebook = _notebook_server(reports)
    notebook.state.fill = {
        "master": json.dumps(f"http://127.0.0.1:{port}"),
        "exp": exp,
        "task": json.dumps(task.id),
    }
    servers = [_serve(recorder, [_listen(port), _listen(task_port)]), _serve(notebook, [_listen(nb_port)])]
    try:
        yield {"url": f"http://127.0.0.1:{port}", "task": task.id, "exp": exp, "reports": reports,
               "recorder": recorder, "app": app, "sessions": sessions}  # fmt: skip
    finally:
        for server, thread in servers:
            server.should_exit = True
            thread.join(10)
        engine.dispose()


def test_a_notebooks_page_cannot_use_the_session_of_the_user_who_opens_it(
    browser: Any, world: dict[str, Any]
) -> None:
    ui = Page(browser, world["url"])
    try:
        ui.login("alice", "alice-pw")
        # The control: the web UI's own page calls the API with the session, and the count sees it.
        ui.page.evaluate("fetch('/api/v1/me').then((r) => r.status)")
        assert ("GET", "/api/v1/me", 200) in world["recorder"].calls
        ui.page.goto("about:blank")  # the web UI's page ends, and its own calls with it
        time.sleep(1)
        before = len(world["recorder"].calls)
        ui.page.goto(
            f"{world['url']}/proxy/{world['task']}/evil"
        )  # the Open link: handed over to the task origin
        assert ui.page.url.startswith(world["app"].state.det.task_origin), ui.page.url
        deadline = time.monotonic() + 30
        while not world["reports"] and time.monotonic() < deadline:
            time.sleep(0.1)
        (report,) = world["reports"]
    finally:
        ui.close()
    calls = world["recorder"].calls[before:]
    print("the page's attempts:", report["calls"], "\nthe master's answers to them:", calls)
    assert calls, "the browser attached the session to none of the page's calls: nothing was tried"
    assert not [c for c in calls if c[2] < 400], calls  # 0 successful authenticated calls
    assert report["calls"]["websocket"] != "open" and report["calls"]["fetch me"] != 200
    # Both walls stood: the CSP kept fetch, XHR, the form and the WebSocket in the browser; what it lets out
    # (an image, a frame) reached the master with the session and was refused.
    assert {path for _, path, _ in calls} >= {"/api/v1/me", "/api/v1/webui/session"}, calls
    assert "det_" not in report["cookie"], report["cookie"]  # none of the master's cookies is readable
    with transaction(world["sessions"]) as s:
        from hpc_master.db.models import ExperimentModel

        assert s.get(ExperimentModel, world["exp"]).state == "ACTIVE"  # type: ignore[union-attr]
