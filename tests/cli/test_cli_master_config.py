"""``det master config``: the master's effective configuration (admins), YAML by default, ``--json``."""

from __future__ import annotations

import json
from collections.abc import Callable

import yaml

from .conftest import ADMIN, Det, Master

MakeUser = Callable[..., dict[str, str]]


def test_det_master_config(det: Det, master: Master, make_user: MakeUser) -> None:
    r = det("master", "config", env=ADMIN)
    assert r.rc == 0, r.err
    shown = yaml.safe_load(r.out)
    assert shown["db"]["url"] == master.db_url
    assert shown["job_storage_root"] == str(master.root / "jobs")
    assert shown["resource_pools"] == {"default": shown["resource_pools"]["default"]}
    for argv in (["--json"], ["-o", "json"]):
        r = det("master", "config", *argv, env=ADMIN)
        assert r.rc == 0 and json.loads(r.out) == shown
    assert yaml.safe_load(det("master", "config", "--yaml", env=ADMIN).out) == shown
    r = det("master", "config", env=make_user("plain"))
    assert r.rc == 1 and "only an admin can do this" in r.err
