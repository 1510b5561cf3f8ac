"""Small helpers shared by the master tests."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from hpc_master import auth, owner_key
from hpc_master.db.engine import transaction
from hpc_master.db.models import Base, SessionModel, UserModel, utcnow
from hpc_master.services import lifecycle
from hpc_master.services.access import Principal
from hpc_master.services.experiments import create_experiment as create_experiment_service

CONFIG = """\
name: mnist
entrypoint: python3 train.py
searcher:
  name: single
  metric: validation_loss
  smaller_is_better: true
  max_length:
    batches: 100
hyperparameters:
  lr: 0.1
"""


def login(client: TestClient, username: str = "admin", password: str = "") -> dict[str, str]:
    """Log in; a blank password goes with the owner key the app wrote, as the owner's CLI sends it."""
    body = {"username": username, "password": password}
    if password == "":
        body["ownerKey"] = owner_key.read(client.app.state.det.config.listen.port) or ""  # type: ignore[attr-defined]
    r = client.post("/api/v1/auth/login", json=body)
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def make_user(
    client: TestClient, admin_headers: dict[str, str], username: str, password: str = "pw"
) -> dict[str, str]:
    r = client.post(
        "/api/v1/users", headers=admin_headers, json={"user": {"username": username}, "password": password}
    )
    assert r.status_code == 200, r.text
    return login(client, username, password)


def context_file(path: str, content: bytes = b"print('hi')\n", type_: int = 48) -> dict[str, Any]:
    return {"path": path, "type": type_, "content": base64.b64encode(content).decode(), "mode": 0o644}


def create_experiment(client: TestClient, headers: dict[str, str], config: str = CONFIG, **extra: Any) -> int:
    body = {"config": config, "modelDefinition": [context_file("train.py")], "activate": True, **extra}
    r = client.post("/api/v1/experiments", headers=headers, json=body)
    assert r.status_code == 200, r.text
    return int(r.json()["experiment"]["id"])


def count(sessions: sessionmaker[Session], model: type[Base]) -> int:
    with transaction(sessions) as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


def seed_trial(sessions: sessionmaker[Session], username: str = "alice") -> int:
    """An active experiment of a new user, with one trial: the id of the trial."""
    with transaction(sessions) as s:
        user = UserModel(username=username, password_hash="", admin=False)
        s.add(user)
        s.flush()
        owner = Principal(user_id=user.id, username=username, admin=False)
        exp, _ = create_experiment_service(s, owner, config_text=CONFIG, model_definition=[], activate=True)
        assert exp is not None
        return lifecycle.create_trial(s, exp.id, "r1", {"lr": 0.1}).id


def admin_token(sessions: sessionmaker[Session]) -> str:
    """A session of ``admin``, made in the database (no login: how logins work is not under test there)."""
    token = auth.new_token()
    with transaction(sessions) as s:
        admin_id = s.scalar(select(UserModel.id).where(UserModel.username == "admin"))
        expires = utcnow() + dt.timedelta(hours=1)
        s.add(SessionModel(token_hash=auth.hash_token(token), user_id=admin_id, expires_at=expires))
    return token
