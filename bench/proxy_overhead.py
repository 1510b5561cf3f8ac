"""What the master's ``/proxy/{task_id}/`` adds to a notebook's requests, next to the same requests sent straight
to the server, alternating, in one process.

    .venv/bin/python bench/proxy_overhead.py [--requests N] [--out bench/results/proxy_overhead.md]

The server is a small app on loopback that, as JupyterLab does, requires ``Authorization: token …`` and
serves under ``/proxy/<id>/``: a 200-byte JSON answer (``api/status``, what JupyterLab polls), a 1 MB asset
(its largest bundles are a few MB) and a WebSocket echo (a kernel message round trip). The master is the real
app (uvicorn, SQLite, its own data directory) with one notebook task recorded as running there; each request
through it is authenticated by a bearer token as a browser's would be by its cookie. Reported: p50 and p99
per kind, and the ratio proxied/direct of the medians. No cluster needed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

TOKEN = "bench-token"
BIG = b"x" * (1 << 20)


def upstream_app() -> Starlette:
    def ok(headers: Any) -> bool:
        return bool(headers.get("authorization") == f"token {TOKEN}")

    async def status(request: Request) -> Response:
        if not ok(request.headers):
            return Response(status_code=403)
        return JSONResponse({"connections": 1, "kernels": 1, "last_activity": "2026-11-24T00:00:00Z",
                             "started": "2026-11-24T00:00:00Z", "pad": "x" * 80})  # fmt: skip

    async def big(request: Request) -> Response:
        return (
            Response(BIG, media_type="application/javascript")
            if ok(request.headers)
            else Response(status_code=403)
        )

    async def echo(ws: WebSocket) -> None:
        if not ok(ws.headers):
            await ws.close(code=1008)
            return
        await ws.accept()
        try:
            while True:
                await ws.send_text(await ws.receive_text())
        except WebSocketDisconnect:
            return

    return Starlette(routes=[
        Route("/proxy/{tid}/api/status", status), Route("/proxy/{tid}/static/big.js", big),
        WebSocketRoute("/proxy/{tid}/api/kernels/k/channels", echo),
    ])  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(app: Any, port: int) -> uvicorn.Server:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           ws="websockets-sansio"))  # fmt: skip
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    return server


def start_master(tmp: Path, upstream: str) -> tuple[str, dict[str, str], str]:
    for name in ("data", "state", "jobs", "checkpoints", "home"):
        (tmp / name).mkdir()
    os.environ.update(HOME=str(tmp / "home"), DET_MASTER_DATA_DIR=str(tmp / "data"),
                      DET_MASTER_STATE_DIR=str(tmp / "state"), DET_JOB_STORAGE_ROOT=str(tmp / "jobs"),
                      DET_CHECKPOINT_ROOT=str(tmp / "checkpoints"), DET_ADMIN_PASSWORD="bench-pw")  # fmt: skip
    from hpc_master.api.app import create_app
    from hpc_master.db.engine import transaction
    from hpc_master.db.models import TaskModel
    from hpc_master.masterconf import MasterConfig

    port = free_port()
    config = MasterConfig.model_validate({"db": {"url": f"sqlite:///{tmp}/master.db"},
                                          "listen": {"host": "127.0.0.1", "port": port},
                                          "security": {"require_passwords": True, "admin_password": "bench-pw"}})  # fmt: skip
    app = create_app(config)
    serve(app, port)
    url = f"http://127.0.0.1:{port}"
    login = httpx.post(f"{url}/api/v1/auth/login", json={"username": "admin", "password": "bench-pw"})
    assert login.status_code == 200, login.text
    token = login.json()["token"]
    headers = {"Authorization": f"Bearer {token}"}
    r = httpx.post(f"{url}/api/v1/notebooks", headers=headers, json={"config": {"resources": {"slots": 0}}})
    task_id = str(r.json()["notebook"]["id"])
    with transaction(app.state.det.sessions) as s:
        task = s.get(TaskModel, task_id)
        assert task is not None
        Path(task.run_dir).mkdir(parents=True)
        (Path(task.run_dir) / "service_token").write_text(TOKEN)  # where a master before issue 32 read it
        if hasattr(task, "service_token"):
            task.service_token = TOKEN  # the master's record, which the proxy reads since
        task.state, task.service_address, task.slurm_job_id = "STATE_RUNNING", upstream, "1"
    return url, headers, task_id


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def ws_round_trips(url: str, headers: dict[str, str], n: int) -> list[float]:
    from websockets.asyncio.client import connect

    out: list[float] = []
    async with connect(url, additional_headers=headers) as ws:
        for i in range(n):
            t0 = time.perf_counter()
            await ws.send(f'{{"msg": {i}, "pad": "{"y" * 200}"}}')
            await ws.recv()
            out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    up_port = free_port()
    serve(upstream_app(), up_port)
    with tempfile.TemporaryDirectory() as tmp:
        master, headers, tid = start_master(Path(tmp), f"127.0.0.1:{up_port}")
        direct_base = f"http://127.0.0.1:{up_port}/proxy/{tid}/"
        proxied_base = f"{master}/proxy/{tid}/"
        direct_h = {"Authorization": f"token {TOKEN}"}
        times: dict[str, list[float]] = {}
        with httpx.Client(timeout=30) as http:
            for path, n in (("api/status", args.requests), ("static/big.js", max(args.requests // 10, 20))):
                for base, hdrs in ((direct_base, direct_h), (proxied_base, headers)):
                    http.get(base + path, headers=hdrs)  # warm the connection
                for _ in range(n):
                    for base, hdrs, name in (
                        (direct_base, direct_h, "direct"),
                        (proxied_base, headers, "proxied"),
                    ):
                        t0 = time.perf_counter()
                        r = http.get(base + path, headers=hdrs)
                        assert r.status_code == 200, r.text
                        times.setdefault(f"{path} {name}", []).append((time.perf_counter() - t0) * 1000)
        ws_path = "api/kernels/k/channels"
        for name, base, hdrs in (("direct", direct_base, direct_h), ("proxied", proxied_base, headers)):
            url = base.replace("http://", "ws://") + ws_path
            times[f"WebSocket round trip {name}"] = asyncio.run(ws_round_trips(url, hdrs, args.requests))
    lines = ["| request | direct p50 / p99 (ms) | through the proxy p50 / p99 (ms) | ratio of medians |",
             "|---|---|---|---|"]  # fmt: skip
    for kind in ("api/status", "static/big.js", "WebSocket round trip"):
        d, p = times[f"{kind} direct"], times[f"{kind} proxied"]
        lines.append(f"| {kind} | {statistics.median(d):.2f} / {pct(d, 0.99):.2f} | "
                     f"{statistics.median(p):.2f} / {pct(p, 0.99):.2f} | {statistics.median(p) / statistics.median(d):.2f} |")  # fmt: skip
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(
            f"# bench/proxy_overhead.py\n\n{args.requests} requests per kind, {os.cpu_count()} CPUs.\n\n{report}\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
