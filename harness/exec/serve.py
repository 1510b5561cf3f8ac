"""What a notebook's or TensorBoard's job runs: ``python -m harness.exec.serve {notebook|tensorboard} [ARG...]``.

1. starts the server on a Unix socket in a directory of its own (0700, on the node): Jupyter with
   ``--ServerApp.sock`` and the token in ``$DET_RUN_DIR/service_token`` (given in its environment, never on its
   command line, which every user of the node can read); TensorBoard's WSGI app in ``serve_tensorboard``.
   Nothing listens on TCP but the door, loopback included;
2. once the server answers, opens the door (``serve_door``) on a port of the system's choosing: it proves to
   the master that it holds the task's token (HMAC of a nonce) and lets through only requests carrying it;
3. writes ``service.json`` (``{"host", "port", "pid"}``) atomically into ``$DET_RUN_DIR``: the master proxies
   ``/proxy/<task id>/`` to that port on the node Slurm placed the job on, once the door proved itself.

Standard library only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from urllib.parse import urlsplit

from harness.exec.serve_door import open_door, unix_socket_answers

SERVICE_FILE = "service.json"
TOKEN_FILE = "service_token"


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
    kind: str, python: str, socket_path: str, base_url: str, workdir: str, extra: list[str]
) -> list[str]:
    """The server's command line: it listens on `socket_path` only (``serve_door`` is its port)."""
    if kind == "notebook":
        return [
            python, "-m", "jupyterlab", "--no-browser", f"--ServerApp.sock={socket_path}",
            "--ServerApp.sock_mode=0600", f"--ServerApp.base_url={base_url}", f"--ServerApp.root_dir={workdir}",
            "--ServerApp.allow_remote_access=True",
            # Clusters are air-gapped: no announcements feed, no update check against PyPI.
            "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", *extra,
        ]  # fmt: skip
    if kind == "tensorboard":
        return [
            python, "-m", "harness.exec.serve_tensorboard", socket_path,
            f"--path_prefix={base_url.rstrip('/')}", *extra,
        ]  # fmt: skip
    raise SystemExit(f"error: unknown service {kind!r} (notebook or tensorboard)")


def wait_socket(path: str, proc: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"error: the server exited with code {proc.returncode} before it answered")
        if unix_socket_answers(path):
            return
        time.sleep(0.2)
    raise SystemExit(f"error: the server did not answer on {path} in {timeout_s:.0f} s")


def write_service(run_dir: str, host: str, port: int) -> None:
    """``service.json``: the door's port (the master takes the host from Slurm, and believes the port once
    the door proves it holds the task's token)."""
    record = {"host": host, "port": port, "pid": os.getpid()}
    tmp = os.path.join(run_dir, f".{SERVICE_FILE}.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(run_dir, SERVICE_FILE))


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        raise SystemExit("usage: python -m harness.exec.serve {notebook|tensorboard} [ARG...]")
    kind, extra = args[0], args[1:]
    run_dir = os.environ["DET_RUN_DIR"]
    task_id = os.environ["DET_TASK_ID"]
    with open(os.path.join(run_dir, TOKEN_FILE), encoding="utf-8") as f:
        token = f.read().strip()
    base_url = f"/proxy/{task_id}/"
    private = tempfile.mkdtemp(prefix="det-serve-")  # 0700, on the node: only this user enters it
    socket_path = os.path.join(private, "server.sock")
    argv_ = server_argv(kind, sys.executable, socket_path, base_url, os.getcwd(), extra)
    env = dict(os.environ)
    env.pop("DET_SESSION_TOKEN", None)
    if kind == "notebook":
        env["JUPYTER_TOKEN"] = token  # in the environment: a command line is every node user's to read
    proc = subprocess.Popen(argv_, env=env)
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    signal.signal(signal.SIGINT, lambda *_: proc.terminate())
    try:
        wait_socket(socket_path, proc)
        port = open_door(token, base_url, socket_path)
        host = address_towards(env.get("DET_MASTER", ""))
        write_service(run_dir, host, port)
        print(f"[serve] {kind} on {host}:{port}, proxied at {base_url}", flush=True)
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
        shutil.rmtree(private, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
