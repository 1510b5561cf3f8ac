"""Munge login's rules without munge (the real munge: tests/slurm/test_munge_login.py): nonces, the master's own
URLs, who gets a master user, refusals that say why, and the routes on a master that takes no munge logins."""

from __future__ import annotations

import json
import pwd
import socket
from typing import Any

import pytest
from sqlalchemy import select

from hpc_master.db.engine import transaction
from hpc_master.db.models import UserModel
from hpc_master.errors import ClientError, PermissionDeniedError
from hpc_master.masterconf import parse_master_config
from hpc_master.services import munge_login as munge

NOBODY = pwd.getpwnam("nobody")


def config(**rules: Any) -> Any:
    return parse_master_config(
        {"listen": {"host": "10.0.0.5", "port": 8080}, "security": {"munge": {"enabled": True, **rules}}},
        env={},
    )


def test_a_nonce_is_good_once_and_only_when_issued() -> None:
    nonces = munge.Nonces()
    issued = nonces.issue()
    assert nonces.take(issued) and not nonces.take(issued)
    assert not nonces.take("never-issued")


def test_only_the_masters_own_urls() -> None:
    c = config(names=["login1.example.org"])  # bound to 10.0.0.5 only
    for ok in ("http://10.0.0.5:8080", "http://login1.example.org:8080/"):
        assert munge.own_url(ok, c), ok
    # Another account may listen on port 8080 of loopback (or of another address of this machine) and relay.
    for bad in ("http://10.0.0.5:8081", "http://evil.example.org:8080", "http://127.0.0.1:8080",
                f"http://{socket.gethostname()}:8080", "http://[::1", "not a url"):  # fmt: skip
        assert not munge.own_url(bad, c), bad
    everywhere = parse_master_config({"listen": {"host": "0.0.0.0", "port": 8080}}, env={})
    for ok in (
        "http://127.0.0.1:8080",
        f"http://{socket.gethostname()}:8080",
    ):  # its own sockets, all of them
        assert munge.own_url(ok, everywhere), ok
    assert not munge.own_url("http://127.0.0.1:8081", everywhere)


def _decoded(
    nonces: munge.Nonces, url: str = "http://10.0.0.5:8080", uid: int = NOBODY.pw_uid
) -> munge.Decoded:
    return munge.Decoded(uid, NOBODY.pw_gid, json.dumps({"nonce": nonces.issue(), "url": url}).encode())


@pytest.mark.parametrize(
    ("rules", "created", "admin"),
    [
        ({}, False, None),  # create_users: nobody (the default)
        ({"create_users": "everyone"}, True, False),
        ({"create_users": "groups", "user_groups": ["no-such-group"]}, False, None),
        ({"create_users": "groups", "user_groups": ["nogroup"], "admin_group": "nogroup"}, True, True),
    ],
)
def test_who_gets_a_master_user(
    sessions: Any, rules: dict[str, Any], created: bool, admin: bool | None
) -> None:
    nonces = munge.Nonces()
    with transaction(sessions) as s:
        if not created:
            with pytest.raises(PermissionDeniedError) as refused:
                munge.login(s, config(**rules), nonces, _decoded(nonces))
            assert "creates none" in refused.value.message and "nobody" in refused.value.message
            assert s.scalar(select(UserModel).where(UserModel.username == "nobody")) is None
            return
        user = munge.login(s, config(**rules), nonces, _decoded(nonces))
        assert (user.username, user.unix_username, user.admin) == ("nobody", "nobody", admin)
    with transaction(sessions) as s:  # the next login finds the same user
        again = munge.login(s, config(**rules), nonces, _decoded(nonces))
        assert again.id == user.id


def test_refusals_say_why(sessions: Any) -> None:
    nonces = munge.Nonces()
    c = config(create_users="everyone")
    cases = [
        (_decoded(nonces, url="http://10.0.0.5:9999"), "not for this master"),
        (munge.Decoded(NOBODY.pw_uid, 0, b'{"nonce": "forged", "url": "http://10.0.0.5:8080"}'), "nonce"),
        (munge.Decoded(NOBODY.pw_uid, 0, b"not json"), "payload"),
        (_decoded(nonces, uid=0), "root"),
    ]
    for decoded, why in cases:
        with transaction(sessions) as s, pytest.raises(PermissionDeniedError) as refused:
            munge.login(s, c, nonces, decoded)
        assert refused.value.code == "munge_refused" and why in refused.value.message, refused.value.message
    with pytest.raises(ClientError) as bad:
        munge.decode("x" * 9000, "unmunge")
    assert bad.value.field == "credential"
    with pytest.raises(PermissionDeniedError) as missing:
        munge.decode("MUNGE:abc", "/nonexistent/unmunge")
    assert missing.value.code == "munge_unavailable"


def test_a_master_without_munge_logins_says_so(client: Any) -> None:
    for route, body in (("nonce", None), ("login", {"credential": "MUNGE:abc"})):
        r = client.post(f"/api/v1/auth/munge/{route}", json=body)
        assert r.status_code == 400 and r.json()["code"] == "munge_disabled", r.text
        assert "security.munge.enabled" in r.json()["message"]


def test_unmunge_runs_at_most_eight_at_once() -> None:
    """The route is open to anyone (a login) and starts a process: the ninth at once is told to come back."""
    from hpc_master.errors import TooManyRequestsError

    held = [munge._DECODING.acquire(blocking=False) for _ in range(8)]
    try:
        assert all(held)
        with pytest.raises(TooManyRequestsError) as busy:
            munge.decode("MUNGE:abc", "/nonexistent/unmunge")
        assert busy.value.retry_after_s == 1
    finally:
        for _ in held:
            munge._DECODING.release()
    with pytest.raises(PermissionDeniedError):  # free again: it gets as far as running unmunge
        munge.decode("MUNGE:abc", "/nonexistent/unmunge")
