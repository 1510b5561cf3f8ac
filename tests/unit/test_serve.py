"""harness.exec.serve: the servers' command lines, and the token-checking door in front of TensorBoard (a real
server on loopback behind a real door; TensorBoard itself through the master's proxy is tests/e2e's)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import httpx
import pytest

from harness.exec import serve


def test_servers_serve_under_the_proxy_path_and_never_take_the_token_on_their_command_line() -> None:
    nb = serve.server_argv("notebook", "/py", 4000, "/proxy/t/", "/work", ["--x"])
    assert nb[:3] == ["/py", "-m", "jupyterlab"] and "--port=4000" in nb and nb[-1] == "--x"
    assert "--ServerApp.base_url=/proxy/t/" in nb and "--LabApp.news_url=None" in nb
    tb = serve.server_argv("tensorboard", "/py", 4001, "/proxy/t/", "/work", ["--logdir_spec=a:/b"])
    assert "--host=127.0.0.1" in tb and "--path_prefix=/proxy/t" in tb and tb[-1] == "--logdir_spec=a:/b"
    assert not any("token" in a.lower() for a in nb + tb)
    with pytest.raises(SystemExit, match="unknown service"):
        serve.server_argv("vscode", "/py", 1, "/", "/", [])


class _Inner(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"path": self.path, "auth": self.headers.get("Authorization")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def door() -> Iterator[str]:
    inner = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Inner)
    outer = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), serve.forwarder("s3cret", inner.server_address[1])
    )
    for server in (inner, outer):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{outer.server_address[1]}"
    for server in (inner, outer):
        server.shutdown()


def test_the_door_lets_through_only_the_token_and_keeps_it_from_the_server(door: str) -> None:
    assert httpx.get(f"{door}/proxy/t/data/runs").status_code == 403
    assert httpx.get(f"{door}/proxy/t/data/runs", headers={"Authorization": "token wrong"}).status_code == 403
    r = httpx.get(f"{door}/proxy/t/data/runs?x=1", headers={"Authorization": "token s3cret"})
    assert r.status_code == 200 and r.json() == {"path": "/proxy/t/data/runs?x=1", "auth": None}
