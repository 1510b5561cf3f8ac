"""What a notebook's or TensorBoard's job runs: ``python -m harness.exec.serve {notebook|tensorboard} [ARG...]``.

1. picks a free port on the node and the address the master reaches the node at (the source address of a
   route to the master);
2. writes ``service.json`` (``{"host", "port", "pid"}``) atomically into ``$DET_RUN_DIR``: the master proxies
   ``/proxy/<task id>/`` there once the port answers;
3. execs the server, bound to that port, serving under ``/proxy/<task id>/`` and requiring the token in
   ``$DET_RUN_DIR/service_token`` (0600, written by the master, which adds it to every request it proxies;
   given to the server in its environment, never on its command line, which every user of the node can read).

Standard library only.
"""

from __future__ import annotations

import json
import os
import socket
import sys
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
            "--ServerApp.allow_remote_access=True", "--ServerApp.port_retries=0", *extra,
        ]  # fmt: skip
    if kind == "tensorboard":
        return [
            python, "-m", "tensorboard.main", "--bind_all", f"--port={port}", f"--path_prefix={base_url.rstrip('/')}",
            *extra,
        ]  # fmt: skip
    raise SystemExit(f"error: unknown service {kind!r} (notebook or tensorboard)")


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
    env["JUPYTER_TOKEN"] = token
    env.pop("DET_SESSION_TOKEN", None)
    record = {"host": address_towards(env.get("DET_MASTER", "")), "port": port, "pid": os.getpid()}
    tmp = os.path.join(run_dir, f".{SERVICE_FILE}.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(run_dir, SERVICE_FILE))
    print(f"[serve] {kind} on {record['host']}:{port}, proxied at {base_url}", flush=True)
    os.execvpe(argv_[0], argv_, env)


if __name__ == "__main__":
    sys.exit(main())
