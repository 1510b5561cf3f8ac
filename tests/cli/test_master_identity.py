"""`det` checks who listens on a loopback master's port before it sends a token, a password or an owner key
(``hpc_master/cli/_peer.py``): a port taken by another account while the master was down gets nothing.
The uid comes from the kernel (``/proc/net/tcp*``), for the very connection ``det`` opened."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc_master.cli._peer import server_uid
from tests.cli.conftest import Det, free_port

SQUATTER = r"""
import socket, sys
srv = socket.socket(socket.AF_INET6); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("::", int(sys.argv[1]))); srv.listen(16)
print("listening", flush=True)
while True:
    conn, _ = srv.accept()
    conn.settimeout(2)
    got = b""
    try:
        while b"\r\n\r\n" not in got:
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    with open(sys.argv[2], "ab") as f:
        f.write(got)
    body = b'{"token": "captured"}'
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    conn.close()
"""


def squat(port: int, log: Path, user: str | None = None) -> subprocess.Popen[str]:
    """A listener on `port` (dual-stack) that writes down every request it gets; as `user` when given."""
    argv = [sys.executable, "-c", SQUATTER, str(port), str(log)]
    who: dict[str, object] = {}
    if user is not None:
        entry = pwd.getpwnam(user)
        who = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, **who)  # type: ignore[call-overload]
    assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
    return proc


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """An in-process listener (this test's own uid) that keeps whatever it is sent."""
    got: list[bytes] = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            conn.settimeout(1)
            with contextlib.suppress(OSError):
                got.append(conn.recv(65536))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield srv.getsockname()[1], got
    stop.set()
    thread.join()
    srv.close()


@pytest.mark.parametrize(
    ("bind", "connect"), [("127.0.0.1", "127.0.0.1"), ("::1", "::1"), ("::", "127.0.0.1")]
)
def test_the_kernel_names_the_listeners_account(bind: str, connect: str) -> None:
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    with socket.socket(family) as srv:
        srv.bind((bind, 0))
        srv.listen(1)
        assert server_uid(connect, srv.getsockname()[1]) == os.getuid()


def _cache(tmp_path: Path, master: str, *, token: str, server_uid: int) -> None:
    auth = tmp_path / "config" / "hpc-det" / "auth.json"
    auth.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    entry = {"tokens": {"determined": token}, "active_user": "determined", "server_uid": server_uid}
    auth.write_text(json.dumps({"version": 1, "masters": {master: entry}}))


def test_a_cached_token_goes_only_to_the_account_that_issued_it(
    det: Det, tmp_path: Path, listener: tuple[int, list[bytes]]
) -> None:
    """The token was cached from a master run by another account; whoever listens on its port now is not it."""
    port, got = listener
    url = f"http://127.0.0.1:{port}"
    _cache(tmp_path, url, token="the-owners-token", server_uid=os.getuid() + 1)
    r = det("e", "list", env={"DET_MASTER": url})
    assert r.rc != 0 and "not sending credentials" in r.err, r.err
    assert f"uid {os.getuid() + 1}" in r.err  # whom it expected
    time.sleep(0.3)
    assert not any(got), got  # the check's own connection carries nothing
    r = det("user", "login", "determined", env={"DET_MASTER": url, "DET_PASS": "a password"})
    assert r.rc != 0 and "not sending credentials" in r.err
    assert not any(got), got


def test_the_first_login_pins_the_masters_account(det: Det, tmp_path: Path) -> None:
    r = det("user", "whoami")
    assert r.rc == 0, r.err
    auth = json.loads((tmp_path / "config" / "hpc-det" / "auth.json").read_text())
    assert auth["masters"][os.environ["DET_MASTER"]]["server_uid"] == os.getuid()


@pytest.mark.root
def test_another_account_squatting_a_personal_masters_port_captures_nothing(det: Det, tmp_path: Path) -> None:
    """The owner's personal master is down; `nobody` listens on its port. The owner's `det` holds the master's
    owner key and a cached token: it sends neither, and says who is listening."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    shared = Path(tempfile.mkdtemp(prefix="squat-"))
    shared.chmod(0o777)
    log = shared / "squatter.log"
    log.touch()
    os.chown(log, pwd.getpwnam("nobody").pw_uid, -1)
    config = tmp_path / "config" / "hpc-det"
    config.mkdir(mode=0o700, parents=True, exist_ok=True)
    (config / f"owner-key-{port}").write_text("the-owner-key\n")
    _cache(tmp_path, url, token="the-owners-token", server_uid=os.getuid())
    proc = squat(port, log, user="nobody")
    try:
        # `det user login` with no DET_PASS refuses before it would ask for a password it will not send.
        for argv, env in ((("e", "list"), {}), (("user", "login", "determined"), {"DET_PASS": ""}),
                          (("user", "login", "determined"), {})):  # fmt: skip
            r = det(*argv, env={"DET_MASTER": url, **env})
            assert r.rc != 0 and "not sending credentials" in r.err, r.err
            assert "nobody" in r.err and "det-master --daemon" in r.err
        # A shared master's port (the pinned account is root), taken by nobody: the same.
        (config / f"owner-key-{port}").unlink()
        r = det("e", "list", env={"DET_MASTER": url})
        assert r.rc != 0 and "nobody" in r.err and "det user login" in r.err, r.err
    finally:
        proc.kill()
        proc.wait()
    captured = log.read_bytes()
    assert (
        b"the-owners-token" not in captured
        and b"the-owner-key" not in captured
        and b"password" not in captured
    )
    assert captured == b""
