"""A tiny in-process master implementing the harness routes of docs/harness-api.md, for tests and benchmarks."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeMaster:
    def __init__(self, port: int = 0, token: str = "tok") -> None:
        self.token = token
        self.lock = threading.Lock()
        self.metrics: dict[tuple[int, int, str, int], dict[str, Any]] = {}
        self.duplicates = 0
        self.batches = 0
        self.requests: list[tuple[str, str, Any]] = []
        self.fail_until = 0.0  # answer 503 until this monotonic time
        self.preempt = threading.Event()
        self.acks = 0
        self.checkpoints: dict[str, Any] = {}
        self.ops: list[int] = []
        self.answer_pending = False
        self.answer_next = False  # answer a completion with the next operation, as the real master can
        self.completed_ops: list[tuple[int, float]] = []
        self.progress: list[float] = []
        self.record_all = True
        self.connections = 0  # TCP connections accepted (the harness keeps one alive per thread)
        self._open: set[Any] = set()  # their sockets, closed by stop() as a crash would
        self._port = port
        self._server: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> None:
        master = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with master.lock:
                    master.connections += 1
                    master._open.add(self.connection)

            def finish(self) -> None:
                with master.lock:
                    master._open.discard(self.connection)
                super().finish()

            def _answer(self, code: int, body: Any) -> None:
                raw = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _handle(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}") if n else None
                if self.headers.get("Authorization") != f"Bearer {master.token}":
                    return self._answer(401, {"code": "unauthorized", "message": "bad token", "field": ""})
                if time.monotonic() < master.fail_until:
                    return self._answer(503, {"code": "unavailable", "message": "restarting", "field": ""})
                code, out = master.route(method, self.path, body)
                self._answer(code, out)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

        self._server = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        self._server.daemon_threads = True
        self._port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Like a master crash: the port refuses connections until start()."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.drop_connections()

    def drop_connections(self) -> None:
        """Close every open connection, as a restarting master (or an idle timeout) does."""
        import contextlib
        import socket

        with self.lock:
            socks, self._open = list(self._open), set()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if self.record_all:
            with self.lock:
                self.requests.append((method, path, body))
        if method == "POST" and path.endswith("/metrics/batch"):
            trial = int(path.split("/")[4])
            acc = dup = 0
            with self.lock:
                self.batches += 1
                for m in body["metrics"]:
                    key = (trial, m["trialRunId"], m["group"], m["stepsCompleted"])
                    if key in self.metrics:
                        dup += 1
                    else:
                        self.metrics[key] = m
                        acc += 1
                self.duplicates += dup
            return 200, {"accepted": acc, "duplicates": dup}
        if "/signals/preemption" in path:
            timeout_s = float(path.split("timeoutSeconds=")[-1]) if "timeoutSeconds=" in path else 0
            self.preempt.wait(min(timeout_s, 2.0))
            return 200, {"preempt": self.preempt.is_set()}
        if path.endswith("/signals/ack_preemption"):
            self.acks += 1
            return 200, {}
        if method == "POST" and path == "/api/v1/checkpoints":
            self.checkpoints[body["checkpoint"]["uuid"]] = body["checkpoint"]
            return 200, {}
        if method == "GET" and path.startswith("/api/v1/checkpoints/"):
            uuid = path.rsplit("/", 1)[-1]
            if uuid not in self.checkpoints:
                return 404, {"code": "not_found", "message": "no such checkpoint", "field": ""}
            return 200, {"checkpoint": self.checkpoints[uuid]}
        if method == "DELETE" and path == "/api/v1/checkpoints":
            for u in body["checkpointUuids"]:
                self.checkpoints.pop(u, None)
            return 200, {}
        if path.endswith("/searcher/operation"):
            with self.lock:
                if self.answer_pending:  # as the real master does before its searcher saw a completion
                    self.answer_pending = False
                    return 200, {"op": None, "completed": False, "pending": True}
                if not self.ops:
                    return 200, {"op": None, "completed": True}
                return 200, {"op": {"validateAfter": {"length": self.ops[0]}}, "completed": False}
        if path.endswith("/searcher/completed_operation"):
            with self.lock:
                length = body["op"]["validateAfter"]["length"]
                if self.ops and self.ops[0] == length:
                    self.ops.pop(0)
                self.completed_ops.append((length, body["searcherMetric"]))
                if self.answer_next:
                    op = {"validateAfter": {"length": self.ops[0]}} if self.ops else None
                    return 200, {"next": {"op": op, "completed": not self.ops}}
                self.answer_pending = True
            return 200, {}
        if path.endswith("/progress"):
            self.progress.append(body["progress"])
            return 200, {}
        if path.endswith("best_searcher_validation_metric"):
            return 200, {"metric": 0.5}
        if path.endswith("/early_exit") or path.endswith("/runner/metadata"):
            return 200, {}
        return 404, {"code": "not_found", "message": path, "field": ""}


def cluster_info(
    master: FakeMaster,
    *,
    trial_id: int = 7,
    run_id: int = 1,
    config: Any = None,
    hparams: Any = None,
    latest_checkpoint: str | None = None,
) -> dict[str, Any]:
    return {
        "master_url": master.url,
        "cluster_id": "c",
        "agent_id": "node0",
        "slot_ids": [0],
        "task_id": f"{trial_id}.{run_id}",
        "allocation_id": f"{trial_id}.{run_id}",
        "session_token": master.token,
        "task_type": "TRIAL",
        "latest_checkpoint": latest_checkpoint,
        "container_addrs": ["127.0.0.1"],
        "container_rank": 0,
        "trial": {
            "trial_id": trial_id,
            "experiment_id": 3,
            "trial_seed": 42,
            "hparams": hparams or {"lr": 0.1, "global_batch_size": 4},
            "config": config
            or {"searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 8}}},
            "steps_completed": 0,
            "trial_run_id": run_id,
            "user_data": {"owner": "x"},
        },
    }
