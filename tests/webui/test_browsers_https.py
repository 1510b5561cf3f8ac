"""Issue 35 in a real browser, on an address that is not loopback (Chromium sends even ``Secure`` cookies to
``http://localhost``): a shared master without a certificate of the admin's sends a browser from its plain
port to its web UI over HTTPS (its generated certificate), where the session cookie is ``__Host-``,
``Secure`` and ``HttpOnly``; a server on another port of the master's host, over plain HTTP, and the master's
own plain port then get no session cookie. A control: the neighbour's own cookie does reach it."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.conftest import require
from tests.master.test_browsers_https import PASSWORD, start, stop, wait_up
from tests.webui.conftest import Page

pytestmark = pytest.mark.browser
SCREENSHOTS = Path(os.environ.get("DET_SCREENSHOT_DIR", "/tmp/hpc-det-screenshots"))


def own_address() -> str:
    """This machine's address on its default route (no packet is sent), which is not loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            address = str(s.getsockname()[0])
        except OSError:
            address = "127.0.0.1"
    require(not address.startswith("127."), "an address of this machine that is not loopback")
    return address


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Neighbour(BaseHTTPRequestHandler):
    """Another user's server on another port of the master's host: it records the cookies it is sent."""

    seen: ClassVar[list[str]] = []
    PAGE = b"<!doctype html><title>neighbour</title><script>document.cookie = 'neighbour=1; path=/';</script>"

    def do_GET(self) -> None:
        if self.path == "/":  # not the favicon
            self.seen.append(self.headers.get("cookie") or "")
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(self.PAGE)))
        self.end_headers()
        self.wfile.write(self.PAGE)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def neighbour() -> Iterator[tuple[str, list[str]]]:
    host = own_address()
    seen: ClassVar[list[str]] = []
    handler = type("Recording", (Neighbour,), {"seen": seen})
    server = ThreadingHTTPServer((host, free_port(host)), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_shared_master_hands_browsers_a_secure_session_that_no_other_port_gets(
    tmp_path: Path, browser: Any, neighbour: tuple[str, list[str]]
) -> None:
    host = own_address()
    port, browser_port = free_port(host), free_port(host)
    config = tmp_path / "master.yaml"
    config.write_text(
        f"listen: {{host: 0.0.0.0, port: {port}}}\ntls: {{browser_port: {browser_port}}}\n"
        f'db: {{url: "sqlite:///{tmp_path}/master.db"}}\n'
    )
    proc = start(tmp_path, config)
    plain, https = f"http://{host}:{port}", f"https://{host}:{browser_port}"
    ui = Page(browser, plain)
    try:
        wait_up(proc, f"{plain}/api/v1/master")
        ui.page.goto("/")  # the address users know: the master's plain port
        ui.page.wait_for_url(f"{https}/**")
        ui.login("admin", PASSWORD)  # /login on the plain port, redirected; the form posts over HTTPS
        assert ui.page.url.startswith(f"{https}/experiments")
        ui.page.wait_for_selector("h1, h2")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        ui.page.screenshot(path=str(SCREENSHOTS / "webui-over-https.png"))
        ui.assert_clean(allow=("401",))  # the web UI works over HTTPS (the login page asked who is in: 401)
        (session,) = [c for c in ui.context.cookies() if "det_session" in c["name"]]
        assert session["name"] == "__Host-det_session" and session["secure"] and session["httpOnly"]
        assert session["domain"] == host and session["path"] == "/" and session["sameSite"] == "Strict"

        # Another port of the master's host, over plain HTTP: twice, the second time with its own cookie.
        url, seen = neighbour
        ui.page.goto(url)
        ui.page.goto(url)
        assert seen == ["", "neighbour=1"], seen  # its own cookie comes back; the master's never
        # The master's own plain port gets no session either: 401 (a session sent there would be 403).
        me = ui.page.goto(f"{plain}/api/v1/me")
        assert me is not None and me.status == 401, me.text() if me else None
        # And the session works where it was given.
        assert ui.page.goto(f"{https}/api/v1/webui/session").status == 200  # type: ignore[union-attr]
    finally:
        ui.close()
        stop(proc)
