"""Passwords as Determined's own client sends them (``isHashed``: its client-side salted SHA-512) and as
hpc-det's ``det`` and web UI send them (plain), against one stored hash; the old stored form; bodies without a
``Content-Type`` (how Determined's client posts JSON). On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import secrets
from hashlib import scrypt

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from hpc_master import auth
from hpc_master.db.engine import transaction
from hpc_master.db.models import UserModel
from hpc_master.services.throttle import FREE_FAILURES
from tests.master.helpers import login, make_user

LOGIN = "/api/v1/auth/login"
PASSWORD = "Secret123pw"


def untyped(body: object) -> dict[str, object]:
    """A JSON body sent as Determined's client sends it: no ``Content-Type``."""
    return {"content": json.dumps(body).encode()}


def hashed_login(client: TestClient, username: str, password: str) -> tuple[int, dict[str, object]]:
    body = {"username": username, "password": auth.determined_hash(password), "isHashed": True}
    r = client.post(LOGIN, **untyped(body))  # type: ignore[arg-type]
    return r.status_code, r.json()


def stored_hash(sessions: sessionmaker[Session], username: str) -> str:
    with transaction(sessions) as s:
        return str(s.scalar(select(UserModel.password_hash).where(UserModel.username == username)))


def test_plain_and_hashed_logins_verify_the_same_stored_hash(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    make_user(client, login(client), "ann", PASSWORD)
    assert stored_hash(sessions, "ann").startswith("scrypt-dethash$")
    status, answer = hashed_login(client, "ann", PASSWORD)
    assert status == 200 and answer["user"]["username"] == "ann"  # type: ignore[index]
    assert login(client, "ann", PASSWORD)

    # Determined's client is answered 403 with the message (it shows a 403's message, not a 401's).
    status, answer = hashed_login(client, "ann", "Secret123pX")
    assert status == 403 and str(answer["message"]).startswith("invalid credentials")
    status, unknown = hashed_login(client, "nobody", PASSWORD)
    assert (status, unknown["message"]) == (403, answer["message"])  # the same for an unknown user
    plain = client.post(LOGIN, json={"username": "ann", "password": "Secret123pX"})
    assert (plain.status_code, plain.json()["message"]) == (401, "invalid credentials")


def test_an_old_form_hash_is_upgraded_by_a_plain_login(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    make_user(client, login(client), "bea", PASSWORD)
    salt = secrets.token_bytes(16)
    old = f"scrypt$16384$8$1${salt.hex()}${scrypt(PASSWORD.encode(), salt=salt, n=2**14, r=8, p=1).hex()}"
    with transaction(sessions) as s:
        user = s.scalar(select(UserModel).where(UserModel.username == "bea"))
        assert user is not None
        user.password_hash = old

    status, answer = hashed_login(client, "bea", PASSWORD)
    assert status == 403 and "log in once with hpc-det's `det user login` or the web UI" in str(
        answer["message"]
    )
    assert stored_hash(sessions, "bea") == old
    assert client.post(LOGIN, json={"username": "bea", "password": "wrong"}).status_code == 401
    assert stored_hash(sessions, "bea") == old  # a failed login changes nothing
    assert login(client, "bea", PASSWORD)
    upgraded = stored_hash(sessions, "bea")
    assert upgraded.startswith("scrypt-dethash$") and auth.verify_password(PASSWORD, upgraded)
    assert hashed_login(client, "bea", PASSWORD)[0] == 200
    assert login(client, "bea", PASSWORD)


def test_passwords_set_as_client_hashes(client: TestClient, sessions: sessionmaker[Session]) -> None:
    admin = login(client)
    body = {"user": {"username": "cid"}, "password": auth.determined_hash(PASSWORD), "isHashed": True}
    r = client.post("/api/v1/users", headers=admin, **untyped(body))  # type: ignore[arg-type]
    assert r.status_code == 200, r.text
    cid = login(client, "cid", PASSWORD)  # plain login against a password set as a client hash
    user_id = r.json()["user"]["id"]

    new = auth.determined_hash("Changed456pw")
    r = client.patch(f"/api/v1/users/{user_id}", headers=cid, **untyped({"password": new, "isHashed": True}))  # type: ignore[arg-type]
    assert r.status_code == 200, r.text
    assert hashed_login(client, "cid", "Changed456pw")[0] == 200
    assert login(client, "cid", "Changed456pw")
    assert hashed_login(client, "cid", PASSWORD)[0] == 403

    r = client.patch(
        f"/api/v1/users/{user_id}", headers=cid, json={"password": "not-a-hash", "isHashed": True}
    )
    assert r.status_code == 400 and r.json()["field"] == "password"
    # Determined's SetUserPassword: an admin sets a plain password (the body is the JSON string).
    r = client.post(f"/api/v1/users/{user_id}/password", headers=admin, json="Reset789pw")
    assert r.status_code == 200, r.text
    assert login(client, "cid", "Reset789pw")
    other = make_user(client, admin, "dan", PASSWORD)
    assert client.post(f"/api/v1/users/{user_id}/password", headers=other, json="x").status_code == 403


def test_a_blank_password_from_determineds_client_is_told_to_set_one(client: TestClient) -> None:
    for user in ("admin", "determined"):
        status, answer = hashed_login(client, user, "")
        assert status == 403 and "Determined's client cannot send it" in str(answer["message"])


def test_hashed_failures_are_throttled_too(client: TestClient) -> None:
    make_user(client, login(client), "eve", PASSWORD)
    codes = [hashed_login(client, "eve", "wrong")[0] for _ in range(FREE_FAILURES + 1)]
    assert codes == [403] * FREE_FAILURES + [429]
    assert hashed_login(client, "eve", PASSWORD)[0] == 429


def test_a_body_without_content_type_is_json_unless_cookies_come_with_it(client: TestClient) -> None:
    make_user(client, login(client), "fay", PASSWORD)
    body = untyped({"username": "fay", "password": PASSWORD})
    assert client.post(LOGIN, **body).status_code == 200  # type: ignore[arg-type]
    # Another declared type is still refused, and a browser's request (cookies) keeps the strict rule.
    typed = client.post(LOGIN, headers={"Content-Type": "text/plain"}, **body)  # type: ignore[arg-type]
    assert typed.status_code == 400
    with_cookie = client.post(LOGIN, headers={"Cookie": "a=b"}, **body)  # type: ignore[arg-type]
    assert with_cookie.status_code == 400
    # The anonymous body limit still holds.
    big = client.post(LOGIN, content=b'{"username": "' + b"x" * 70_000 + b'"}')
    assert big.status_code in (401, 413)
