"""JupyterLab as a Slurm job on the local cluster, reached only through the master's proxy: a kernel started
over a WebSocket executes ``1+1`` on the compute node as the researcher; another user is refused; JupyterLab
loads in Chromium with the web UI's session; killing the notebook ends its job and closes the proxy."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Master
from tests.slurm.fixtures import wait_for
from tests.webui.conftest import Page
from tests.webui.conftest import browser as browser  # the chromium fixture (one per module)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SCREENSHOTS = Path(os.environ.get("DET_SCREENSHOT_DIR", "/tmp/hpc-det-screenshots"))


def det(master: Master, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DET_MASTER=master.url, DET_USER="alice", DET_PASS="alice-pw")
    return subprocess.run(
        [sys.executable, "-m", "hpc_master.cli.main", *args],
        capture_output=True, text=True, env=env, timeout=timeout_s, check=False,
    )  # fmt: skip


def execute(ws_url: str, headers: dict[str, str], code: str) -> dict[str, Any]:
    """Run `code` in a kernel over its channels WebSocket (Jupyter's message protocol); the execute_result.
    (websockets' sync client: Playwright's sync API keeps an event loop running in this thread.)"""
    from websockets.sync.client import connect

    msg_id = uuid.uuid4().hex
    request = {
        "header": {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex, "msg_type": "execute_request",
                   "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True},
    }  # fmt: skip
    deadline = time.monotonic() + 60
    with connect(ws_url, additional_headers=headers, open_timeout=30, max_size=None) as ws:
        ws.send(json.dumps(request))
        while time.monotonic() < deadline:
            msg = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "execute_result":
                return dict(msg["content"])
            if msg["msg_type"] == "error":
                raise AssertionError(f"the kernel failed: {msg['content']}")
    raise AssertionError("the kernel sent no result")


def test_a_notebook_on_a_compute_node_through_the_proxy(
    master: Master, alice: dict[str, str], browser: Any
) -> None:
    started = time.monotonic()
    proc = det(master, "notebook", "start", "--no-browser", "--config", "resources.slots=0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    url = proc.stdout.strip().splitlines()[-1]
    ready_s = time.monotonic() - started
    task_id = url.rstrip("/").rsplit("/", 1)[-1]
    assert url == f"{master.url}/proxy/{task_id}/"
    nb = master.api("GET", f"/notebooks/{task_id}", alice)["notebook"]
    assert (
        nb["isReady"]
        and nb["serviceAddress"] == f"/proxy/{task_id}/"
        and re.fullmatch(r"node\d+", nb["nodeList"])
    )

    http = httpx.Client(timeout=30)
    status = http.get(f"{url}api/status", headers=alice)
    assert status.status_code == 200, status.text
    kernel = http.post(f"{url}api/kernels", headers=alice, json={"name": "python3"})
    assert kernel.status_code == 201, kernel.text
    ws_url = url.replace("http://", "ws://") + f"api/kernels/{kernel.json()['id']}/channels"
    result = execute(ws_url, alice, "1+1")
    assert result["data"]["text/plain"] == "2"
    who = execute(ws_url, alice, "import os, socket; (os.getuid(), socket.gethostname())")
    assert who["data"]["text/plain"] == f"({master.researcher.uid}, '{nb['nodeList']}')"

    # Timing, direct vs proxied, for the same small request (the server's token read as root, as the master does).
    run_dir = master.user_jobs / "tasks" / task_id
    token = (run_dir / "service_token").read_text().strip()
    direct = f"http://{json.loads((run_dir / 'service.json').read_text())['host']}:" \
             f"{json.loads((run_dir / 'service.json').read_text())['port']}/proxy/{task_id}/api/status"  # fmt: skip
    times: dict[str, list[float]] = {"direct": [], "proxied": []}
    for _ in range(40):
        for name, target, hdrs in (("direct", direct, {"Authorization": f"token {token}"}),
                                   ("proxied", f"{url}api/status", alice)):  # fmt: skip
            t0 = time.perf_counter()
            assert http.get(target, headers=hdrs).status_code == 200
            times[name].append((time.perf_counter() - t0) * 1000)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    print(f"notebook ready {ready_s:.1f} s after `det notebook start`; GET api/status p50 direct {med['direct']:.2f} ms,"
          f" through the proxy {med['proxied']:.2f} ms")  # fmt: skip

    admin = master.login("admin", "admin-pw")
    user = {"username": "mallory", "admin": False, "active": True, "unixUsername": master.researcher.name}
    master.api("POST", "/users", admin, json={"user": user, "password": "mallory-pw"})
    mallory = master.login("mallory", "mallory-pw")
    assert http.get(f"{url}api/status", headers=mallory).status_code == 404
    assert http.get(f"{url}api/status").status_code == 401
    assert httpx.get(direct).status_code == 403  # the node's port itself wants the token (no cookie jar here)

    # JupyterLab in Chromium, with the web UI's session (and nothing else).
    ui = Page(browser, master.browser_url)
    try:
        ui.login("alice", "alice-pw")
        ui.page.goto(f"/proxy/{task_id}/lab")
        ui.page.wait_for_selector(".jp-Launcher, .jp-LauncherCard", timeout=60_000)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        ui.page.screenshot(path=str(SCREENSHOTS / "notebook-jupyterlab.png"))
    finally:
        ui.close()

    killed = det(master, "notebook", "kill", task_id)
    assert killed.returncode == 0, killed.stderr
    ended = wait_for(
        lambda: http.get(f"{url}api/status", headers=alice).status_code in (410,) or None,
        timeout_s=60, what="the proxy to say the notebook ended",
    )  # fmt: skip
    assert ended
    final = wait_for(
        lambda: ((n := master.api("GET", f"/notebooks/{task_id}", alice)["notebook"])["state"] == "STATE_TERMINATED"
                 and n) or None,
        timeout_s=60, what="the notebook's job to end",
    )  # fmt: skip
    assert "killed by the user" in final["exitStatus"]
