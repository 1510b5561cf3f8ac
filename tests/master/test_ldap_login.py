"""LDAP login against a real OpenLDAP server (``tests/ldap_server.py``: Debian's slapd, over ldaps:// and
StartTLS): search then bind, the Unix account the entry names, who gets a master user, refusals that say why
(and that reveal no names), a directory that is down or not trusted, and the configuration's checks. The web
UI's login with an LDAP password, in Chromium over HTTPS on the cluster: tests/e2e/test_munge_login.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.engine import Engine

from hpc_master import auth
from hpc_master.api.app import create_app
from hpc_master.db.engine import make_sessionmaker, transaction
from hpc_master.db.models import AuditEventModel, UserModel
from hpc_master.errors import ConfigError
from hpc_master.masterconf import parse_master_config
from tests.ldap_server import Person, Slapd

# Unix accounts of every Debian machine, so that the entries name accounts that exist on the master's host.
PEOPLE = [
    Person("daemon", "daemon-pw"),
    Person("bin", "bin-pw"),
    Person("lp", "lp-pw"),
    Person("lp", "lp-pw", ou="staff"),  # two entries for one name
    Person("no-such-account", "x-pw"),
]


@pytest.fixture(scope="module")
def slapd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slapd]:
    with Slapd(tmp_path_factory.mktemp("slapd"), PEOPLE) as server:
        yield server


def ldap_rules(server: Slapd, **rules: Any) -> dict[str, Any]:
    return {
        "enabled": True,
        "url": server.ldaps_url,
        "ca_file": server.ca_file,
        "base_dn": server.base_dn,
        "bind_dn": server.search_dn,
        "bind_password": server.search_password,
        "create_users": "everyone",
        **rules,
    }


def make_client(engine: Engine, **ldap: Any) -> TestClient:
    config = parse_master_config(
        {"db": {"url": engine.url.render_as_string(hide_password=False)}, "security": {"ldap": ldap}}, env={}
    )
    return TestClient(create_app(config, engine=engine))


def login(client: TestClient, name: str, password: str, **extra: Any) -> Any:
    return client.post("/api/v1/auth/login", json={"username": name, "password": password, **extra})


def users_named(engine: Engine, name: str) -> list[UserModel]:
    with transaction(make_sessionmaker(engine)) as s:
        return list(s.scalars(select(UserModel).where(UserModel.username == name)))


@pytest.mark.parametrize("how", ["ldaps, search account", "StartTLS, anonymous search"])
def test_a_directory_password_logs_in_the_unix_accounts_master_user(
    slapd: Slapd, engine: Engine, how: str
) -> None:
    rules = ldap_rules(slapd)
    if how.startswith("StartTLS"):
        rules |= {"url": slapd.ldap_url, "start_tls": True, "bind_dn": None, "bind_password": None}
    with make_client(engine, **rules) as client:
        assert users_named(engine, "daemon") == []
        r = login(client, "daemon", "daemon-pw")
        assert r.status_code == 200, r.text
        me = client.get("/api/v1/me", headers={"Authorization": f"Bearer {r.json()['token']}"})
        assert me.status_code == 200 and me.json()["user"]["username"] == "daemon", me.text
        [user] = users_named(engine, "daemon")
        assert (user.unix_username, user.admin, user.active) == ("daemon", False, True)
        assert login(client, "daemon", "daemon-pw").json()["user"]["id"] == user.id  # the same user again

        wrong = login(client, "daemon", "not-the-password")
        unknown = login(client, "nobody-in-the-directory", "daemon-pw")
        assert wrong.status_code == unknown.status_code == 401, (wrong.text, unknown.text)
        assert wrong.json()["message"] == unknown.json()["message"] == "invalid credentials"
        # The unknown name cost a bind too (refused), so the answer's time does not tell which names exist.
        assert f"uid=nobody-in-the-directory,{slapd.base_dn}" in slapd.binds()
        assert users_named(engine, "nobody-in-the-directory") == []


def test_names_are_not_filters_and_empty_passwords_are_not_binds(slapd: Slapd, engine: Engine) -> None:
    """``daem*`` would find daemon's entry if the name reached the filter unescaped; an empty password would
    be an anonymous ("unauthenticated") bind, which some servers accept."""
    with make_client(engine, **ldap_rules(slapd)) as client:
        for name, password in (("daem*", "daemon-pw"), ("*", "daemon-pw"), ("daemon)(uid=*", "daemon-pw"),
                               ("daemon", ""), ("lp", "lp-pw")):  # fmt: skip  # lp: two entries
            r = login(client, name, password)
            assert r.status_code == 401 and r.json()["message"] == "invalid credentials", (name, r.text)
        assert users_named(engine, "lp") == [] and users_named(engine, "daemon") == []


@pytest.mark.parametrize(
    ("rules", "created", "admin"),
    [
        ({"create_users": "nobody"}, False, None),
        ({"create_users": "groups", "user_groups": ["no-such-group"]}, False, None),
        ({"create_users": "groups", "user_groups": ["daemon"], "admin_group": "daemon"}, True, True),
        ({"admin_group": "bin"}, True, False),
    ],
)
def test_who_gets_a_master_user(
    slapd: Slapd, engine: Engine, rules: dict[str, Any], created: bool, admin: bool | None
) -> None:
    with make_client(engine, **ldap_rules(slapd, **rules)) as client:
        r = login(client, "daemon", "daemon-pw")
        if not created:
            assert r.status_code == 403 and r.json()["code"] == "ldap_refused", r.text
            assert "creates none" in r.json()["message"], r.text
            assert users_named(engine, "daemon") == []
            return
        assert r.status_code == 200, r.text
        assert r.json()["user"]["admin"] is admin
    with transaction(make_sessionmaker(engine)) as s:  # the audit log says who made the user, and why admin
        made = {
            (e.actor, e.action)
            for e in s.scalars(select(AuditEventModel).where(AuditEventModel.owner == "daemon"))
        }
    assert ("ldap", "LDAP login: first login creates the user") in made, made
    assert any("admin set" in action for _, action in made) is bool(admin), made


def test_refusals_say_why_and_leave_nothing(slapd: Slapd, engine: Engine) -> None:
    sessions = make_sessionmaker(engine)
    with transaction(sessions) as s:  # bin's master user exists and is deactivated
        s.add(UserModel(username="bin", password_hash=auth.hash_password("local-pw"), admin=False,
                        active=False, unix_username="bin"))  # fmt: skip
        s.add(UserModel(username="local", password_hash=auth.hash_password("local-pw"), admin=False,
                        active=True, unix_username="daemon"))  # fmt: skip
    with make_client(engine, **ldap_rules(slapd)) as client:
        r = login(client, "no-such-account", "x-pw")
        assert r.status_code == 403 and "no Unix account" in r.json()["message"], r.text
        assert users_named(engine, "no-such-account") == []
        r = login(client, "bin", "bin-pw")
        assert r.status_code == 403 and "deactivated" in r.json()["message"], r.text
        # The master user mapped to daemon is "local": daemon's directory password logs in as it.
        r = login(client, "daemon", "daemon-pw")
        assert r.status_code == 200 and r.json()["user"]["username"] == "local", r.text
        assert login(client, "local", "local-pw").status_code == 200  # local passwords still work
        # Determined's own client sends a hash of the password, which no directory can check.
        r = login(client, "daemon", auth.determined_hash("daemon-pw"), isHashed=True)
        assert r.status_code == 403 and "daemon" not in r.text, r.text


def test_a_directory_that_cannot_answer_is_503_and_names_it(
    slapd: Slapd, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    cases = {
        "the certificate is not trusted": ldap_rules(slapd, ca_file=None),
        "the search account is refused": ldap_rules(slapd, bind_password="wrong-search-pw"),
        "the base does not exist": ldap_rules(slapd, base_dn="dc=nowhere,dc=org"),
        "nothing listens": ldap_rules(slapd, url="ldaps://127.0.0.1:1", timeout_s=2),
    }
    for case, rules in cases.items():
        with make_client(engine, **rules) as client:
            r = login(client, "daemon", "daemon-pw")
            assert r.status_code == 503 and r.json()["code"] == "ldap_unavailable", (case, r.text)
            assert rules["url"] in r.json()["message"], (case, r.text)
    assert users_named(engine, "daemon") == []
    assert "daemon-pw" not in caplog.text and "wrong-search-pw" not in caplog.text


def test_the_master_refuses_a_configuration_that_would_leak_or_cannot_work(tmp_path: Path) -> None:
    base = {"enabled": True, "url": "ldaps://ldap.example.org", "base_dn": "dc=example,dc=org"}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"url": "ldap://ldap.example.org"}, "start_tls"),
        ({"url": "http://ldap.example.org"}, "ldaps://"),
        ({"base_dn": ""}, "base_dn"),
        ({"user_filter": "(uid=*)"}, "{username}"),
        ({"bind_dn": "cn=search,dc=example,dc=org"}, "bind_password"),
        ({"bind_passwd": "x"}, "bind_password"),  # the closest valid key
    ]
    for change, says in cases:
        with pytest.raises(ConfigError) as bad:
            parse_master_config({"security": {"ldap": base | change}}, env={})
        assert says in str(bad.value), (change, str(bad.value))
    for fine in ({"url": "ldap://ldap.example.org", "start_tls": True}, {"url": "ldap://127.0.0.1:3890"},
                 {"enabled": False, "url": "", "base_dn": ""}):  # fmt: skip
        parse_master_config({"security": {"ldap": base | fine}}, env={})
    secret = parse_master_config(
        {"security": {"ldap": base | {"bind_dn": "cn=s"}}}, env={"DET_LDAP_BIND_PASSWORD": "from-env"}
    )
    assert secret.security.ldap.bind_password == "from-env" and "from-env" not in repr(secret)


def test_a_master_without_ldap_tries_no_directory(slapd: Slapd, engine: Engine) -> None:
    with make_client(engine, **ldap_rules(slapd)) as client:
        assert client.get("/api/v1/master").json()["loginMethods"] == ["password", "ldap"]
    with make_client(engine, enabled=False) as client:
        assert client.get("/api/v1/master").json()["loginMethods"] == ["password"]
        assert login(client, "daemon", "daemon-pw").status_code == 401
    assert users_named(engine, "daemon") == []
