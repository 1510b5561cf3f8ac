"""The harness's HTTP client: one kept-alive connection per thread, and what happens when it goes away."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
from fake_master import FakeMaster

from harness._http import MasterError, MasterSession, MasterUnreachable, split_url

CHECKPOINTS = "/api/v1/checkpoints"


def _requests_to(master: FakeMaster, path: str) -> int:
    return sum(1 for _, p, _ in master.requests if p == path)


def test_one_connection_per_thread_kept_alive() -> None:
    master = FakeMaster()
    session = MasterSession(master.url, master.token)
    for i in range(5):
        session.post(CHECKPOINTS, {"checkpoint": {"uuid": f"u{i}"}})
    assert master.connections == 1
    assert set(master.checkpoints) == {f"u{i}" for i in range(5)}

    other = threading.Thread(target=lambda: [session.get(f"{CHECKPOINTS}/u{i}") for i in range(3)])
    other.start()
    other.join()
    session.get(f"{CHECKPOINTS}/u0")
    assert master.connections == 2  # the thread's own, and the first one still in use


def test_a_connection_the_master_closed_while_idle_is_replaced_and_the_request_sent_once() -> None:
    master = FakeMaster()
    session = MasterSession(master.url, master.token)
    session.post(CHECKPOINTS, {"checkpoint": {"uuid": "a"}})
    master.drop_connections()  # as uvicorn does after its keep-alive timeout
    time.sleep(0.05)
    session.post(CHECKPOINTS, {"checkpoint": {"uuid": "b"}})
    assert master.connections == 2
    assert _requests_to(master, CHECKPOINTS) == 2
    assert set(master.checkpoints) == {"a", "b"}


def test_a_master_that_is_gone_is_unreachable_not_retried_forever() -> None:
    master = FakeMaster()
    session = MasterSession(master.url, master.token)
    session.post(CHECKPOINTS, {"checkpoint": {"uuid": "a"}})
    master.stop()  # listening socket closed and the open connection dropped
    start = time.monotonic()
    with pytest.raises(MasterUnreachable, match=r"POST http://127\.0\.0\.1"):
        session.post(CHECKPOINTS, {"checkpoint": {"uuid": "b"}})
    assert time.monotonic() - start < 5
    assert "b" not in master.checkpoints


def test_http_errors_carry_the_masters_code_and_message() -> None:
    master = FakeMaster()
    with pytest.raises(MasterError) as err:
        MasterSession(master.url, "wrong-token").get(f"{CHECKPOINTS}/x")
    assert (err.value.status, err.value.code, err.value.message) == (401, "unauthorized", "bad token")
    assert not err.value.retryable
    session = MasterSession(master.url, master.token)
    with pytest.raises(MasterError) as err:
        session.get(f"{CHECKPOINTS}/nope")
    assert (err.value.status, err.value.code) == (404, "not_found")
    session.post(CHECKPOINTS, {"checkpoint": {"uuid": "after-an-error"}})
    assert master.connections == 2  # the error answers did not cost the connection


def test_a_master_that_does_not_answer_times_out() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # connections complete in the backlog; nothing ever answers
    try:
        session = MasterSession(f"http://127.0.0.1:{silent.getsockname()[1]}", "t", timeout_s=0.3)
        start = time.monotonic()
        with pytest.raises(MasterUnreachable, match="timed out"):
            session.get("/api/v1/master")
        assert time.monotonic() - start < 3
    finally:
        silent.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_opens_its_own_connection() -> None:
    master = FakeMaster()
    session = MasterSession(master.url, master.token)
    session.post(CHECKPOINTS, {"checkpoint": {"uuid": "parent-1"}})
    pid = os.fork()
    if pid == 0:  # the child: the parent's socket must not be used from here
        code = 1
        try:
            session.post(CHECKPOINTS, {"checkpoint": {"uuid": "child"}})
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    session.post(CHECKPOINTS, {"checkpoint": {"uuid": "parent-2"}})
    assert set(master.checkpoints) == {"parent-1", "child", "parent-2"}
    assert master.connections == 2


@pytest.mark.parametrize(
    ("url", "parts"),
    [
        ("http://10.0.0.1:8080", ("http", "10.0.0.1", 8080, "")),
        ("https://master.example.org", ("https", "master.example.org", 443, "")),
        ("http://login1", ("http", "login1", 80, "")),
        ("http://[fe80::1]:9000/det/", ("http", "fe80::1", 9000, "/det")),
        ("HTTP://h:1/a/b", ("http", "h", 1, "/a/b")),
    ],
)
def test_split_url(url: str, parts: tuple[str, str, int, str]) -> None:
    assert split_url(url) == parts


@pytest.mark.parametrize("url", ["", "10.0.0.1:8080", "ftp://h", "http://:80"])
def test_split_url_refuses_what_is_not_a_master_address(url: str) -> None:
    with pytest.raises(ValueError, match="master's address"):
        split_url(url)
