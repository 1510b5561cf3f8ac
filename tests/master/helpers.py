"""Small helpers shared by the master tests."""

from __future__ import annotations

import base64
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import Base

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
    r = client.post("/api/v1/auth/login", json={"username": username, "password": password})
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
