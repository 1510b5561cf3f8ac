"""What a notebook's or TensorBoard's job runs: ``python -m harness.exec.serve {notebook|tensorboard} [ARG...]``.

1. picks a free port on the node and the address the master reaches the node at (the source address of a
   route to the master);
2. writes ``service.json`` (``{"host", "port", "pid"}``) atomically into ``$DET_RUN_DIR``: the master proxies
   ``/proxy/<task id>/`` there once the port answers;
3. execs the server, bound to that port, serving under ``/proxy/<task id>/`` and requiring the token in
   ``$DET_RUN_DIR/service_token`` (0600, written by the master, which adds it to every request it proxies;
   given to the server in its environment, never on its command line, which every user of the node can read).
   TensorBoard has no token of its own: it listens on loopback, behind a small door (``forwarder``) on the
   node's port that checks the token, and ``service.json`` is written once TensorBoard answers.

Standard library only.
"""

from __future__ import annotations

import hmac
import http.client
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

SERVICE_FILE = "service.json"
TOKEN_FILE = "service_token"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def address_towards(master_url: str) -> str:
    """This node's address on the route to the master (no packet is sent: a UDP socket only picks a route)."""
    parts = urlsplit(master_url)
    host = parts.hostname or "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, parts.port or 80))
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def server_argv(
    kind: str, python: str, port: int, base_url: str, workdir: str, extra: list[str]
) -> list[str]:
    if kind == "notebook":
        return [
            python, "-m", "jupyterlab", "--no-browser", "--ip=0.0.0.0", f"--port={port}",
            f"--ServerApp.base_url={base_url}", f"--ServerApp.root_dir={workdir}",
            "--ServerApp.allow_remote_access=True", "--ServerApp.port_retries=0",
            # Clusters are air-gapped: no announcements feed, no update check against PyPI.
            "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", *extra,
        ]  # fmt: skip
    if kind == "tensorboard":  # on loopback only: TensorBoard has no token; `forward` is its door
        return [
            python, "-m", "tensorboard.main", "--host=127.0.0.1", f"--port={port}",
            f"--path_prefix={base_url.rstrip('/')}", *extra,
        ]  # fmt: skip
    raise SystemExit(f"error: unknown service {kind!r} (notebook or tensorboard)")


def forwarder(token: str, inner_port: int) -> type[http.server.BaseHTTPRequestHandler]:
    """A request handler that lets through only requests carrying ``Authorization: token <token>`` and
    relays them to ``127.0.0.1:inner_port`` (TensorBoard: plain HTTP, modest responses)."""
    want = f"token {token}".encode()

    class Forward(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            got = (self.headers.get("Authorization") or "").encode()
            if not hmac.compare_digest(got, want):
                self._answer(403, [("Content-Type", "text/plain")], b"this server wants its token\n")
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            conn = http.client.HTTPConnection("127.0.0.1", inner_port, timeout=300)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP | {"content-length"}]
                self._answer(resp.status, kept, data)
            except OSError as e:
                self._answer(502, [("Content-Type", "text/plain")], f"TensorBoard: {e}\n".encode())
            finally:
                conn.close()

        def _answer(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _forward

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Forward


_HOP = frozenset({"authorization", "connection", "keep-alive", "host", "transfer-encoding", "te", "upgrade"})


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"error: the server exited with code {proc.returncode} before it answered")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"error: the server did not answer on port {port} in {timeout_s:.0f} s")


def write_service(run_dir: str, host: str, port: int) -> None:
    record = {"host": host, "port": port, "pid": os.getpid()}
    tmp = os.path.join(run_dir, f".{SERVICE_FILE}.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(run_dir, SERVICE_FILE))


def serve_behind_forwarder(argv: list[str], env: dict[str, str], token: str, inner: int, run_dir: str) -> int:
    """Start the server on loopback, and once it answers, the token-checking door on every interface."""
    proc = subprocess.Popen(argv, env=env)
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    signal.signal(signal.SIGINT, lambda *_: proc.terminate())
    wait_port(inner, proc)
    door = http.server.ThreadingHTTPServer(("0.0.0.0", 0), forwarder(token, inner))
    door.daemon_threads = True
    threading.Thread(target=door.serve_forever, daemon=True).start()
    outer = int(door.server_address[1])
    host = address_towards(env.get("DET_MASTER", ""))
    write_service(run_dir, host, outer)
    print(f"[serve] tensorboard on {host}:{outer}", flush=True)
    return proc.wait()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        raise SystemExit("usage: python -m harness.exec.serve {notebook|tensorboard} [ARG...]")
    kind, extra = args[0], args[1:]
    run_dir = os.environ["DET_RUN_DIR"]
    task_id = os.environ["DET_TASK_ID"]
    with open(os.path.join(run_dir, TOKEN_FILE), encoding="utf-8") as f:
        token = f.read().strip()
    port = free_port()
    base_url = f"/proxy/{task_id}/"
    argv_ = server_argv(kind, sys.executable, port, base_url, os.getcwd(), extra)
    env = dict(os.environ)
    env.pop("DET_SESSION_TOKEN", None)
    if kind == "tensorboard":
        return serve_behind_forwarder(argv_, env, token, port, run_dir)
    env["JUPYTER_TOKEN"] = token
    host = address_towards(env.get("DET_MASTER", ""))
    write_service(run_dir, host, port)
    print(f"[serve] {kind} on {host}:{port}, proxied at {base_url}", flush=True)
    os.execvpe(argv_[0], argv_, env)


if __name__ == "__main__":
    sys.exit(main())
