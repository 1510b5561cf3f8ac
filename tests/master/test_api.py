"""API tests against the real ASGI app, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, inspect, update
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.api import routes_allocations
from hpc_master.db.engine import transaction
from hpc_master.db.models import CheckpointModel, ExperimentModel, MetricModel, SessionModel, TrialModel
from hpc_master.masterconf import MasterConfig
from hpc_master.services import context, lifecycle, notify
from hpc_master.services.states import TerminationReason

from .helpers import CONFIG, context_file, count, create_experiment, login, make_user


def make_trial(sessions: sessionmaker[Session], exp_id: int, request_id: str = "r1") -> tuple[int, str]:
    with transaction(sessions) as s:
        trial = lifecycle.create_trial(s, exp_id, request_id, {"lr": 0.1})
        lifecycle.allocate_trial_run(s, trial.id)
        return trial.id, lifecycle.mint_trial_token(s, trial.id)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# ---------------------------------------------------------------- auth


def test_master_info_is_public(client: TestClient) -> None:
    body = client.get("/api/v1/master").json()
    assert {"version", "masterId", "clusterName"} <= body.keys()
    assert client.get("/docs").status_code == 200


def test_login_logout_and_bad_password(client: TestClient) -> None:
    headers = login(client)
    assert client.get("/api/v1/me", headers=headers).json()["user"]["username"] == "admin"
    r = client.post("/api/v1/auth/login", json={"username": "admin", "password": "wrong"})
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
    r = client.post("/api/v1/auth/login", json={"username": "nobody", "password": ""})
    assert r.status_code == 401
    assert client.post("/api/v1/auth/logout", headers=headers).json() == {}
    assert client.get("/api/v1/me", headers=headers).status_code == 401
    assert client.get("/api/v1/me").status_code == 401


def test_expired_token_is_refused(client: TestClient, sessions: sessionmaker[Session]) -> None:
    headers = login(client)
    with transaction(sessions) as s:
        s.execute(update(SessionModel).values(expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)))
    client.app.state.det.tokens.clear()  # type: ignore[attr-defined]
    r = client.get("/api/v1/me", headers=headers)
    assert r.status_code == 401 and "expired" in r.json()["message"]


def test_passwords_and_users(client: TestClient) -> None:
    admin = login(client)
    bob = make_user(client, admin, "bob", "secret")
    assert (
        client.post(
            "/api/v1/users", headers=bob, json={"user": {"username": "eve"}, "password": "x"}
        ).status_code
        == 403
    )
    me = client.get("/api/v1/me", headers=bob).json()["user"]
    assert me["unixUsername"] == "bob"
    assert client.patch(f"/api/v1/users/{me['id']}", headers=bob, json={"password": "new"}).status_code == 200
    assert client.patch(f"/api/v1/users/{me['id']}", headers=bob, json={"admin": True}).status_code == 403
    login(client, "bob", "new")
    users = client.get("/api/v1/users", headers=admin).json()["users"]
    assert {u["username"] for u in users} == {"admin", "determined", "bob"}
    r = client.post("/api/v1/users", headers=admin, json={"user": {"username": "bob"}, "password": "x"})
    assert r.status_code == 409


def test_per_trial_token_scope(client: TestClient, sessions: sessionmaker[Session]) -> None:
    admin = login(client)
    exp_id = create_experiment(client, admin)
    trial_a, token_a = make_trial(sessions, exp_id, "a")
    trial_b, _ = make_trial(sessions, exp_id, "b")
    item = {
        "trialRunId": 1,
        "stepsCompleted": 10,
        "group": "training",
        "metrics": {"avgMetrics": {"loss": 1}},
    }
    ok = client.post(
        f"/api/v1/trials/{trial_a}/metrics/batch", headers=bearer(token_a), json={"metrics": [item]}
    )
    assert ok.status_code == 200 and ok.json() == {"accepted": 1, "duplicates": 0}
    other = client.post(
        f"/api/v1/trials/{trial_b}/metrics/batch", headers=bearer(token_a), json={"metrics": [item]}
    )
    assert other.status_code == 403 and other.json()["code"] == "permission_denied"
    assert client.get("/api/v1/experiments", headers=bearer(token_a)).status_code == 403
    assert client.post(f"/api/v1/experiments/{exp_id}/pause", headers=bearer(token_a)).status_code == 403
    r = client.get(f"/api/v1/allocations/{trial_b}.1/signals/preemption", headers=bearer(token_a))
    assert r.status_code == 403
    r = client.get(
        f"/api/v1/allocations/{trial_a}.1/signals/preemption?timeoutSeconds=0", headers=bearer(token_a)
    )
    assert r.json() == {"preempt": False}


# ---------------------------------------------------------------- authorization


def test_user_cannot_change_another_users_experiment(client: TestClient) -> None:
    admin = login(client)
    alice = make_user(client, admin, "alice")
    bob = make_user(client, admin, "bob")
    exp_id = create_experiment(client, alice)
    assert client.get(f"/api/v1/experiments/{exp_id}", headers=bob).status_code == 200
    r = client.post(f"/api/v1/experiments/{exp_id}/pause", headers=bob)
    assert r.status_code == 403 and r.json()["code"] == "permission_denied" and r.json()["message"]
    assert client.delete(f"/api/v1/experiments/{exp_id}", headers=bob).status_code == 403
    assert client.post(f"/api/v1/experiments/{exp_id}/pause", headers=alice).status_code == 200
    assert client.post(f"/api/v1/experiments/{exp_id}/activate", headers=admin).status_code == 200
    state = client.get(f"/api/v1/experiments/{exp_id}", headers=bob).json()["experiment"]["state"]
    assert state == "STATE_ACTIVE"


@pytest.mark.storage  # listing queries, idempotent ingest, a commit waking a long poll, large objects
def test_experiment_actions_and_listing(client: TestClient) -> None:
    admin = login(client)
    alice = make_user(client, admin, "alice")
    first = create_experiment(client, alice)
    second = create_experiment(client, admin, activate=False)
    listed = client.get("/api/v1/experiments?users=alice", headers=admin).json()
    assert [e["id"] for e in listed["experiments"]] == [first] and listed["pagination"]["total"] == 1
    paused = client.get("/api/v1/experiments?states=STATE_PAUSED", headers=admin).json()["experiments"]
    assert [e["id"] for e in paused] == [second]
    assert client.post(f"/api/v1/experiments/{first}/archive", headers=alice).status_code == 409
    assert client.post(f"/api/v1/experiments/{first}/cancel", headers=alice).status_code == 200
    assert client.post(f"/api/v1/experiments/{first}/archive", headers=alice).status_code == 200
    archived = client.get("/api/v1/experiments?archived=true", headers=admin).json()["experiments"]
    assert [e["id"] for e in archived] == [first]
    page = client.get("/api/v1/experiments?limit=1&offset=1", headers=admin).json()
    assert [e["id"] for e in page["experiments"]] == [second]
    assert client.delete(f"/api/v1/experiments/{first}", headers=alice).status_code == 200
    assert client.get(f"/api/v1/experiments/{first}", headers=alice).status_code == 404


# ---------------------------------------------------------------- bad input leaves nothing behind


def test_bad_experiment_input(client: TestClient, sessions: sessionmaker[Session]) -> None:
    admin = login(client)
    cases = [
        ({"config": "name: [unclosed\n"}, 400, "config"),
        ({"config": "- just\n- a list\n"}, 400, "config"),
        ({"config": CONFIG + "not_a_field: 1\n"}, 400, None),
        ({"config": CONFIG, "modelDefinition": [context_file("../evil.py")]}, 400, "modelDefinition[0].path"),
        (
            {"config": CONFIG, "modelDefinition": [context_file("/etc/passwd")]},
            400,
            "modelDefinition[0].path",
        ),
        ({"config": CONFIG, "modelDefinition": [context_file("a/../../x")]}, 400, "modelDefinition[0].path"),
        (
            {"config": CONFIG, "modelDefinition": [context_file("link", type_=50)]},
            400,
            "modelDefinition[0].type",
        ),
        (
            {"config": CONFIG, "modelDefinition": [{"path": "x", "content": "***"}]},
            400,
            "modelDefinition[0].content",
        ),
        ({"modelDefinition": []}, 400, "config"),
    ]
    for body, status, field in cases:
        r = client.post("/api/v1/experiments", headers=admin, json=body)
        assert r.status_code == status, (body, r.text)
        payload = r.json()
        assert payload["code"] and payload["message"], payload
        if field is not None:
            assert payload["field"] == field, payload
    assert count(sessions, ExperimentModel) == 0


def test_oversize_context_is_413(
    client: TestClient, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = login(client)
    monkeypatch.setattr(context, "MAX_CONTEXT_BYTES", 1024)
    big = [context_file("a.bin", b"x" * 800), context_file("b.bin", b"y" * 800)]
    r = client.post("/api/v1/experiments", headers=admin, json={"config": CONFIG, "modelDefinition": big})
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
    assert count(sessions, ExperimentModel) == 0


@pytest.mark.storage  # listing queries, idempotent ingest, a commit waking a long poll, large objects
def test_context_is_stored_packed(client: TestClient, sessions: sessionmaker[Session]) -> None:
    admin = login(client)
    files = [context_file("train.py"), {"path": "pkg", "type": 53, "content": ""}, context_file("pkg/m.py")]
    r = client.post("/api/v1/experiments", headers=admin, json={"config": CONFIG, "modelDefinition": files})
    exp_id = r.json()["experiment"]["id"]
    with transaction(sessions) as s:
        exp = s.get(ExperimentModel, exp_id)
        assert exp is not None
        # Not read with the row (it can be 95 MB, and experiments are read everywhere): loaded when asked for.
        assert {"context_archive", "searcher_snapshot"}.isdisjoint(inspect(exp).dict)
        archive = exp.context_archive
    assert archive is not None and sorted(context.unpack_context_listing(archive)) == [
        "pkg",
        "pkg/m.py",
        "train.py",
    ]


# ---------------------------------------------------------------- harness routes


@pytest.mark.storage  # listing queries, idempotent ingest, a commit waking a long poll, large objects
def test_metrics_batch_is_idempotent(client: TestClient, sessions: sessionmaker[Session]) -> None:
    admin = login(client)
    trial_id, token = make_trial(sessions, create_experiment(client, admin))
    batch = {
        "metrics": [
            {
                "trialRunId": 1,
                "stepsCompleted": s,
                "group": "training",
                "metrics": {"avgMetrics": {"loss": 1 / s}},
            }
            for s in range(1, 101)
        ]
    }
    url = f"/api/v1/trials/{trial_id}/metrics/batch"
    assert client.post(url, headers=bearer(token), json=batch).json() == {"accepted": 100, "duplicates": 0}
    assert client.post(url, headers=bearer(token), json=batch).json() == {"accepted": 0, "duplicates": 100}
    assert count(sessions, MetricModel) == 100
    single = {
        "metrics": {"trialRunId": 1, "stepsCompleted": 100, "metrics": {"avgMetrics": {"vl": 0.5}}},
        "group": "validation",
    }
    assert client.post(f"/api/v1/trials/{trial_id}/metrics", headers=bearer(token), json=single).json() == {}
    got = client.get(f"/api/v1/trials/{trial_id}/metrics?group=validation", headers=admin).json()["metrics"]
    assert [(m["stepsCompleted"], m["group"]) for m in got] == [(100, "validation")]
    training = client.get(f"/api/v1/trials/{trial_id}/metrics/training_metrics", headers=admin).json()[
        "metrics"
    ]
    assert len(training) == 100
    bad = client.post(url, headers=bearer(token), json={"metrics": [{"stepsCompleted": -1}]})
    assert bad.status_code == 400 and bad.json()["field"]


def ckpt_uuid(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_OID, name))


@pytest.mark.storage  # listing queries, idempotent ingest, a commit waking a long poll, large objects
def test_checkpoints_listed_best_first(client: TestClient, sessions: sessionmaker[Session]) -> None:
    admin = login(client)
    exp_id = create_experiment(client, admin)
    losses = {"a": 0.3, "b": 0.1, "c": 0.2}
    trial_ids = {}
    for request_id, loss in losses.items():
        trial_id, token = make_trial(sessions, exp_id, request_id)
        trial_ids[request_id] = trial_id
        item = {"trialRunId": 1, "stepsCompleted": 100, "metrics": {"avgMetrics": {"validation_loss": loss}}}
        client.post(
            f"/api/v1/trials/{trial_id}/metrics",
            headers=bearer(token),
            json={"metrics": item, "group": "validation"},
        )
        ckpt = {
            "uuid": ckpt_uuid(request_id),
            "trialId": trial_id,
            "trialRunId": 1,
            "resources": {"model.pt": 10},
            "metadata": {"steps_completed": 100},
        }
        for _ in range(2):  # idempotent on uuid
            r = client.post("/api/v1/checkpoints", headers=bearer(token), json={"checkpoint": ckpt})
            assert r.status_code == 200, r.text
    assert count(sessions, CheckpointModel) == 3
    best = client.get(f"/api/v1/experiments/{exp_id}/checkpoints?limit=2", headers=admin).json()[
        "checkpoints"
    ]
    assert [c["uuid"] for c in best] == [ckpt_uuid("b"), ckpt_uuid("c")]
    assert best[0]["training"]["searcherMetric"] == 0.1
    worst = client.get(
        f"/api/v1/experiments/{exp_id}/checkpoints?orderBy=ORDER_BY_DESC&sortByMetric=validation_loss&limit=1",
        headers=admin,
    ).json()["checkpoints"]
    assert [c["uuid"] for c in worst] == [ckpt_uuid("a")]
    got = client.get(f"/api/v1/checkpoints/{ckpt_uuid('b')}", headers=admin).json()["checkpoint"]
    assert got["state"] == "STATE_COMPLETED" and got["metadata"]["steps_completed"] == 100
    with transaction(sessions) as s:
        assert s.get(TrialModel, got["training"]["trialId"]).latest_checkpoint == ckpt_uuid("b")  # type: ignore[union-attr]
        # An ended trial's latest checkpoint may be deleted (a trial that can still run resumes from it).
        s.execute(update(TrialModel).where(TrialModel.id == trial_ids["a"]).values(state="COMPLETED"))
    assert (
        client.request(
            "DELETE", "/api/v1/checkpoints", headers=admin, json={"checkpointUuids": [ckpt_uuid("a")]}
        ).json()
        == {}
    )
    assert (
        client.get(f"/api/v1/checkpoints/{ckpt_uuid('a')}", headers=admin).json()["checkpoint"]["state"]
        == "STATE_DELETED"
    )


def test_a_completion_whose_next_operation_is_undecided_comes_back_without_one(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    admin = login(client)
    exp_id = create_experiment(client, admin)
    trial_id, token = make_trial(sessions, exp_id)
    with transaction(sessions) as s:
        lifecycle.set_searcher_operation(s, trial_id, 50)  # a first rung; the searcher decides after it
    body = {"op": {"validateAfter": {"length": 50}}, "searcherMetric": 0.3}
    url = f"/api/v1/trials/{trial_id}/searcher/completed_operation"
    assert client.post(url, headers=bearer(token), json=body).json() == {}  # the harness asks (a long poll)
    pending = {"op": None, "completed": False, "pending": True}
    got = client.get(f"/api/v1/trials/{trial_id}/searcher/operation?timeoutSeconds=0", headers=bearer(token))
    assert got.json() == pending


def test_harness_signals_and_searcher(client: TestClient, sessions: sessionmaker[Session]) -> None:
    admin = login(client)
    exp_id = create_experiment(client, admin)
    trial_id, token = make_trial(sessions, exp_id)
    h = bearer(token)
    assert client.get(f"/api/v1/trials/{trial_id}/searcher/operation", headers=h).json() == {
        "op": None,
        "completed": False,
    }
    with transaction(sessions) as s:
        lifecycle.set_searcher_operation(s, trial_id, 50)  # a first rung (max_length is 100)
        run = lifecycle.live_run_of(s, trial_id)
        assert run is not None
        lifecycle.request_preemption(s, run.id)
    op = client.get(f"/api/v1/trials/{trial_id}/searcher/operation", headers=h).json()
    assert op == {"op": {"validateAfter": {"length": 50}}, "completed": False}
    body = {"op": {"validateAfter": {"length": 50}}, "searcherMetric": 0.25}
    # The run is being stopped, so the next operation's answer is known: it comes with the completion.
    assert client.post(
        f"/api/v1/trials/{trial_id}/searcher/completed_operation", headers=h, json=body
    ).json() == {"next": {"op": None, "completed": False}}
    best = client.get(f"/api/v1/experiments/{exp_id}/searcher/best_searcher_validation_metric", headers=h)
    assert best.json() == {"metric": 0.25}
    # The completed operation is never handed out again. Its run was asked to stop above (a pause): no
    # operation, so the script's operations() ends and the job exits to be paused.
    url = f"/api/v1/trials/{trial_id}/searcher/operation"
    assert client.get(url, headers=h).json() == {"op": None, "completed": False}
    with transaction(sessions) as s:
        run = lifecycle.live_run_of(s, trial_id)
        assert run is not None
        run.preempt_requested = False
    # Not stopping: wait for the searcher's decision, before and after it has seen the completion ("pending"
    # after the long poll; no lifecycle loop runs here). ASHA may still promote the trial.
    pending = {"op": None, "completed": False, "pending": True}
    assert client.get(f"{url}?timeoutSeconds=0", headers=h).json() == pending
    with transaction(sessions) as s:
        assert [c.length for c in lifecycle.take_searcher_op_completions(s)] == [50]
    assert client.get(f"{url}?timeoutSeconds=0", headers=h).json() == pending

    def promote() -> None:  # what the lifecycle loop does: a searcher pass gives the trial a longer op
        time.sleep(0.3)
        with transaction(sessions) as s:
            lifecycle.set_searcher_operation(s, trial_id, 100)
        notify.searchers_driven()

    promoter = threading.Thread(target=promote)
    promoter.start()
    # The long poll re-reads after the pass and answers with the new operation, not "pending".
    got = client.get(f"{url}?timeoutSeconds=30", headers=h).json()
    promoter.join()
    assert got == {"op": {"validateAfter": {"length": 100}}, "completed": False}
    # An operation of max_length is the trial's last: once completed, the answer is "done" at once, before
    # any searcher pass (none runs here), so the job ends without waiting for the lifecycle loop.
    body = {"op": {"validateAfter": {"length": 100}}, "searcherMetric": 0.2}
    assert client.post(
        f"/api/v1/trials/{trial_id}/searcher/completed_operation", headers=h, json=body
    ).json() == {"next": {"op": None, "completed": True}}
    assert client.get(f"{url}?timeoutSeconds=0", headers=h).json() == {"op": None, "completed": True}
    with transaction(sessions) as s:
        lifecycle.request_preemption(s, run.id)
    assert client.get(
        f"/api/v1/allocations/{trial_id}.1/signals/preemption?timeoutSeconds=5", headers=h
    ).json() == {"preempt": True}
    assert (
        client.post(f"/api/v1/allocations/{trial_id}.1/signals/ack_preemption", headers=h, json={}).json()
        == {}
    )
    assert client.post(f"/api/v1/trials/{trial_id}/progress", headers=h, json={"progress": 0.5}).json() == {}
    assert (
        client.post(f"/api/v1/trials/{trial_id}/progress", headers=h, json={"progress": 2}).status_code == 400
    )
    r = client.post(
        f"/api/v1/trials/{trial_id}/runner/metadata", headers=h, json={"metadata": {"state": "training"}}
    )
    assert r.json() == {}
    r = client.post(
        f"/api/v1/trials/{trial_id}/early_exit",
        headers=h,
        json={"earlyExit": {"reason": "EXITED_REASON_INVALID_HP"}},
    )
    assert r.json() == {}
    trial = client.get(f"/api/v1/trials/{trial_id}", headers=admin).json()["trial"]
    assert (
        trial["progress"] == 0.5
        and trial["runnerState"] == "training"
        and trial["searcherMetricValue"] == 0.2
    )


# ---------------------------------------------------------------- logs


def test_a_preemption_poll_whose_job_went_away_stops_reading_the_database(
    client: TestClient,
    sessions: sessionmaker[Session],
    config: MasterConfig,
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job that ended leaves its last long poll open until its connection closes (a real server is needed
    to see that); the poll must not go on re-reading the database until its timeout."""
    import socket

    import uvicorn

    from hpc_master.api.app import create_app
    from hpc_master.services import harness

    monkeypatch.setattr(routes_allocations, "PREEMPTION_POLL_S", 0.1)
    reads: list[float] = []
    real_state = harness.preemption_state

    def counted(*args: Any, **kwargs: Any) -> bool:
        reads.append(time.monotonic())
        return real_state(*args, **kwargs)

    monkeypatch.setattr(harness, "preemption_state", counted)
    exp_id = create_experiment(client, login(client))
    trial_id, token = make_trial(sessions, exp_id)
    server = uvicorn.Server(uvicorn.Config(create_app(config, engine=engine), port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(
                f"GET /api/v1/allocations/{trial_id}.1/signals/preemption?timeoutSeconds=30 HTTP/1.1\r\n"
                f"Host: m\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
            )
            deadline = time.monotonic() + 10
            while len(reads) < 3:  # it polls while the job is there
                assert time.monotonic() < deadline, f"{len(reads)} reads in 10 s"
                time.sleep(0.05)
        # The job is gone (its process exited: the connection closed): the reads stop within a few polls, long
        # before the poll's 30 s timeout; a poll that went on would read every 0.1 s and never be quiet for 1 s.
        deadline = time.monotonic() + 10
        while not reads or time.monotonic() - reads[-1] < 1.0:
            assert time.monotonic() < deadline, "the poll went on reading after its connection closed"
            time.sleep(0.05)
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_stop_request_for_another_run_does_not_wake_a_preemption_poll(
    client: TestClient, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grid search stops each trial as it completes: that must not make every running trial's poll re-read."""
    from hpc_master.services import harness

    reads: list[int] = []
    real_state = harness.preemption_state

    def counted(session: Session, trial_id: int, run_number: int, *, deliver: bool) -> bool:
        reads.append(trial_id)
        return real_state(session, trial_id, run_number, deliver=deliver)

    monkeypatch.setattr(harness, "preemption_state", counted)
    admin = login(client)
    exp_id = create_experiment(client, admin)
    watched, token = make_trial(sessions, exp_id, "r1")
    other, _ = make_trial(sessions, exp_id, "r2")

    def stop_other() -> None:
        time.sleep(0.3)
        with transaction(sessions) as s:
            run = lifecycle.live_run_of(s, other)
            assert run is not None
            lifecycle.request_preemption(s, run.id)

    stopper = threading.Thread(target=stop_other)
    stopper.start()
    url = f"/api/v1/allocations/{watched}.1/signals/preemption?timeoutSeconds=1"
    assert client.get(url, headers=bearer(token)).json() == {"preempt": False}
    stopper.join()
    assert reads == [watched, watched]  # when asked, and at its timeout; not when the other run was stopped


@pytest.mark.storage  # listing queries, idempotent ingest, a commit waking a long poll, large objects
def test_preemption_long_poll_is_woken_by_a_committed_stop_request(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    """A waiting long poll answers when a stop request commits, from any session (the searcher's pause in
    the lifecycle loop, a user's pause through the API), not at its next re-read of the database; a request
    rolled back wakes nobody."""
    admin = login(client)
    exp_id = create_experiment(client, admin)
    trial_id, token = make_trial(sessions, exp_id)
    url = f"/api/v1/allocations/{trial_id}.1/signals/preemption?timeoutSeconds=30"

    before = notify.stop_requests()
    with pytest.raises(RuntimeError), transaction(sessions) as s:
        run = lifecycle.live_run_of(s, trial_id)
        assert run is not None
        run.preempt_requested = True
        s.flush()
        raise RuntimeError("rolled back")
    assert notify.stop_requests() == before

    def long_poll(stop: threading.Thread) -> tuple[dict[str, bool], float]:
        started = time.monotonic()
        stop.start()
        got = client.get(url, headers=bearer(token)).json()
        stop.join()
        return got, time.monotonic() - started

    def searcher_pause() -> None:  # what the lifecycle loop's searcher pass does, in its own session
        time.sleep(0.3)
        with transaction(sessions) as s:
            run = lifecycle.live_run_of(s, trial_id)
            assert run is not None
            lifecycle.request_preemption(s, run.id)

    got, elapsed = long_poll(threading.Thread(target=searcher_pause))
    assert got == {"preempt": True}
    assert elapsed < routes_allocations.PREEMPTION_POLL_S / 2  # woken, not found by the slow re-read

    with transaction(sessions) as s:  # the stop is called off; the trial goes on
        run = lifecycle.live_run_of(s, trial_id)
        assert run is not None
        run.preempt_requested = run.preempt_acked = False

    def user_pause() -> None:
        time.sleep(0.3)
        assert client.post(f"/api/v1/experiments/{exp_id}/pause", headers=admin).status_code == 200

    got, elapsed = long_poll(threading.Thread(target=user_pause))
    assert got == {"preempt": True}
    assert elapsed < routes_allocations.PREEMPTION_POLL_S / 2


def test_trial_logs_follow(client: TestClient, sessions: sessionmaker[Session], tmp_path: Path) -> None:
    admin = login(client)
    exp_id = create_experiment(client, admin)
    log_file = tmp_path / "jobs" / "slurm-1.out"  # below the job storage root (DET_JOB_STORAGE_ROOT)
    log_file.parent.mkdir()
    log_file.write_text("[rank=0] hello\n[rank=1] world\n")
    with transaction(sessions) as s:
        trial = lifecycle.create_trial(s, exp_id, "r", {})
        run_id = lifecycle.allocate_trial_run(s, trial.id, log_path=str(log_file)).id
        trial_id = trial.id
    lines = client.get(f"/api/v1/trials/{trial_id}/logs", headers=admin).text.splitlines()
    assert [json.loads(x)["result"]["rankId"] for x in lines] == [0, 1]

    def finish_later() -> None:
        time.sleep(0.3)
        with log_file.open("a") as f:
            f.write("[rank=0] bye\n")
        time.sleep(0.3)
        with transaction(sessions) as s:
            lifecycle.finish_trial_run(s, run_id, TerminationReason.SEARCHER_DONE)

    thread = threading.Thread(target=finish_later)
    thread.start()
    with client.stream("GET", f"/api/v1/trials/{trial_id}/logs?follow=true", headers=admin) as r:
        got = [json.loads(x)["result"]["log"] for x in r.iter_lines() if x]
    thread.join()
    assert got == ["[rank=0] hello", "[rank=1] world", "[rank=0] bye"]
    assert client.get("/api/v1/trials/999/logs", headers=admin).status_code == 404


def test_trial_kill(client: TestClient, sessions: sessionmaker[Session]) -> None:
    admin = login(client)
    exp_id = create_experiment(client, admin)
    with transaction(sessions) as s:
        trial_id = lifecycle.create_trial(s, exp_id, "r", {}).id
    assert client.post(f"/api/v1/trials/{trial_id}/kill", headers=admin).status_code == 200
    assert (
        client.get(f"/api/v1/trials/{trial_id}", headers=admin).json()["trial"]["state"] == "STATE_CANCELED"
    )
    trials = client.get(f"/api/v1/experiments/{exp_id}/trials", headers=admin).json()["trials"]
    assert [t["id"] for t in trials] == [trial_id]


def test_renaming_a_user_is_refused_by_name_and_changes_nothing(client: TestClient) -> None:
    """Determined's PATCH of a user's ``username``: not supported here, and said so (it used to answer 200 and
    rename nothing); the same name, or another field, goes through; someone else's user stays someone else's."""
    admin = login(client)
    alice = make_user(client, admin, "alice")
    me = client.get("/api/v1/me", headers=alice).json()["user"]
    r = client.patch(f"/api/v1/users/{me['id']}", headers=admin, json={"username": "alicia"})
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "username" and "renaming a user is not supported" in r.json()["message"]
    assert client.get("/api/v1/users/alicia/by-username", headers=admin).status_code == 404
    r = client.patch(
        f"/api/v1/users/{me['id']}", headers=admin, json={"username": "alice", "displayName": "A."}
    )
    assert r.status_code == 200 and r.json()["user"]["displayName"] == "A.", r.text
    bob = make_user(client, admin, "bob")
    r = client.patch(f"/api/v1/users/{me['id']}", headers=bob, json={"username": "alicia"})
    assert r.status_code == 403, r.text  # bob may not change alice: refused as such
