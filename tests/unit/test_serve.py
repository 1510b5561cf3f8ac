"""harness.exec.serve: the servers' command lines, the door in front of them (a real server on a Unix socket
behind a real door), and TensorBoard on a Unix socket with nothing on TCP (through the master's proxy on the
real cluster: tests/e2e's)."""

from __future__ import annotations

import http.server
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.exec import serve, serve_door

REPO = Path(__file__).resolve().parents[2]


def test_servers_listen_on_their_socket_only_and_never_take_the_token_on_their_command_line() -> None:
    nb = serve.server_argv("notebook", "/py", "/d/s.sock", "/proxy/t/", "/work", ["--x"])
    assert nb[:3] == ["/py", "-m", "jupyterlab"] and "--ServerApp.sock=/d/s.sock" in nb and nb[-1] == "--x"
    assert not any(a.startswith(("--port", "--ip", "--ServerApp.port", "--ServerApp.ip")) for a in nb)
    assert "--ServerApp.base_url=/proxy/t/" in nb and "--LabApp.news_url=None" in nb
    tb = serve.server_argv("tensorboard", "/py", "/d/s.sock", "/proxy/t/", "/work", ["--logdir_spec=a:/b"])
    assert tb[1:4] == ["-m", "harness.exec.serve_tensorboard", "/d/s.sock"]
    assert "--path_prefix=/proxy/t" in tb and tb[-1] == "--logdir_spec=a:/b"
    assert not any("token" in a.lower() or "--host" in a for a in nb + tb)
    with pytest.raises(SystemExit, match="unknown service"):
        serve.server_argv("vscode", "/py", "/s", "/", "/", [])


class _Inner(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = json.dumps({"path": self.path, "auth": self.headers.get("Authorization")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _UnixServer(http.server.ThreadingHTTPServer):
    address_family = socket.AF_UNIX

    def server_bind(self) -> None:
        self.socket.bind(self.server_address)  # no host name to look up


@pytest.fixture
def door(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "s.sock")
    inner = _UnixServer(path, _Inner)  # type: ignore[arg-type]
    threading.Thread(target=inner.serve_forever, daemon=True).start()
    port = serve_door.open_door("s3cret", "/proxy/t/", path)
    yield f"http://127.0.0.1:{port}"
    inner.shutdown()


def test_the_door_lets_through_only_the_token(door: str) -> None:
    assert httpx.get(f"{door}/proxy/t/data/runs").status_code == 403
    assert httpx.get(f"{door}/proxy/t/data/runs", headers={"Authorization": "token wrong"}).status_code == 403
    with httpx.Client(headers={"Authorization": "token s3cret"}) as client:
        for query in ("x=1", "x=2"):  # one kept-alive connection, spliced to the server
            r = client.get(f"{door}/proxy/t/data/runs?{query}")
            assert r.status_code == 200 and r.json() == {
                "path": f"/proxy/t/data/runs?{query}",
                "auth": "token s3cret",
            }


def test_the_door_proves_it_holds_the_token_without_giving_it_away(door: str) -> None:
    nonce = secrets.token_hex(16)
    r = httpx.get(f"{door}/proxy/t/{serve_door.PROOF_NAME}", params={"nonce": nonce})
    assert r.status_code == 200 and r.text == serve_door.proof("s3cret", nonce)
    assert "s3cret" not in r.text and r.text != serve_door.proof("other", nonce)
    assert httpx.get(f"{door}/proxy/t/{serve_door.PROOF_NAME}", params={"nonce": "short"}).status_code == 400
    assert httpx.get(f"{door}/proxy/u/{serve_door.PROOF_NAME}", params={"nonce": nonce}).status_code == 403


def _listening_tcp_ports(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_tensorboard_serves_on_its_socket_and_nothing_on_tcp(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    path = str(tmp_path / "tb.sock")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.exec.serve_tensorboard", path, f"--logdir={tmp_path}",
         "--path_prefix=/proxy/t"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not serve_door.unix_socket_answers(path):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "TensorBoard did not answer on its socket"
            time.sleep(0.2)
        assert _listening_tcp_ports(proc.pid) == set()
        port = serve_door.open_door("tb-token", "/proxy/t/", path)
        r = httpx.get(
            f"http://127.0.0.1:{port}/proxy/t/data/environment", headers={"Authorization": "token tb-token"}
        )
        assert r.status_code == 200 and "data_location" in r.json()
    finally:
        proc.terminate()
        proc.wait(10)
