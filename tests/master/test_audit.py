"""The audit log (issue 37): an admin's action on another user's experiment is recorded with the request, the
owner and the Unix account the master acts as; one's own actions and refused ones are not; user accounts
created and changed by an admin are; the log is append-only in the database itself; only admins read it."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, select, text, update
from sqlalchemy.exc import DatabaseError
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import AuditEventModel
from hpc_master.services.users import mint_trial_token

from .helpers import create_experiment, login, make_user, seed_trial


def _events(client: TestClient, headers: dict[str, str], **params: Any) -> list[dict[str, Any]]:
    r = client.get("/api/v1/audit", headers=headers, params=params)
    assert r.status_code == 200, r.text
    return list(r.json()["events"])


def test_an_admins_action_on_another_users_experiment_is_recorded_and_nothing_else(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    admin = login(client)
    alice, bob = make_user(client, admin, "alice"), make_user(client, admin, "bob")
    exp = create_experiment(client, alice)
    before = len(_events(client, admin))
    assert client.post(f"/api/v1/experiments/{exp}/pause", headers=alice).status_code == 200  # her own
    assert client.post(f"/api/v1/experiments/{exp}/activate", headers=bob).status_code == 403  # refused
    assert len(_events(client, admin)) == before

    assert client.post(f"/api/v1/experiments/{exp}/activate", headers=admin).status_code == 200
    (event,) = _events(client, admin, owner="alice")[:1]
    assert event["action"] == f"POST /api/v1/experiments/{exp}/activate", event
    assert (event["actor"], event["target"], event["owner"], event["asUnix"]) == (
        "admin", f"experiment {exp}", "alice", "alice",
    )  # fmt: skip
    assert _events(client, admin, actor="bob") == []


def test_user_accounts_made_and_changed_by_an_admin_are_recorded(client: TestClient) -> None:
    admin = login(client)
    carol = make_user(client, admin, "carol", "carol-pw")
    (made,) = [e for e in _events(client, admin, owner="carol") if e["action"] == "POST /api/v1/users"]
    assert made["actor"] == "admin" and made["detail"] == {"admin": False, "active": True}
    me = client.get("/api/v1/me", headers=carol).json()["user"]
    r = client.patch(f"/api/v1/users/{me['id']}", headers=admin, json={"admin": True})
    assert r.status_code == 200, r.text
    assert _events(client, admin, owner="carol")[0]["detail"] == {"admin": True}
    # Her own password: not an admin's action.
    count = len(_events(client, admin, owner="carol"))
    r = client.post(f"/api/v1/users/{me['id']}/password", headers=carol, json="carol-new-pw-1")
    assert r.status_code == 200, r.text
    assert len(_events(client, admin, owner="carol")) == count


@pytest.mark.storage
def test_the_log_is_append_only_in_the_database(client: TestClient, sessions: sessionmaker[Session]) -> None:
    admin = login(client)
    make_user(client, admin, "dave")
    for change in (update(AuditEventModel).values(actor="nobody"), delete(AuditEventModel)):
        with pytest.raises(DatabaseError, match="append-only"), transaction(sessions) as s:
            s.execute(change)
    with transaction(sessions) as s:
        assert s.scalar(select(AuditEventModel.actor).where(AuditEventModel.owner == "dave")) == "admin"
        assert s.execute(text("SELECT count(*) FROM audit_events")).scalar_one() >= 1


def test_only_admins_read_the_log(client: TestClient, sessions: sessionmaker[Session]) -> None:
    admin = login(client)
    erin = make_user(client, admin, "erin")
    trial_id = seed_trial(sessions, "frank")
    with transaction(sessions) as s:
        trial = {"Authorization": f"Bearer {mint_trial_token(s, trial_id)}"}
    assert client.get("/api/v1/audit").status_code == 401
    assert client.get("/api/v1/audit", headers=erin).status_code == 403
    assert client.get("/api/v1/audit", headers=trial).status_code in (401, 403)
    assert client.get("/api/v1/audit", headers=admin).status_code == 200
