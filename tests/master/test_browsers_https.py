"""Issue 35: a master beyond loopback without a certificate of the admin's serves browsers over HTTPS, on a port
of their own, with a certificate it generates; its plain port keeps serving the API (det, jobs) and hands no
browser a session. A real det-master in a subprocess, listening on every address (0.0.0.0)."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from hpc_master import browser_tls

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "Adm1n-pass-word"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


@dataclass
class Shared:
    plain: str
    https: str
    state: Path
    config: Path
    proc: subprocess.Popen[str]

    @property
    def cert(self) -> Path:
        return self.state / "tls" / "browser.crt"

    def verified(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert))


def start(tmp: Path, config: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DET_ADMIN_PASSWORD": PASSWORD,
           "DET_MASTER_STATE_DIR": str(tmp / "state"), "DET_MASTER_DATA_DIR": str(tmp / "data")}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "hpc_master.server", "--config", str(config)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def wait_up(proc: subprocess.Popen[str], url: str, **kw: object) -> None:
    deadline = time.monotonic() + 90  # a start takes 2-5 s; far longer on 2 busy CPUs (CI's other lanes)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the master exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            httpx.get(url, timeout=1, **kw)  # type: ignore[arg-type]
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not come up")


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out[-3000:]
    return out


def free_pair() -> int:
    """A free port whose next one is free too: the task origin's default is ``listen.port + 1`` (another one
    when that is taken, which the test would then not find: it asks for ``port + 1``)."""
    for _ in range(100):
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two free ports in a row")


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Shared]:
    port, browser_port = free_pair(), free_port()
    config = tmp_path / "master.yaml"
    config.write_text(
        f"listen: {{host: 0.0.0.0, port: {port}}}\ntls: {{browser_port: {browser_port}}}\n"
        f'db: {{url: "sqlite:///{tmp_path}/master.db"}}\n'
    )
    proc = start(tmp_path, config)
    master = Shared(
        f"http://127.0.0.1:{port}", f"https://127.0.0.1:{browser_port}", tmp_path / "state", config, proc
    )
    try:
        wait_up(proc, f"{master.plain}/api/v1/master")
        yield master
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def login(client: httpx.Client, url: str, *, cookie: bool) -> httpx.Response:
    body = {"username": "admin", "password": PASSWORD}
    return client.post(f"{url}/api/v1/auth/login", params={"cookie": str(cookie).lower()}, json=body)


def test_the_plain_port_serves_the_api_and_sends_browsers_to_https(shared: Shared) -> None:
    plain = httpx.Client(timeout=10)
    # det and jobs: a bearer token over the plain port, as before.
    token = login(plain, shared.plain, cookie=False).json()["token"]
    me = plain.get(f"{shared.plain}/api/v1/me", headers={"Authorization": f"Bearer {token}"})
    assert me.status_code == 200 and me.json()["user"]["username"] == "admin"
    # A browser's page goes to the web UI's HTTPS port, under the host name it used, path and query kept.
    for path in ("/", "/login", "/experiments/3?tab=trials", "/proxy/abc/lab"):
        sent = plain.get(f"{shared.plain}{path}", headers={"accept": "text/html,*/*", "host": "login1:1234"})
        assert sent.status_code == 307, (path, sent.text)
        assert sent.headers["location"] == f"https://login1:{shared.https.rsplit(':', 1)[1]}{path}"
    # ... but never the API, nor a script's request for a task (the CLI's bearer token).
    assert plain.get(f"{shared.plain}/api/v1/master", headers={"accept": "text/html"}).status_code == 200
    kept = plain.get(
        f"{shared.plain}/proxy/abc/", headers={"accept": "text/html", "authorization": "Bearer x"}
    )
    assert kept.status_code != 307
    # No session over plain HTTP: the login says where to go, and a cookie that arrives anyway is not used.
    refused = login(plain, shared.plain, cookie=True)
    assert refused.status_code == 403 and refused.json()["code"] == "https_required", refused.text
    assert shared.https + "/" in refused.json()["message"] and "set-cookie" not in refused.headers
    cookie_me = plain.get(f"{shared.plain}/api/v1/me", headers={"cookie": f"det_session={token}"})
    assert cookie_me.status_code == 403 and cookie_me.json()["code"] == "https_required"


def test_https_hands_out_a_host_only_secure_session_with_the_generated_certificate(shared: Shared) -> None:
    with httpx.Client(
        timeout=10, verify=shared.verified()
    ) as browser:  # trusts only the generated certificate
        assert "<title>" in browser.get(f"{shared.https}/login").text
        answer = login(browser, shared.https, cookie=True)
        assert answer.status_code == 200, answer.text
        (cookie,) = [c for c in answer.headers.get_list("set-cookie") if "det_session=" in c]
        assert cookie.startswith("__Host-det_session=")
        attrs = {a.strip().split("=")[0].lower() for a in cookie.split(";")[1:]}
        assert {"secure", "httponly", "path"} <= attrs and "domain" not in attrs
        assert "path=/" in cookie.lower() and "samesite=strict" in cookie.lower()
        me = browser.get(f"{shared.https}/api/v1/webui/session", headers={"sec-fetch-site": "same-origin"})
        assert me.status_code == 200 and me.json()["user"]["username"] == "admin"
        # Tasks' pages are served beside the web UI, over HTTPS too, on their own port.
        task_origin = f"https://127.0.0.1:{int(shared.plain.rsplit(':', 1)[1]) + 1}"
        assert browser.get(f"{task_origin}/proxy/0123456789abcdef/").status_code in (401, 404)
    with pytest.raises(httpx.TransportError):  # the task origin speaks no plain HTTP
        httpx.get(f"http://127.0.0.1:{int(shared.plain.rsplit(':', 1)[1]) + 1}/proxy/x/", timeout=5)
    # The key is the master's account's alone; the certificate names this machine.
    assert (shared.state / "tls" / "browser.key").stat().st_mode & 0o077 == 0
    names = (shared.state / "tls" / "browser.names").read_text().split()
    assert socket.gethostname() in names and "0.0.0.0" not in names


def test_the_certificate_is_kept_across_restarts_and_a_taken_port_stops_the_master(shared: Shared) -> None:
    first = shared.cert.read_bytes()
    out = stop(shared.proc)
    fingerprint = subprocess.run(
        ["openssl", "x509", "-in", str(shared.cert), "-noout", "-fingerprint", "-sha256"],
        capture_output=True, text=True, check=True,
    ).stdout.strip().split("=")[1]  # fmt: skip
    assert fingerprint in out  # logged at start, for users to compare with what their browser shows
    again = start(shared.state.parent, shared.config)
    try:
        wait_up(again, f"{shared.https}/login", verify=shared.verified())
        assert shared.cert.read_bytes() == first  # a browser told to trust it keeps trusting it
    finally:
        stop(again)
    # Someone else holds the web UI's port: the master does not start elsewhere, it says why and stops.
    port = int(shared.https.rsplit(":", 1)[1])
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("0.0.0.0", port))
        squatter.listen()
        refused = start(shared.state.parent, shared.config)
        out, _ = refused.communicate(timeout=60)
    assert refused.returncode != 0
    assert f"cannot listen on 0.0.0.0:{port} for the web UI over HTTPS (tls.browser_port)" in out, out[-2000:]


def test_the_certificate_is_made_again_when_names_change_or_it_expires(tmp_path: Path) -> None:
    made = browser_tls.ensure(tmp_path, ["10.0.0.7"])
    text = subprocess.run(["openssl", "x509", "-in", str(made.cert), "-noout", "-text"],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "IP Address:10.0.0.7" in text and f"DNS:{socket.gethostname()}" in text
    assert browser_tls.ensure(tmp_path, ["10.0.0.7"]).fingerprint == made.fingerprint
    moved = browser_tls.ensure(tmp_path, ["10.0.0.8"])
    assert moved.fingerprint != made.fingerprint
    # A certificate that expires within 30 days is replaced (here: one made to last a day).
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "1", "-subj", "/CN=old", "-keyout", str(tmp_path / "browser.key"),
         "-out", str(tmp_path / "browser.crt")], capture_output=True, check=True,
    )  # fmt: skip
    assert browser_tls.ensure(tmp_path, ["10.0.0.8"]).fingerprint not in (moved.fingerprint, "")
    assert "CN = 10.0.0.8" in subprocess.run(
        ["openssl", "x509", "-in", str(tmp_path / "browser.crt"), "-noout", "-subject"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
