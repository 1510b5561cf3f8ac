"""Determined 0.38.1's client and the one default workspace and project: ``det workspace list|describe``,
``det project list|describe``, ``det e list --show_project``, and the SDK's ``get_workspace``/``get_project``."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.determined_client.conftest import CONFIG, DeterminedClient, OurApi
from tests.determined_client.test_cli_and_sdk import PASSWORD, as_user

pytestmark = pytest.mark.determined_client


def test_workspace_and_project_commands(determined: DeterminedClient, our_api: OurApi) -> None:
    name = our_api.create_user("ws", PASSWORD)
    who = as_user(name)
    experiment_id = our_api.create_experiment(our_api.login(name, PASSWORD), f"ws-{name}")

    r = determined.det("workspace", "list", env=who)
    assert r.rc == 0, r.err
    assert "Uncategorized" in r.out
    r = determined.det("workspace", "describe", "Uncategorized", env=who)
    assert r.rc == 0 and "Uncategorized" in r.out, r.err
    r = determined.det("project", "list", "Uncategorized", env=who)
    assert r.rc == 0 and "Uncategorized" in r.out, r.err
    r = determined.det("project", "describe", "Uncategorized", "Uncategorized", env=who)
    assert r.rc == 0, r.err
    r = determined.det("workspace", "describe", "team-a", env=who)
    assert r.rc != 0 and "team-a" in r.err

    r = determined.det("e", "list", "--show_project", env=who)
    assert r.rc == 0, r.err
    row = next(line for line in r.out.splitlines() if f"ws-{name}" in line)
    assert [c.strip() for c in row.split("|")][:3] == ["Uncategorized", "Uncategorized", str(experiment_id)]


def test_sdk_workspace_project_and_a_config_s_names(determined: DeterminedClient, our_api: OurApi) -> None:
    name = our_api.create_user("wssdk", PASSWORD)
    headers = our_api.login(name, PASSWORD)
    config = CONFIG + "workspace: vision\nproject: resnet\n"
    import httpx

    body = {"config": config.replace("NAME", "named"), "modelDefinition": [], "activate": False}
    r = httpx.post(f"{determined.master.url}/api/v1/experiments", json=body, headers=headers)
    assert r.status_code == 200, r.text
    experiment_id = r.json()["experiment"]["id"]
    code = f"""
import json
from determined.experimental import client
client.login(master={determined.master.url!r}, user={name!r}, password={PASSWORD!r})
w = client.get_workspace("Uncategorized")
p = w.get_project("Uncategorized") if hasattr(w, "get_project") else None
e = client.get_experiment({experiment_id})
print(json.dumps({{"workspace": [w.id, w.name], "project": p and [p.id, p.name],
                  "config": [e.config.get("workspace"), e.config.get("project")]}}))
"""
    got = determined.sdk(code)
    assert got == {
        "workspace": [1, "Uncategorized"],
        "project": [1, "Uncategorized"],
        "config": ["vision", "resnet"],
    }


def test_master_config_and_logs_for_an_admin(determined: DeterminedClient, our_api: OurApi) -> None:
    import httpx

    name = f"root{uuid.uuid4().hex[:8]}"
    body = {"user": {"username": name, "admin": True}, "password": PASSWORD}
    r = httpx.post(f"{determined.master.url}/api/v1/users", json=body, headers=our_api.admin)
    assert r.status_code == 200, r.text
    admin = as_user(name)
    r = determined.det("master", "config", "--json", env=admin)
    assert r.rc == 0, r.err
    assert json.loads(r.out)["db"]["url"].startswith("sqlite:///")
    r = determined.det("master", "logs", "--tail", "3", env=admin)
    assert r.rc == 0, r.err
    assert len(r.out.splitlines()) == 3 and all(
        "[LOG_LEVEL_" in line or "[INFO" in line for line in r.out.splitlines()
    )
    plain = as_user(our_api.create_user("plain", PASSWORD))
    r = determined.det("master", "logs", env=plain)
    assert r.rc != 0 and "admin" in r.err
