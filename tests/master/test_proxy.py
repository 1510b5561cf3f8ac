"""The master's ``/proxy/{task_id}/`` against a real server on a real port (a small app that, as JupyterLab
does, requires ``Authorization: token …`` and serves under ``/proxy/<id>/``): who gets through, what is
forwarded (and what never is), WebSockets both ways, and the end of a task. JupyterLab itself, through the
proxy from a job on the local cluster, is tests/e2e/test_notebooks.py's."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from hpc_master.api import proxy, session_cookie
from hpc_master.db.engine import transaction
from hpc_master.db.models import TaskModel, utcnow
from hpc_master.services.lifecycle import mint_trial_token
from tests.master.helpers import login, make_user, seed_trial

SERVER_TOKEN = "server-secret-token"


def _upstream_app() -> Starlette:
    seen: list[dict[str, Any]] = []

    def authorized(headers: Any) -> bool:
        return headers.get("authorization") == f"token {SERVER_TOKEN}"

    async def echo(request: Request) -> Response:
        if not authorized(request.headers):
            return JSONResponse({"error": "no token"}, status_code=403)
        body = await request.body()
        seen.append({"headers": dict(request.headers), "path": request.url.path, "query": request.url.query})
        response = JSONResponse(
            {
                "path": request.url.path,
                "query": request.url.query,
                "method": request.method,
                "body": body.decode(),
            }
        )
        response.set_cookie("_xsrf", "x1")
        response.set_cookie("other", "y2")
        return response

    async def big(request: Request) -> Response:
        return Response(b"a" * (1 << 20), media_type="application/octet-stream")

    async def ws(websocket: WebSocket) -> None:
        if not authorized(websocket.headers):
            await websocket.close(code=1008)
            return
        await websocket.accept(subprotocol="v1.kernel.websocket.jupyter.org")
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if message.get("text") == "close":
                    await websocket.close(code=4000)
                    return
                if message.get("text") is not None:
                    await websocket.send_text("echo:" + message["text"])
                else:
                    await websocket.send_bytes(b"echo:" + message["bytes"])
        except WebSocketDisconnect:
            return

    app = Starlette(
        routes=[
            Route("/proxy/{task_id}/big", big),
            Route("/proxy/{task_id}/{rest:path}", echo, methods=["GET", "POST", "PUT", "DELETE"]),
            WebSocketRoute("/proxy/{task_id}/ws", ws),
        ]
    )
    app.state.seen = seen
    return app


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[str, Starlette]]:
    app = _upstream_app()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws="websockets-sansio")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"127.0.0.1:{port}", app
    server.should_exit = True
    thread.join(5)


def _running_notebook(
    client: TestClient, sessions: sessionmaker[Session], headers: dict[str, str], address: str
) -> str:
    """A notebook as the driver leaves it once its server answers: RUNNING, its address and token recorded."""
    r = client.post("/api/v1/notebooks", headers=headers, json={"config": {"resources": {"slots": 0}}})
    assert r.status_code == 200, r.text
    task_id = str(r.json()["notebook"]["id"])
    with transaction(sessions) as s:
        task = s.get(TaskModel, task_id)
        assert task is not None
        task.service_token = SERVER_TOKEN  # the master's record (a run directory's file is never read back)
        task.state, task.service_address, task.slurm_job_id = "STATE_RUNNING", address, "7"
        task.last_activity = utcnow()
    return task_id


class TaskClient:
    """The same master (and the same client, cookie jar and event loop), addressed at its task origin, where
    ``/proxy/`` answers."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.base_url = str(client.app.state.det.task_origin)  # type: ignore[attr-defined]
        self.cookies = client.cookies

    def _url(self, path: str) -> str:
        return path if "://" in path else f"{self.base_url}{path}"

    def get(self, path: str, **kw: Any) -> Any:
        return self.client.get(self._url(path), **kw)

    def post(self, path: str, **kw: Any) -> Any:
        return self.client.post(self._url(path), **kw)

    def websocket_connect(self, path: str, **kw: Any) -> Any:
        return self.client.websocket_connect(self._url(path).replace("http", "ws", 1), **kw)


def task_client(client: TestClient) -> TaskClient:
    return TaskClient(client)


def open_task(client: TestClient, tc: TaskClient, task_id: str, path: str = "") -> Any:
    """Open a task's page as the web UI's Open link does: the master's origin hands the browser over to the task
    origin with a one-time code, which becomes the task origin's own cookie. The last answer."""
    r = client.get(
        f"/proxy/{task_id}/{path}", headers={"sec-fetch-site": "same-origin"}, follow_redirects=False
    )
    assert r.status_code == 303, r.text
    login = r.headers["location"]
    assert login.startswith(f"{tc.base_url}/_det/task-login?code="), login
    r = tc.get(login, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/proxy/{task_id}/{path}", r.text
    return tc.get(r.headers["location"])


def _cookie_login(client: TestClient, username: str, password: str) -> None:
    """Log in as the web UI does: the session is a cookie the client keeps."""
    from hpc_master import owner_key

    body = {"username": username, "password": password}
    if password == "":
        body["ownerKey"] = owner_key.read(client.app.state.det.config.listen.port) or ""  # type: ignore[attr-defined]
    r = client.post("/api/v1/auth/login?cookie=true", json=body)
    assert r.status_code == 200, r.text
    assert session_cookie.SESSION_COOKIE in client.cookies


def test_the_owner_gets_through_and_nothing_of_the_masters_reaches_the_server(
    client: TestClient, sessions: sessionmaker[Session], upstream: tuple[str, Starlette]
) -> None:
    tc = task_client(client)
    address, app = upstream
    admin = login(client)
    alice = make_user(client, admin, "alice")
    task_id = _running_notebook(client, sessions, alice, address)
    r = tc.post(
        f"/proxy/{task_id}/api/contents/x.ipynb?type=notebook", headers={**alice, "cookie": "det_csrf=abc; keep=1"},
        content=b'{"cells": []}',
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json() == {"path": f"/proxy/{task_id}/api/contents/x.ipynb", "query": "type=notebook",
                        "method": "POST", "body": '{"cells": []}'}  # fmt: skip
    forwarded = app.state.seen[-1]["headers"]
    assert forwarded["authorization"] == f"token {SERVER_TOKEN}"  # the server's token, not the user's
    assert forwarded["cookie"] == "keep=1"  # the master's cookies are not the server's business
    assert sorted(r.headers.get_list("set-cookie")) == sorted(
        ["_xsrf=x1; Path=/; SameSite=lax", "other=y2; Path=/; SameSite=lax"]
    )
    big = tc.get(f"/proxy/{task_id}/big", headers=alice)
    assert big.status_code == 200 and len(big.content) == 1 << 20


def test_who_is_refused(
    client: TestClient, sessions: sessionmaker[Session], upstream: tuple[str, Starlette]
) -> None:
    tc = task_client(client)
    address, _ = upstream
    admin = login(client)
    alice = make_user(client, admin, "alice")
    bob = make_user(client, admin, "bob")
    task_id = _running_notebook(client, sessions, alice, address)
    with transaction(sessions) as s:
        trial_token = mint_trial_token(s, seed_trial(sessions, "carol"))
    url = f"/proxy/{task_id}/api/status"
    assert tc.get(url).status_code == 401
    html = tc.get(url, headers={"accept": "text/html"}, follow_redirects=False)
    master = client.app.state.det.config.master_url()  # type: ignore[attr-defined]
    assert html.status_code == 303 and html.headers["location"] == f"{master}/proxy/{task_id}/api/status"
    html = client.get(url, headers={"accept": "text/html"}, follow_redirects=False)  # the master's origin
    assert html.status_code == 303 and html.headers["location"] == f"/login?next=/proxy/{task_id}/api/status"
    assert tc.get(url, headers={"Authorization": f"Bearer {trial_token}"}).status_code == 403
    refused = tc.get(url, headers=bob)
    assert refused.status_code == 404 and "not found" in refused.json()["message"]
    # A browser gets a page that says so (the same status and words), and the way back to its tasks.
    page = tc.get(url, headers={**bob, "accept": "text/html"})
    assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
    assert "<h1>No such task</h1>" in page.text and refused.json()["message"] in page.text
    assert page.headers["x-error-code"] == "not_found" and f"href='{master}/tasks'" in page.text
    assert tc.get(url, headers=admin).status_code == 200  # an admin, with a bearer token
    _cookie_login(client, "admin", "")
    cookie_admin = client.get(url, headers={"sec-fetch-site": "same-origin"}, follow_redirects=False)
    client.cookies.clear()
    assert (
        cookie_admin.status_code == 403
        and "never with the web UI's session" in cookie_admin.json()["message"]
    )
    assert tc.get(f"/proxy/{'0' * 8}-0000-0000-0000-{'0' * 12}/x", headers=alice).status_code == 404
    assert tc.get("/proxy/not-a-task/x", headers=alice).status_code == 404


def test_a_cookie_changes_nothing_from_another_site(
    client: TestClient, sessions: sessionmaker[Session], upstream: tuple[str, Starlette]
) -> None:
    tc = task_client(client)
    address, _ = upstream
    admin = login(client)
    alice = make_user(client, admin, "alice")
    task_id = _running_notebook(client, sessions, alice, address)
    _cookie_login(client, "alice", "pw")
    url = f"/proxy/{task_id}/api/kernels"
    assert open_task(client, tc, task_id, "api/kernels").status_code == 200
    assert tc.get(url).status_code == 200  # a page load: same-origin or not, a GET changes nothing
    assert tc.post(url, headers={"sec-fetch-site": "same-origin"}).status_code == 200
    assert tc.post(url, headers={"sec-fetch-site": "cross-site"}).status_code == 403
    assert tc.post(url, headers={"origin": "http://evil.example"}).status_code == 403
    client.cookies.clear()


def test_websockets_are_pumped_both_ways_and_closed_with_the_server(
    client: TestClient, sessions: sessionmaker[Session], upstream: tuple[str, Starlette]
) -> None:
    tc = task_client(client)
    address, _ = upstream
    admin = login(client)
    alice = make_user(client, admin, "alice")
    task_id = _running_notebook(client, sessions, alice, address)
    with tc.websocket_connect(
        f"/proxy/{task_id}/ws", headers=alice, subprotocols=["v1.kernel.websocket.jupyter.org"]
    ) as ws:
        assert ws.accepted_subprotocol == "v1.kernel.websocket.jupyter.org"
        ws.send_text("1+1")
        assert ws.receive_text() == "echo:1+1"
        ws.send_bytes(b"\x00\x01")
        assert ws.receive_bytes() == b"echo:\x00\x01"
        ws.send_text("close")  # the server ends the connection: so does the proxy, with its code
        assert ws.receive()["code"] == 4000
    bob = make_user(client, admin, "bob")
    with (
        pytest.raises(WebSocketDisconnect) as refused,
        tc.websocket_connect(f"/proxy/{task_id}/ws", headers=bob),
    ):
        pass
    assert refused.value.code == 1008


def test_a_task_that_is_not_running_says_so(
    client: TestClient, sessions: sessionmaker[Session], upstream: tuple[str, Starlette]
) -> None:
    tc = task_client(client)
    address, _ = upstream
    admin = login(client)
    task_id = _running_notebook(client, sessions, admin, address)
    with transaction(sessions) as s:
        task = s.get(TaskModel, task_id)
        assert task is not None
        task.state, task.service_address, task.pending_reason = "STATE_QUEUED", None, "Resources"
    proxy.targets(client.app.state.det).forget(task_id)  # type: ignore[attr-defined]
    waiting = tc.get(f"/proxy/{task_id}/lab", headers={**admin, "accept": "text/html"})
    assert waiting.status_code == 503 and "Resources" in waiting.text and "http-equiv=refresh" in waiting.text
    client.post(f"/api/v1/notebooks/{task_id}/kill", headers=admin)
    proxy.targets(client.app.state.det).forget(task_id)  # type: ignore[attr-defined]
    ended = tc.get(f"/proxy/{task_id}/lab", headers=admin)
    assert ended.status_code == 410 and "is ending" in ended.json()["message"]


def test_the_client_s_accept_encoding_is_the_one_forwarded(
    client: TestClient, sessions: sessionmaker[Session], upstream: tuple[str, Starlette]
) -> None:
    """A client that asked for no encoding (plain curl) is not given gzip that the master asked for on its
    behalf: the server is asked for `identity`; a client that asks for gzip is asked for by its own words."""
    tc = task_client(client)
    address, app = upstream
    alice = make_user(client, login(client), "alice")
    task_id = _running_notebook(client, sessions, alice, address)
    client.headers.pop("accept-encoding", None)  # httpx's default; curl sends none
    r = tc.get(f"/proxy/{task_id}/plain", headers=alice)
    assert r.status_code == 200, r.text
    assert app.state.seen[-1]["headers"]["accept-encoding"] == "identity"
    r = tc.get(f"/proxy/{task_id}/zipped", headers={**alice, "accept-encoding": "gzip"})
    assert r.status_code == 200, r.text
    assert app.state.seen[-1]["headers"]["accept-encoding"] == "gzip"


def test_determineds_interactive_address_leads_to_the_proxy(client: TestClient) -> None:
    """`det notebook open` (Determined 0.38.1) opens /det/interactive/<id>/jupyter-lab/…: it leads to the proxy,
    which checks who asks; anything but a task id is not a redirect at all."""
    task_id = "0f6a2a59-3f4a-4c8e-9a7b-2b1f0e5d4c3a"
    wait = "%2Fdet%2Fwait%2Fjupyter-lab%2Fx%3FeventUrl%3D%2Fjupyter-lab%2Fx%2Fevents"
    r = client.get(f"/det/interactive/{task_id}/jupyter-lab/JupyterLab%20(x)/default/{wait}?currentSlotsExceeded=false",
                   follow_redirects=False)  # fmt: skip
    assert r.status_code == 303 and r.headers["location"] == f"/proxy/{task_id}/"
    r = client.get("/det/interactive/..%2F..%2Fevil.example/x/y", follow_redirects=False)
    assert r.status_code == 404 and "location" not in r.headers


def test_the_servers_token_comes_from_the_masters_record_never_a_file(
    client: TestClient, sessions: sessionmaker[Session], upstream: tuple[str, Starlette], tmp_path: Path
) -> None:
    """A user who replaces the run directory's ``service_token`` with a link to a secret gets nothing of it: the
    proxy never reads the file (issue 32, item 3); a task with no token on record is refused by name."""
    tc = task_client(client)
    alice = login(client)  # the admin, owner of this notebook
    task_id = _running_notebook(client, sessions, alice, upstream[0])
    canary = tmp_path / "canary"
    canary.write_text("CANARY-SECRET\n")
    with transaction(sessions) as s:
        task = s.get(TaskModel, task_id)
        assert task is not None
        Path(task.run_dir).mkdir(parents=True, exist_ok=True)
        (Path(task.run_dir) / "service_token").symlink_to(canary)
    r = tc.get(f"/proxy/{task_id}/echo", headers=alice)
    assert r.status_code == 200 and "CANARY" not in r.text
    with transaction(sessions) as s:
        task = s.get(TaskModel, task_id)
        assert task is not None
        task.service_token = None
    proxy.targets(client.app.state.det).forget(task_id)  # type: ignore[attr-defined]
    r = tc.get(f"/proxy/{task_id}/echo", headers=alice)
    assert (r.status_code, r.json()["code"]) == (502, "no_token") and "CANARY" not in r.text


@pytest.mark.parametrize(
    "path", ["..%2F..%2Fsecret", "a/..%2F..%2F..%2Fsecret", "%2e%2e/%2e%2e/secret", "%252e%252e%252fsecret",
             "..%5C..%5Csecret", "a/%2E/b"],
)  # fmt: skip
def test_a_path_cannot_leave_the_tasks_prefix(
    client: TestClient, sessions: sessionmaker[Session], upstream: tuple[str, Starlette], path: str
) -> None:
    """Dot segments, however encoded, are refused before anything is forwarded (issue 32, item 4)."""
    tc = task_client(client)
    alice = login(client)
    task_id = _running_notebook(client, sessions, alice, upstream[0])
    seen = len(upstream[1].state.seen)
    r = tc.get(f"/proxy/{task_id}/{path}", headers=alice)
    assert (r.status_code, r.json()["code"]) == (400, "bad_path"), r.text
    assert len(upstream[1].state.seen) == seen  # the server was not asked
    kept = tc.get(f"/proxy/{task_id}/a%2Fb/c..d/%2e%2e.txt?x=..%2F", headers=alice)
    assert kept.status_code == 200 and kept.json()["path"] == f"/proxy/{task_id}/a/b/c..d/...txt"


@pytest.mark.parametrize("how", ["logout", "deactivate"])
def test_an_open_websocket_is_closed_once_its_session_ends(
    client: TestClient,
    sessions: sessionmaker[Session],
    upstream: tuple[str, Starlette],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """A Jupyter terminal stays open no longer than its user's session (issue 32, item 10); the recheck
    period is shortened here from WS_RECHECK_S (5 s)."""
    tc = task_client(client)
    monkeypatch.setattr(proxy, "WS_RECHECK_S", 0.2)
    admin = login(client)
    alice = make_user(client, admin, "alice")
    task_id = _running_notebook(client, sessions, alice, upstream[0])
    with tc.websocket_connect(
        f"/proxy/{task_id}/ws", headers=alice, subprotocols=["v1.kernel.websocket.jupyter.org"]
    ) as ws:
        ws.send_text("ls")
        assert ws.receive_text() == "echo:ls"
        if how == "logout":
            assert client.post("/api/v1/auth/logout", headers=alice).status_code == 200
        else:
            user_id = client.get("/api/v1/me", headers=alice).json()["user"]["id"]
            r = client.patch(f"/api/v1/users/{user_id}", headers=admin, json={"active": False})
            assert r.status_code == 200, r.text
        closed = ws.receive()
    assert closed["type"] == "websocket.close" and closed["code"] == 1008, closed


def test_tasks_pages_are_never_served_on_the_masters_origin(
    client: TestClient, sessions: sessionmaker[Session], upstream: tuple[str, Starlette]
) -> None:
    """Issue 35: a task's page runs on the task origin, where the web UI's session does not exist; the master's
    origin only hands a browser over (its own task, from the master's own pages), and the task origin serves
    nothing but tasks' pages."""
    address, app = upstream
    tc = task_client(client)
    admin = login(client)
    alice = make_user(client, admin, "alice")
    task_id = _running_notebook(client, sessions, alice, address)
    other = _running_notebook(client, sessions, alice, address)
    # The master's origin: no page for a browser (a script's bearer token is answered anywhere).
    assert client.get(f"/proxy/{task_id}/lab", headers=alice).status_code == 200
    r = client.post(f"/proxy/{task_id}/lab", follow_redirects=False)
    assert r.status_code == 421 and r.json()["code"] == "wrong_origin"
    assert r.headers["location"].startswith(tc.base_url)
    anonymous = client.get(f"/proxy/{task_id}/lab", headers={"accept": "text/html"}, follow_redirects=False)
    assert anonymous.status_code == 303 and anonymous.headers["location"].startswith("/login?next=")
    with pytest.raises(WebSocketDisconnect) as closed, client.websocket_connect(f"/proxy/{task_id}/ws"):
        pass
    assert closed.value.code == 1008
    _cookie_login(client, "alice", "pw")
    cross = client.get(
        f"/proxy/{task_id}/lab", headers={"sec-fetch-site": "same-site"}, follow_redirects=False
    )
    assert cross.status_code == 403  # a task's page (another port: same site) cannot hand itself over
    page = open_task(client, tc, task_id, "lab")
    assert page.status_code == 200 and page.json()["path"] == f"/proxy/{task_id}/lab"
    assert "connect-src 'self'" in page.headers["content-security-policy"]
    (cookie,) = [c for c in tc.cookies.jar if c.name == "det_task"]
    assert cookie.path == f"/proxy/{task_id}/" and cookie.has_nonstandard_attr("HttpOnly")
    forwarded = app.state.seen[-1]["headers"]
    assert "det_task" not in forwarded.get("cookie", "") and "det_session" not in forwarded.get("cookie", "")
    # The task origin's cookie opens that task only; the task origin serves nothing of the master's.
    token = cookie.value
    assert tc.get(f"/proxy/{other}/lab").status_code == 401  # its cookie's path is the other task's
    assert tc.get("/api/v1/me", headers=alice).status_code == 404  # no API there, whatever the credentials
    assert tc.get("/experiments").status_code == 404  # nor the web UI
    # A hand-over code works once, for its own task.
    r = client.get(f"/proxy/{task_id}/", headers={"sec-fetch-site": "same-origin"}, follow_redirects=False)
    login_url = r.headers["location"]
    wrong_task = login_url.replace(f"/proxy/{task_id}/", f"/proxy/{other}/")
    assert tc.get(wrong_task, follow_redirects=False).status_code == 400
    assert tc.get(login_url, follow_redirects=False).status_code == 400  # spent by the try above
    # Logging out of the web UI ends the task origin's session too.
    csrf = session_cookie.csrf_token_for(client.cookies[session_cookie.SESSION_COOKIE])
    assert client.post("/api/v1/auth/logout", headers={"x-csrf-token": csrf}).status_code == 200
    proxy.targets(client.app.state.det).forget(task_id)  # type: ignore[attr-defined]
    assert tc.get(f"/proxy/{task_id}/lab").status_code == 401
    client.cookies.clear()
    client.cookies.set("det_task", token)
    assert client.get("/api/v1/me").status_code == 401  # not a session of the API
    client.cookies.clear()
