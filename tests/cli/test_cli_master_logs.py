"""``det master logs`` (admins) and ``det version``, against a running master."""

from __future__ import annotations

import json
from collections.abc import Callable

import yaml

from .conftest import ADMIN, Det, Master

MakeUser = Callable[..., dict[str, str]]


def test_det_master_logs(det: Det, master: Master, make_user: MakeUser) -> None:
    plain = make_user("logs")
    r = det("master", "logs", env=ADMIN)
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert lines and all(" [" in line and "]: " in line for line in lines)
    assert any("[INFO]: " in line for line in lines)
    tail = det("master", "logs", "--tail", "2", env=ADMIN)
    assert tail.rc == 0 and len(tail.out.splitlines()) == 2
    assert any("alembic.runtime.migration: Running upgrade" in line for line in lines)  # its start-up
    assert tail.out.splitlines() == det("master", "logs", env=ADMIN).out.splitlines()[-2:]
    r = det("master", "logs", env=plain)
    assert r.rc == 1 and "only an admin can do this" in r.err
    assert det("master", "logs", "--tail", "0", env=ADMIN).rc == 1


def test_det_version(det: Det, master: Master) -> None:
    r = det("version", "--json")
    assert r.rc == 0, r.err
    got = json.loads(r.out)
    assert got["client"]["version"] and got["master"]["clusterId"] and got["master_address"] == master.url
    text = det("version")
    assert text.rc == 0 and yaml.safe_load(text.out) == got
    down = det("-m", "http://127.0.0.1:9", "version")
    assert down.rc == 0 and "Master not found" in down.err
    assert yaml.safe_load(down.out)["client"] == got["client"]
