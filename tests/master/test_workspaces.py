"""Determined's one default workspace and project (``services.workspaces``, ``routes_workspaces``), and the
config's ``workspace``/``project`` keys stored and shown on the experiment."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.services.users import mint_trial_token
from tests.master.helpers import CONFIG, create_experiment, login, make_user, seed_trial


def test_the_default_workspace_and_project(client: TestClient, sessions: sessionmaker[Session]) -> None:
    admin = login(client)
    alice, bob = make_user(client, admin, "alice"), make_user(client, admin, "bob")
    create_experiment(client, alice)
    create_experiment(client, alice)

    r = client.get("/api/v1/workspaces", headers=bob)
    assert r.status_code == 200, r.text
    (w,) = r.json()["workspaces"]
    assert (w["id"], w["name"], w["numProjects"], w["username"]) == (1, "Uncategorized", 1, "admin")
    assert w["numExperiments"] == 0  # bob's own: no counting of other users' experiments
    assert r.json()["pagination"]["total"] == 1
    assert client.get("/api/v1/workspaces/1", headers=alice).json()["workspace"]["numExperiments"] == 2
    assert client.get("/api/v1/workspaces?name=Uncategorized", headers=alice).json()["workspaces"]
    assert client.get("/api/v1/workspaces?name=team-a", headers=alice).json()["workspaces"] == []

    (p,) = client.get("/api/v1/workspaces/1/projects", headers=alice).json()["projects"]
    assert (p["id"], p["name"], p["workspaceId"], p["numExperiments"], p["numActiveExperiments"]) == (
        1, "Uncategorized", 1, 2, 2,
    )  # fmt: skip
    assert client.get("/api/v1/projects/1", headers=admin).json()["project"]["numExperiments"] == 2

    for path in ("/api/v1/workspaces/2", "/api/v1/projects/7", "/api/v1/workspaces/3/projects"):
        r = client.get(path, headers=alice)
        assert r.status_code == 404 and "this master has one" in r.json()["message"], path
        assert r.json()["code"] == "not_found"
    assert client.get("/api/v1/workspaces/0", headers=alice).status_code == 400  # ids are 1 or more
    assert client.get("/api/v1/workspaces?name=" + "x" * 300, headers=alice).status_code == 400

    for path in ("/api/v1/workspaces", "/api/v1/workspaces/1", "/api/v1/projects/1"):
        assert client.get(path).status_code == 401
    with sessions() as s, s.begin():
        trial_token = mint_trial_token(s, seed_trial(sessions, "carol"))
    r = client.get("/api/v1/workspaces", headers={"Authorization": f"Bearer {trial_token}"})
    assert r.status_code in (401, 403)


def test_config_workspace_and_project_are_stored_and_shown(client: TestClient) -> None:
    admin = login(client)
    alice = make_user(client, admin, "alice")
    plain = create_experiment(client, alice)
    named = create_experiment(client, alice, CONFIG + "workspace: vision\nproject: resnet-sweeps\n")
    got = client.get(f"/api/v1/experiments/{named}", headers=alice).json()["experiment"]
    assert (got["workspaceName"], got["projectName"], got["workspaceId"], got["projectId"]) == (
        "vision", "resnet-sweeps", 1, 1,
    )  # fmt: skip
    assert got["config"]["workspace"] == "vision" and got["config"]["project"] == "resnet-sweeps"
    got = client.get(f"/api/v1/experiments/{plain}", headers=alice).json()["experiment"]
    assert (got["workspaceName"], got["projectName"]) == ("Uncategorized", "Uncategorized")
    listed = {e["id"]: e for e in client.get("/api/v1/experiments", headers=alice).json()["experiments"]}
    assert listed[named]["projectName"] == "resnet-sweeps"
