"""The attacks of issue 18 tried against the real app, on SQLite and PostgreSQL: each failed before its fix."""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from hpc_master import owner_key
from hpc_master.db.engine import make_engine, transaction
from hpc_master.db.models import TrialModel, TrialRunModel
from hpc_master.masterconf import parse_master_config
from hpc_master.services import lifecycle
from hpc_master.services.checkpoints.remover import CheckpointRemover

from .helpers import CONFIG, create_experiment, login, make_user


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def trial_with_run(sessions: sessionmaker[Session], exp_id: int, request_id: str = "r1") -> tuple[int, str]:
    """A trial of the experiment with a started run 1: (trial id, its harness's per-trial token)."""
    with transaction(sessions) as s:
        trial = lifecycle.create_trial(s, exp_id, request_id, {"lr": 0.1})
        run = lifecycle.allocate_trial_run(s, trial.id)
        lifecycle.start_trial_run(s, run.id, f"77{trial.id}")
        return trial.id, lifecycle.mint_trial_token(s, trial.id)


def register_checkpoint(client: TestClient, token: str, trial_id: int, ckpt_uuid: str) -> int:
    body = {"checkpoint": {"uuid": ckpt_uuid, "trialId": trial_id, "trialRunId": 1, "metadata": {}}}
    return client.post("/api/v1/checkpoints", headers=bearer(token), json=body).status_code


# ---------------------------------------------------------------- 1. checkpoint uuids name no paths


def test_a_checkpoint_uuid_that_is_a_path_is_refused_where_it_enters(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    admin = login(client)
    victim = str(uuid.uuid4())
    trial_id, token = trial_with_run(sessions, create_experiment(client, admin))
    for bad in (f"x/../{victim}", "../etc", victim.upper(), "a" * 36, victim + "/"):
        body = {"checkpoint": {"uuid": bad, "trialId": trial_id, "trialRunId": 1}}
        r = client.post("/api/v1/checkpoints", headers=bearer(token), json=body)
        assert r.status_code == 400 and r.json()["field"] == "checkpoint.uuid", (bad, r.text)
    r = client.request(
        "DELETE", "/api/v1/checkpoints", headers=admin, json={"checkpointUuids": [f"x/../{victim}"]}
    )
    assert r.status_code == 400 and r.json()["field"].startswith("checkpointUuids")


def test_deleting_a_checkpoint_removes_only_the_directory_the_database_records(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    admin = login(client)
    alice, bob = make_user(client, admin, "alice"), make_user(client, admin, "bob")
    # Removed by the master's own account: which account removes is test_checkpoint_gc's subject.
    client.app.state.det.checkpoint_remover = CheckpointRemover(as_owner=False)  # type: ignore[attr-defined]
    root = Path(os.environ["DET_CHECKPOINT_ROOT"])
    elsewhere = tmp_path / "team-storage"
    own_storage = CONFIG + f"checkpoint_storage: {{type: shared_fs, host_path: {elsewhere}}}\n"
    alice_trial, alice_token = trial_with_run(sessions, create_experiment(client, alice))
    bob_trial, bob_token = trial_with_run(sessions, create_experiment(client, bob, own_storage), "r2")
    alice_ckpt, bob_ckpt, link_ckpt = (str(uuid.uuid4()) for _ in range(3))
    (root / alice_ckpt).mkdir(parents=True)
    (root / alice_ckpt / "model.pt").write_bytes(b"alice's weights")
    (elsewhere / bob_ckpt).mkdir(parents=True)
    (elsewhere / bob_ckpt / "model.pt").write_bytes(b"bob's weights")
    (elsewhere / link_ckpt).symlink_to(root / alice_ckpt)  # a link in place of a checkpoint: never followed
    assert register_checkpoint(client, alice_token, alice_trial, alice_ckpt) == 200
    for ckpt in (bob_ckpt, link_ckpt):
        assert register_checkpoint(client, bob_token, bob_trial, ckpt) == 200
    # Bob can neither register nor delete alice's checkpoint.
    assert register_checkpoint(client, bob_token, bob_trial, alice_ckpt) == 409
    r = client.request("DELETE", "/api/v1/checkpoints", headers=bob, json={"checkpointUuids": [alice_ckpt]})
    assert r.status_code == 403
    with transaction(sessions) as s:  # ended: its latest checkpoint may go too
        s.execute(update(TrialModel).where(TrialModel.id == bob_trial).values(state="CANCELED"))
    r = client.request(
        "DELETE", "/api/v1/checkpoints", headers=bob, json={"checkpointUuids": [bob_ckpt, link_ckpt]}
    )
    assert r.status_code == 200, r.text
    assert not (elsewhere / bob_ckpt).exists()  # from the experiment's own storage, not the master's root
    assert not (elsewhere / link_ckpt).is_symlink()
    assert (root / alice_ckpt / "model.pt").read_bytes() == b"alice's weights"


# ---------------------------------------------------------------- 4. reads never write


@pytest.mark.parametrize("who", ["owner", "other user", "admin"])
def test_only_the_trials_own_token_hears_of_its_stop(
    client: TestClient, sessions: sessionmaker[Session], who: str
) -> None:
    admin = login(client)
    alice = make_user(client, admin, "alice")
    caller = {"owner": alice, "other user": make_user(client, admin, "mallory"), "admin": admin}[who]
    trial_id, token = trial_with_run(sessions, create_experiment(client, alice))
    with transaction(sessions) as s:
        run = lifecycle.live_run_of(s, trial_id)
        assert run is not None
        lifecycle.request_preemption(s, run.id)
    poll = f"/api/v1/allocations/{trial_id}.1/signals/preemption?timeoutSeconds=0"
    assert client.get(poll, headers=caller).json() == {"preempt": True}
    op = client.get(f"/api/v1/trials/{trial_id}/searcher/operation?timeoutSeconds=0", headers=caller)
    assert op.status_code == 200
    ack = client.post(f"/api/v1/allocations/{trial_id}.1/signals/ack_preemption", headers=caller, json={})
    assert ack.status_code == 403
    with transaction(sessions) as s:
        run_row = s.scalar(select(TrialRunModel).where(TrialRunModel.trial_id == trial_id))
        assert run_row is not None and run_row.preempt_acked is False  # nobody's look told the job
    assert client.get(poll, headers=bearer(token)).json() == {"preempt": True}
    with transaction(sessions) as s:
        run_row = s.scalar(select(TrialRunModel).where(TrialRunModel.trial_id == trial_id))
        assert run_row is not None and run_row.preempt_acked is True


# ---------------------------------------------------------------- 7. a password change ends other sessions


@pytest.mark.storage  # session revocation queries
def test_a_password_change_ends_the_users_other_sessions(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    admin = login(client)
    first = make_user(client, admin, "bob", "old")
    second = login(client, "bob", "old")
    me = client.get("/api/v1/me", headers=first).json()["user"]
    trial_id, trial_token = trial_with_run(sessions, create_experiment(client, first))
    r = client.patch(f"/api/v1/users/{me['id']}", headers=first, json={"password": "new"})
    assert r.status_code == 200
    assert client.get("/api/v1/me", headers=first).status_code == 200  # the session that changed it
    assert client.get("/api/v1/me", headers=second).status_code == 401
    progress = client.post(
        f"/api/v1/trials/{trial_id}/progress", headers=bearer(trial_token), json={"progress": 0.5}
    )
    assert progress.status_code == 200  # running jobs keep reporting
    # An admin's reset ends every session of the user.
    assert (
        client.patch(f"/api/v1/users/{me['id']}", headers=admin, json={"password": "reset"}).status_code
        == 200
    )
    assert client.get("/api/v1/me", headers=first).status_code == 401
    assert client.get("/api/v1/me", headers=login(client, "bob", "reset")).status_code == 200


# ---------------------------------------------------------------- 8. a personal master accepts only its owner


def test_a_blank_password_needs_the_owner_key(client: TestClient) -> None:
    port = client.app.state.det.config.listen.port  # type: ignore[attr-defined]
    key_file = owner_key.paths.get_owner_key_file(port)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    for user in ("admin", "determined"):
        for body in ({}, {"ownerKey": "guess"}, {"ownerKey": ""}):
            r = client.post("/api/v1/auth/login", json={"username": user, "password": "", **body})
            assert r.status_code == 401 and "owner" in r.json()["message"], r.text
    assert login(client, "determined")  # with the key from the owner's file
    # A user with a password (one the owner made) needs no key.
    make_user(client, login(client), "carol", "carol-pw")
    assert (
        client.post("/api/v1/auth/login", json={"username": "carol", "password": "carol-pw"}).status_code
        == 200
    )


def test_a_master_that_requires_passwords_writes_no_owner_key(engine: object, tmp_path: Path) -> None:
    from hpc_master.api.app import create_app

    url = engine.url.render_as_string(hide_password=False)  # type: ignore[attr-defined]
    config = parse_master_config(
        {"db": {"url": url}, "listen": {"port": 18555}, "security": {"require_passwords": True}},
        env={"DET_ADMIN_PASSWORD": "admin-pw"},
    )
    with TestClient(create_app(config, engine=engine)) as c:  # type: ignore[arg-type]
        assert c.app.state.det.owner_key_digest is None  # type: ignore[attr-defined]
        assert not owner_key.paths.get_owner_key_file(18555).exists()
        body = {"username": "admin", "password": "", "ownerKey": "anything"}
        assert c.post("/api/v1/auth/login", json=body).status_code == 401


def test_a_personal_masters_tokens_die_with_it_and_a_shared_masters_do_not(
    client: TestClient, sessions: sessionmaker[Session], engine: object
) -> None:
    """A token captured while a personal master was down (its port squatted) is worth nothing once the owner
    starts it again; its running jobs' per-trial tokens keep working. A shared master's sessions survive."""
    from hpc_master.api.app import create_app

    owner = login(client, "determined")
    carol = make_user(client, login(client), "carol", "carol-pw")
    trial_id, trial_token = trial_with_run(sessions, create_experiment(client, carol))
    personal = client.app.state.det.config  # type: ignore[attr-defined]
    with TestClient(create_app(personal, engine=engine)) as again:  # type: ignore[arg-type]
        assert again.get("/api/v1/me", headers=owner).status_code == 401
        assert again.get("/api/v1/me", headers=carol).status_code == 401
        r = again.post(
            f"/api/v1/trials/{trial_id}/progress", headers=bearer(trial_token), json={"progress": 0.5}
        )
        assert r.status_code == 200, r.text
        carol = login(again, "carol", "carol-pw")
    shared = personal.model_copy(
        update={"security": personal.security.model_copy(update={"require_passwords": True})}
    )
    with TestClient(create_app(shared, engine=engine)) as again:  # type: ignore[arg-type]
        assert again.get("/api/v1/me", headers=carol).status_code == 200


# ---------------------------------------------------------------- 9. someone stays admin


def test_the_last_admin_cannot_stop_being_one(client: TestClient) -> None:
    admin = login(client)
    admin_id = client.get("/api/v1/me", headers=admin).json()["user"]["id"]
    for change in ({"admin": False}, {"active": False}):
        r = client.patch(f"/api/v1/users/{admin_id}", headers=admin, json=change)
        assert r.status_code == 409 and "last active admin" in r.json()["message"]
    dana = make_user(client, admin, "dana")
    dana_id = client.get("/api/v1/me", headers=dana).json()["user"]["id"]
    assert client.patch(f"/api/v1/users/{dana_id}", headers=admin, json={"admin": True}).status_code == 200
    assert client.patch(f"/api/v1/users/{admin_id}", headers=admin, json={"admin": False}).status_code == 200
    me = client.get("/api/v1/me", headers=dana).json()["user"]
    assert me["admin"] is True


# ---------------------------------------------------------------- policy: secrets in configs, logs


SECRET_CONFIG = (
    CONFIG
    + """environment:
  environment_variables: ["WANDB_API_KEY=wandb-secret-1", "OMP_NUM_THREADS=4"]
data:
  hf_token: hf-secret-2
  max_tokens: 512
  s3: {secretAccessKey: aws-secret-3, bucket: datasets}
"""
)


def test_other_users_see_configs_with_secrets_masked(client: TestClient) -> None:
    admin = login(client)
    alice, bob = make_user(client, admin, "alice"), make_user(client, admin, "bob")
    exp_id = create_experiment(client, alice, SECRET_CONFIG)
    for viewer, masked in ((alice, False), (admin, False), (bob, True)):
        got = client.get(f"/api/v1/experiments/{exp_id}", headers=viewer).json()["experiment"]
        text = str(got["config"]) + got["originalConfig"]
        for secret in ("wandb-secret-1", "hf-secret-2", "aws-secret-3"):
            assert (secret in text) is not masked
        assert (
            got["config"]["data"]["max_tokens"] == 512 and got["config"]["data"]["s3"]["bucket"] == "datasets"
        )
        env = got["config"]["environment"]["environment_variables"]
        assert "OMP_NUM_THREADS=4" in str(env) if not masked else "OMP_NUM_THREADS=********" in str(env)


def test_trial_logs_are_the_owners_and_admins(client: TestClient, sessions: sessionmaker[Session]) -> None:
    admin = login(client)
    alice, bob = make_user(client, admin, "alice"), make_user(client, admin, "bob")
    trial_id, _ = trial_with_run(sessions, create_experiment(client, alice))
    assert client.get(f"/api/v1/trials/{trial_id}/logs", headers=bob).status_code == 403
    assert client.get(f"/api/v1/trials/{trial_id}/logs", headers=alice).status_code == 200
    assert client.get(f"/api/v1/trials/{trial_id}/logs", headers=admin).status_code == 200
    assert client.get(f"/api/v1/trials/{trial_id}", headers=bob).status_code == 200  # looking is allowed


# ---------------------------------------------------------------- policy: login throttling: test_login_throttle.py


# ---------------------------------------------------------------- policy: the database is private


def test_the_sqlite_database_and_its_wal_are_private(tmp_path: Path) -> None:
    from hpc_master.db.migrate import upgrade_to_head

    db = tmp_path / "state" / "master.db"
    engine = make_engine(f"sqlite:///{db}")
    upgrade_to_head(engine)
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
        files = sorted(p.name for p in db.parent.iterdir())
        assert {"master.db", "master.db-wal"} <= set(files)
        for name in files:
            assert stat.S_IMODE((db.parent / name).stat().st_mode) == 0o600, name
    engine.dispose()
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
