"""Login throttling (issue 32 item 8) against the real app: a login node's users share one address, so nobody
else's failures may refuse a correct password, while guesses at one name are still slowed from anywhere; and
``X-Forwarded-For`` is believed only from the proxies that ``listen.forwarded_allow_ips`` names (a real
uvicorn, as ``det-master`` configures it)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from hpc_master import owner_key
from hpc_master.api.app import create_app
from hpc_master.errors import ConfigError
from hpc_master.masterconf import MasterConfig, parse_master_config
from hpc_master.server import uvicorn_config
from hpc_master.services.throttle import (
    FREE_ADDRESS_FAILURES,
    FREE_FAILURES,
    LoginThrottle,
    TooManyAttemptsError,
    address_group,
)

from .helpers import login, make_user

LOGIN = "/api/v1/auth/login"


class Clock:
    """A clock that moves only when told to, for the throttle of an app under test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(client: TestClient) -> Clock:
    clock = Clock()
    client.app.state.det.throttle = LoginThrottle(clock=clock)  # type: ignore[attr-defined]
    return clock


def add_user(client: TestClient, admin: dict[str, str], username: str, password: str) -> None:
    """A user who has never logged in (from anywhere)."""
    body = {"user": {"username": username}, "password": password}
    assert client.post("/api/v1/users", headers=admin, json=body).status_code == 200


def from_address(client: TestClient, address: str) -> TestClient:
    """Requests to the same app from another client address."""
    return TestClient(client.app, client=(address, 50000))


def attempt(client: TestClient, username: str, password: str) -> httpx.Response:
    response: httpx.Response = client.post(LOGIN, json={"username": username, "password": password})
    return response


# ---------------------------------------------------------------- one login node, many users


def test_other_peoples_failures_on_a_shared_address_never_refuse_a_correct_password(
    client: TestClient, clock: Clock
) -> None:
    """(a) Everybody on a login node has its address: guesses at alice and a spray of made-up names from it
    leave bob's correct password working; they slow only alice's name and the failures from that address."""
    admin = login(client)
    add_user(client, admin, "alice", "alice-pw")
    add_user(client, admin, "bob", "bob-pw")
    guesses = [attempt(client, "alice", f"guess-{i}").status_code for i in range(2 * FREE_FAILURES)]
    assert guesses == [401] * FREE_FAILURES + [429] * FREE_FAILURES
    sprayed = [attempt(client, f"nobody-{i}", "x").status_code for i in range(FREE_ADDRESS_FAILURES + 5)]

    assert attempt(client, "bob", "bob-pw").status_code == 200  # 429 before: the address's 50 were spent
    assert sprayed == [401] * FREE_ADDRESS_FAILURES + [429] * 5
    refused = attempt(client, "alice", "alice-pw")  # alice's name waits, from every address
    assert refused.status_code == 429 and refused.json()["code"] == "too_many_attempts"
    assert refused.headers["retry-after"] == "1" and "try again in 1 s" in refused.json()["message"]

    # While the address must wait, a real name's wrong password is answered as a made-up name's is.
    made_up, wrong = attempt(client, "nobody-x", "x"), attempt(client, "bob", "typo")
    assert made_up.status_code == wrong.status_code == 429
    assert made_up.json()["message"].split(":")[0] == wrong.json()["message"].split(":")[0]
    assert attempt(client, "bob", "bob-pw").status_code == 200

    clock.now += 1.01  # the backoff delays alice's name; it does not lock it
    assert attempt(client, "alice", "alice-pw").status_code == 200


def test_determineds_client_is_throttled_by_the_same_rules(client: TestClient, clock: Clock) -> None:
    from hpc_master.auth import determined_hash

    admin = login(client)
    add_user(client, admin, "carol", "carol-pw")

    def hashed(username: str, password: str) -> int:
        body = {"username": username, "password": determined_hash(password), "isHashed": True}
        return int(client.post(LOGIN, json=body).status_code)

    for i in range(FREE_ADDRESS_FAILURES):
        hashed(f"nobody-{i}", "x")
    assert hashed("carol", "carol-pw") == 200
    clock.now += 1.01  # the address's wait after its 50 failures on made-up names
    assert [hashed("carol", "wrong") for _ in range(FREE_FAILURES + 1)] == [403] * FREE_FAILURES + [429]


# ---------------------------------------------------------------- a brute force on one name


def test_repeated_failed_logins_are_slowed(client: TestClient) -> None:
    make_user(client, login(client), "erin", "right")
    wrong = {"username": "erin", "password": "wrong"}
    codes = [client.post(LOGIN, json=wrong).status_code for _ in range(FREE_FAILURES + 2)]
    assert codes[:FREE_FAILURES] == [401] * FREE_FAILURES
    assert codes[FREE_FAILURES:] == [429, 429]
    r = client.post(LOGIN, json={"username": "erin", "password": "right"})
    assert r.status_code == 429 and r.json()["code"] == "too_many_attempts"  # not even the right one, yet
    assert int(r.headers["retry-after"]) >= 1
    assert client.post(LOGIN, json={"username": "frank", "password": "x"}).status_code == 401


def test_a_brute_force_on_one_name_is_slowed_from_every_address(
    client: TestClient, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """(c) Each guess from another address: the name's backoff still stops them, and its correct password from
    a new address waits too; from the address the user logs in from, only that address's failures count."""
    admin = login(client)
    add_user(client, admin, "dave", "dave-pw")
    home = from_address(client, "10.0.0.7")
    assert attempt(home, "dave", "dave-pw").status_code == 200
    caplog.set_level(logging.WARNING, logger="hpc_master.services.throttle")
    codes = [attempt(from_address(client, f"198.51.100.{i}"), "dave", "guess").status_code for i in range(7)]
    assert codes == [401] * FREE_FAILURES + [429, 429]
    assert "198.51.100.4" in caplog.text and "'dave'" in caplog.text  # for fail2ban
    elsewhere = attempt(from_address(client, "198.51.100.200"), "dave", "dave-pw")
    assert elsewhere.status_code == 429 and elsewhere.headers["retry-after"] == "1"
    assert attempt(home, "dave", "dave-pw").status_code == 200  # guesses elsewhere do not keep dave out

    for i in range(FREE_FAILURES):  # dave's success cleared the name's count: guessing starts over, and
        assert attempt(from_address(client, f"203.0.113.{i}"), "dave", "guess").status_code == 401
    clock.now += 0.5
    assert attempt(from_address(client, "203.0.113.50"), "dave", "guess").status_code == 429
    clock.now += 0.51
    assert attempt(from_address(client, "203.0.113.51"), "dave", "guess").status_code == 401
    clock.now += 1.01  # the wait doubled: 2 s after the last failure
    doubled = attempt(from_address(client, "203.0.113.52"), "dave", "guess")
    assert doubled.status_code == 429 and doubled.headers["retry-after"] == "1"
    clock.now += 1.0
    assert attempt(from_address(client, "203.0.113.53"), "dave", "guess").status_code == 401


def test_guesses_from_the_users_own_address_slow_them_there() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    with throttle.attempt("erin", "10.0.0.5") as ok:
        ok.succeeded()
    for _ in range(FREE_FAILURES):
        with throttle.attempt("erin", "10.0.0.5") as bad:
            assert bad.failed(user_exists=True) is None
    with pytest.raises(TooManyAttemptsError) as refused, throttle.attempt("erin", "10.0.0.5"):
        pass
    assert refused.value.retry_after == "1"
    with pytest.raises(TooManyAttemptsError), throttle.attempt("erin", "10.0.0.6"):
        pass  # from elsewhere the name's own count (5, the same guesses) applies
    clock.now += 1.01
    with throttle.attempt("erin", "10.0.0.5") as ok:
        ok.succeeded()
    with throttle.attempt("erin", "10.0.0.5") as bad:  # a success cleared the count
        bad.failed(user_exists=True)
    with throttle.attempt("erin", "10.0.0.5"):
        pass


def test_parallel_guesses_count_from_the_moment_they_are_let_through() -> None:
    """A burst of simultaneous guesses gets no more through than the same guesses one after another."""
    throttle = LoginThrottle(clock=Clock())
    with ExitStack() as stack:
        for _ in range(FREE_FAILURES):
            stack.enter_context(throttle.attempt("frank", "10.0.0.5"))
        with pytest.raises(TooManyAttemptsError), throttle.attempt("frank", "10.0.0.9"):
            pass
    with throttle.attempt("frank", "10.0.0.9"):  # they ended without failing (a server error, say)
        pass


def test_made_up_names_are_slowed_as_real_ones_are() -> None:
    """So that the throttle tells nothing about which names exist."""
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    for username, exists in (("grace", True), ("no-such-user", False)):
        for _ in range(FREE_FAILURES):
            with throttle.attempt(username, "10.0.0.5") as bad:
                bad.failed(user_exists=exists)
        with pytest.raises(TooManyAttemptsError), throttle.attempt(username, "10.0.0.6"):
            pass


def test_an_ipv6_address_counts_as_its_64() -> None:
    assert (
        address_group("2001:db8:1:2:aaaa::1") == address_group("2001:db8:1:2:bbbb::2") == "2001:db8:1:2::/64"
    )
    assert address_group("2001:db8:1:3::1") != address_group("2001:db8:1:2::1")
    assert address_group("::ffff:192.0.2.7") == "192.0.2.7" == address_group("192.0.2.7")
    assert address_group("testclient") == "testclient"


# ---------------------------------------------------------------- X-Forwarded-For


@contextmanager
def real_master(config: MasterConfig, engine: Engine) -> Iterator[tuple[str, Clock]]:
    """The master's app under uvicorn as ``det-master`` configures it (``server.uvicorn_config``), on a free
    loopback port: its URL and the clock of its throttle."""
    app = create_app(config, engine=engine)
    clock = Clock()
    app.state.det.throttle = LoginThrottle(clock=clock)
    server = uvicorn.Server(uvicorn_config(app, config, "warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}", clock
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.mark.parametrize("proxies", [[], ["127.0.0.1"]], ids=["default", "proxy-on-loopback"])
def test_x_forwarded_for_moves_the_throttle_only_from_a_configured_proxy(
    engine: Engine, proxies: list[str]
) -> None:
    """(b) erin logged in from 10.1.1.1, then 5 guesses came from 10.2.2.2, both named by X-Forwarded-For
    from loopback. Believed (a proxy on loopback configured), they are two addresses and erin gets in from
    hers; not believed (the default: uvicorn's own believes loopback), all came from 127.0.0.1, where the
    guesses now slow erin."""
    db = {"url": engine.url.render_as_string(hide_password=False)}
    config = parse_master_config({"db": db, "listen": {"port": 0, "forwarded_allow_ips": proxies}}, env={})
    with real_master(config, engine) as (url, _clock), httpx.Client(base_url=url) as http:
        key = owner_key.read(0) or ""
        r = http.post(LOGIN, json={"username": "admin", "password": "", "ownerKey": key})
        admin = {"Authorization": f"Bearer {r.json()['token']}"}
        body: dict[str, Any] = {"user": {"username": "erin"}, "password": "erin-pw"}
        assert http.post("/api/v1/users", headers=admin, json=body).status_code == 200

        def as_from(address: str, password: str) -> httpx.Response:
            body = {"username": "erin", "password": password}
            return http.post(LOGIN, json=body, headers={"X-Forwarded-For": address})

        assert as_from("10.1.1.1", "erin-pw").status_code == 200
        assert [as_from("10.2.2.2", "guess").status_code for _ in range(FREE_FAILURES)] == [
            401
        ] * FREE_FAILURES
        answer = as_from("10.1.1.1", "erin-pw")
    if proxies:
        assert answer.status_code == 200
    else:
        assert answer.status_code == 429 and answer.headers["retry-after"] == "1"


def test_forwarded_allow_ips_takes_addresses_and_networks_only() -> None:
    ok = parse_master_config({"listen": {"forwarded_allow_ips": ["10.0.0.5", "10.0.0.0/24", "::1"]}}, env={})
    assert ok.listen.forwarded_allow_ips == ["10.0.0.5", "10.0.0.0/24", "::1"]
    assert parse_master_config({}, env={}).listen.forwarded_allow_ips == []
    for bad in ("*", "proxy.example.org"):
        with pytest.raises(ConfigError) as err:
            parse_master_config({"listen": {"forwarded_allow_ips": [bad]}}, env={})
        assert err.value.field == "listen.forwarded_allow_ips"
        assert ("any client pick its address" in str(err.value)) == (bad == "*")


def test_det_master_believes_no_forwarded_header_unless_configured() -> None:
    """uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise; the master tells it."""
    default = uvicorn_config(object(), parse_master_config({}, env={}))
    assert default.proxy_headers is False
    configured = parse_master_config({"listen": {"forwarded_allow_ips": ["10.0.0.5"]}}, env={})
    proxied = uvicorn_config(object(), configured)
    assert proxied.proxy_headers is True and proxied.forwarded_allow_ips == ["10.0.0.5"]
