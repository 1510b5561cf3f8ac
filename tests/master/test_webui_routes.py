"""The web UI's routes: cookie sessions with CSRF protection, the data routes (Determined's metrics-stream
and time-series paths), their auth matrix and bounds, and the pages (on SQLite and PostgreSQL)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.api.session_cookie import CSRF_COOKIE, SESSION_COOKIE, csrf_token_for
from hpc_master.db.engine import transaction
from hpc_master.db.models import TrialRunModel, UserModel
from hpc_master.services.users import mint_trial_token
from slurm_backend.cli import SlurmCli
from slurm_backend.cluster_view import CachedClusterView
from tests.master.helpers import login
from tests.unit.test_cluster_view import CountingRunner
from tests.webui.seed import seed_experiment, seed_searched_experiment, seed_user


@pytest.fixture
def seeded(client: TestClient, sessions: sessionmaker[Session]) -> dict[str, Any]:
    with transaction(sessions) as s:
        alice = seed_user(s, "alice", "alice-pw")
        bob = seed_user(s, "bob", "bob-pw")
        asha, asha_trials = seed_experiment(s, alice, name="asha", trials=6, points=500, asha=True)
        single, single_trials = seed_experiment(s, bob, name="single", trials=1, points=50, state="ACTIVE")
        trial_token = mint_trial_token(s, asha_trials[0])
    # The cluster page reads a scripted Slurm (the captured answer), never the machine's.
    client.app.state.cluster_view = CachedClusterView(SlurmCli(runner=CountingRunner()))  # type: ignore[attr-defined]
    return {
        "asha": asha,
        "asha_trials": asha_trials,
        "single": single,
        "single_trials": single_trials,
        "trial_token": trial_token,
    }


def cookie_login(client: TestClient, username: str, password: str) -> str:
    r = client.post("/api/v1/auth/login?cookie=true", json={"username": username, "password": password})
    assert r.status_code == 200, r.text
    body = r.json()
    assert "token" not in body  # the token is only in the HttpOnly cookie
    return str(body["csrfToken"])


def ndjson(text: str) -> list[dict[str, Any]]:
    return [json.loads(line)["result"] for line in text.splitlines() if line.strip()]


def test_cookie_login_sets_httponly_samesite_strict_cookies(
    client: TestClient, seeded: dict[str, Any]
) -> None:
    r = client.post("/api/v1/auth/login?cookie=true", json={"username": "alice", "password": "alice-pw"})
    assert r.status_code == 200
    cookies = r.headers.get_list("set-cookie")
    (session,) = [c for c in cookies if c.startswith(f"{SESSION_COOKIE}=")]
    assert "HttpOnly" in session and "SameSite=strict" in session and "Path=/" in session
    assert "Secure" not in session  # no TLS here: the plain name (with TLS, __Host-det_session and Secure)
    # No cookie of the master is readable by a script: the CSRF value comes in JSON, never as a cookie.
    assert not [c for c in cookies if "HttpOnly" not in c and not c.startswith(f'{CSRF_COOKIE}=""')], cookies
    token = session.split(";")[0].split("=", 1)[1]
    assert r.json()["csrfToken"] == csrf_token_for(token)
    assert client.get("/api/v1/webui/session").json()["csrfToken"] == csrf_token_for(token)


def test_the_session_cookie_works_only_from_the_masters_own_pages(
    client: TestClient, seeded: dict[str, Any]
) -> None:
    """Cookies ignore ports, and SameSite counts every port of a host as the same site: a task's page served on
    another port would have the browser attach the session. The master refuses it from anywhere but its own
    pages (Sec-Fetch-Site, or Origin where a browser sends no Sec-Fetch-Site)."""
    csrf = cookie_login(client, "alice", "alice-pw")
    for headers in ({}, {"sec-fetch-site": "same-origin"}, {"sec-fetch-site": "none"}):
        assert client.get("/api/v1/me", headers=headers).status_code == 200
    for site in ("same-site", "cross-site"):
        r = client.get("/api/v1/me", headers={"sec-fetch-site": site})
        assert r.status_code == 403 and r.json()["code"] == "cross_site", r.text
        r = client.post(
            f"/api/v1/experiments/{seeded['asha']}/pause",
            headers={"sec-fetch-site": site, "X-CSRF-Token": csrf},
        )
        assert r.status_code == 403 and r.json()["code"] == "cross_site", r.text
    r = client.get("/api/v1/me", headers={"origin": "http://testserver:8081"})
    assert r.status_code == 403 and r.json()["code"] == "cross_site"
    assert client.get("/api/v1/me", headers={"origin": "http://testserver"}).status_code == 200
    client.cookies.clear()


def test_cookie_session_reads_without_csrf_and_writes_only_with_it(
    client: TestClient, seeded: dict[str, Any]
) -> None:
    csrf = cookie_login(client, "alice", "alice-pw")
    assert client.get("/api/v1/webui/session").json()["user"]["username"] == "alice"
    exp = seeded["asha"]
    # A state-changing request by cookie without (or with a wrong) CSRF header is refused, and changes nothing.
    for headers in ({}, {"X-CSRF-Token": "0" * 64}, {"X-CSRF-Token": ""}):
        r = client.post(f"/api/v1/experiments/{exp}/pause", headers=headers)
        assert r.status_code == 403 and r.json()["code"] == "csrf_failed", r.text
    assert client.get(f"/api/v1/experiments/{exp}").json()["experiment"]["state"] == "STATE_ACTIVE"
    r = client.post(f"/api/v1/experiments/{exp}/pause", headers={"X-CSRF-Token": csrf})
    assert r.status_code == 200, r.text
    assert client.get(f"/api/v1/experiments/{exp}").json()["experiment"]["state"] == "STATE_PAUSED"


def test_cookie_user_cannot_act_on_another_users_experiment(
    client: TestClient, seeded: dict[str, Any]
) -> None:
    csrf = cookie_login(client, "alice", "alice-pw")
    r = client.post(f"/api/v1/experiments/{seeded['single']}/kill", headers={"X-CSRF-Token": csrf})
    assert r.status_code == 403 and r.json()["code"] == "permission_denied"
    rows = client.get("/api/v1/webui/experiments").json()["experiments"]
    assert {e["name"]: e["canModify"] for e in rows} == {"asha": True, "single": False}


def test_logout_clears_the_cookies_and_ends_the_session(client: TestClient, seeded: dict[str, Any]) -> None:
    csrf = cookie_login(client, "alice", "alice-pw")
    token = client.cookies.get(SESSION_COOKIE)
    r = client.post("/api/v1/auth/logout", headers={"X-CSRF-Token": csrf})
    assert r.status_code == 200
    assert any(
        c.startswith(f"{SESSION_COOKIE}=") and "Max-Age=0" in c for c in r.headers.get_list("set-cookie")
    )
    client.cookies.set(SESSION_COOKIE, token or "")
    assert client.get("/api/v1/webui/session").status_code == 401  # the session itself is gone


def test_bearer_requests_ignore_cookies_and_need_no_csrf(client: TestClient, seeded: dict[str, Any]) -> None:
    cookie_login(client, "alice", "alice-pw")
    bob = login(client, "bob", "bob-pw")
    r = client.post(f"/api/v1/experiments/{seeded['single']}/pause", headers=bob)
    assert r.status_code == 200, r.text
    # A bad bearer token is not rescued by a good cookie.
    assert client.get("/api/v1/webui/session", headers={"Authorization": "Bearer nope"}).status_code == 401


UI_READS = [
    "/api/v1/webui/experiments",
    "/api/v1/webui/session",
    "/api/v1/webui/experiments/{asha}/trials",
    "/api/v1/webui/experiments/{asha}/rungs",
    "/api/v1/experiments/{asha}/metrics-stream/metric-names",
    "/api/v1/experiments/{asha}/metrics-stream/trials-sample?metricName=loss&group=training",
    "/api/v1/experiments/{asha}/metrics-stream/trials-snapshot?metricName=accuracy&batchesProcessed=500",
    "/api/v1/trials/time-series?trialIds={trial}",
    "/api/v1/webui/cluster",
    "/api/v1/webui/vocabulary",
]


@pytest.mark.parametrize("path", UI_READS)
def test_auth_matrix(client: TestClient, seeded: dict[str, Any], path: str) -> None:
    url = path.format(asha=seeded["asha"], trial=seeded["asha_trials"][0])
    assert client.get(url).status_code == 401
    trial = {"Authorization": f"Bearer {seeded['trial_token']}"}
    assert client.get(url, headers=trial).status_code == 403
    bob = login(client, "bob", "bob-pw")  # another user may read (the team can look)
    assert client.get(url, headers=bob).status_code == 200


@pytest.mark.storage  # listing and metrics queries
def test_trials_sample_is_every_trial_downsampled(client: TestClient, seeded: dict[str, Any]) -> None:
    headers = login(client, "alice", "alice-pw")
    exp = seeded["asha"]
    r = client.get(
        f"/api/v1/experiments/{exp}/metrics-stream/trials-sample",
        params={"metricName": "loss", "group": "training", "maxDatapoints": 40},
        headers=headers,
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    (message,) = ndjson(r.text)
    trials = message["trials"]
    assert [t["trialId"] for t in trials] == seeded["asha_trials"]  # all of them, not a top N
    for t in trials:
        assert 2 <= len(t["data"]) <= 40  # 500 points each, downsampled
        steps = [p["batches"] for p in t["data"]]
        assert steps == sorted(steps) and steps[0] == 10 and steps[-1] == 5000
        assert set(t["hparams"]) == {"lr", "layers", "optimizer"}
    # Determined's older metricType names the group too; maxTrials keeps the best.
    r = client.get(
        f"/api/v1/experiments/{exp}/metrics-stream/trials-sample",
        params={"metricName": "validation_loss", "metricType": "METRIC_TYPE_VALIDATION", "maxTrials": 2},
        headers=headers,
    )
    (message,) = ndjson(r.text)
    assert len(message["trials"]) == 2


@pytest.mark.storage  # listing and metrics queries
def test_metric_names_and_snapshot(client: TestClient, seeded: dict[str, Any]) -> None:
    headers = login(client, "alice", "alice-pw")
    exp = seeded["asha"]
    (names,) = ndjson(
        client.get(f"/api/v1/experiments/{exp}/metrics-stream/metric-names", headers=headers).text
    )
    assert names["searcherMetric"] == "validation_loss"
    assert names["trainingMetrics"] == ["loss"]
    assert names["validationMetrics"] == ["accuracy", "validation_loss"]
    (snap,) = ndjson(
        client.get(
            f"/api/v1/experiments/{exp}/metrics-stream/trials-snapshot",
            params={"metricName": "accuracy", "batchesProcessed": 2500, "batchesMargin": 10},
            headers=headers,
        ).text
    )
    assert len(snap["trials"]) == 6 and all(t["batchesProcessed"] == 2500 for t in snap["trials"])


@pytest.mark.storage  # listing and metrics queries
def test_new_metrics_appear_in_the_next_sample(
    client: TestClient, seeded: dict[str, Any], sessions: sessionmaker[Session]
) -> None:
    from hpc_master.services.metrics import MetricReport, ingest_metrics

    headers = login(client, "alice", "alice-pw")
    exp, trial = seeded["asha"], seeded["asha_trials"][0]
    url = f"/api/v1/experiments/{exp}/metrics-stream/trials-sample?metricName=loss&group=training"
    client.get(url, headers=headers)  # warms the server's curve cache
    with transaction(sessions) as s:
        ingest_metrics(s, trial, [MetricReport(1, 99_999, "training", {"avgMetrics": {"loss": 123.0}})])
    (message,) = ndjson(client.get(url, headers=headers).text)
    data = next(t["data"] for t in message["trials"] if t["trialId"] == trial)
    assert data[-1] == {"batches": 99_999, "value": 123.0}


@pytest.mark.storage  # listing and metrics queries
def test_time_series_rungs_and_trials(client: TestClient, seeded: dict[str, Any]) -> None:
    headers = login(client, "alice", "alice-pw")
    trial = seeded["asha_trials"][0]
    r = client.get(f"/api/v1/trials/time-series?trialIds={trial}&maxDatapoints=20", headers=headers)
    assert r.status_code == 200, r.text
    groups = {m["group"]: m for m in r.json()["trials"][0]["metrics"]}
    assert set(groups) == {"training", "validation"}
    assert len(groups["training"]["data"]) <= 20 and groups["training"]["type"] == "METRIC_TYPE_TRAINING"
    assert set(groups["validation"]["data"][0]["values"]) == {"validation_loss", "accuracy"}
    rungs = client.get(f"/api/v1/webui/experiments/{seeded['asha']}/rungs", headers=headers).json()
    (bracket,) = rungs["brackets"]
    assert [r["length"] for r in bracket["rungs"]] == [555, 1666, 5000]
    statuses = [t["status"] for t in bracket["rungs"][0]["trials"]]
    assert statuses.count("paused") == 2 and statuses.count("promoted") == 2
    assert any(t["resumed"] for t in bracket["rungs"][0]["trials"])
    trials = client.get(f"/api/v1/webui/experiments/{seeded['asha']}/trials", headers=headers).json()[
        "trials"
    ]
    assert trials[0]["currentRun"]["slurmJobId"] and trials[0]["latestValidation"]["stepsCompleted"] == 5000


@pytest.mark.parametrize("smaller_is_better", [False, True], ids=["accuracy", "loss"])
def test_rungs_show_the_metric_as_reported_best_first(
    client: TestClient, sessions: sessionmaker[Session], smaller_is_better: bool
) -> None:
    """The searcher keeps metrics signed (smaller is better); the rungs show them as the trials reported them,
    the best first in the metric's own direction, and the search's promotions agree with that order."""
    values = [0.9611, 0.9694, 0.8, 0.9]
    with transaction(sessions) as s:
        alice = seed_user(s, "alice", "alice-pw")
        exp, ids = seed_searched_experiment(
            s, alice, name="searched", metric="validation_accuracy" if not smaller_is_better else "loss",
            smaller_is_better=smaller_is_better, values=values,
        )  # fmt: skip
    r = client.get(f"/api/v1/webui/experiments/{exp}/rungs", headers=login(client, "alice", "alice-pw"))
    assert r.status_code == 200, r.text
    rung = r.json()["brackets"][0]["rungs"][0]["trials"]
    best_first = sorted(values, reverse=not smaller_is_better)
    assert [t["metric"] for t in rung] == best_first
    by_value = dict(zip(values, ids, strict=True))
    assert [t["trialId"] for t in rung] == [by_value[v] for v in best_first]
    assert rung[0]["status"] == "promoted"  # the searcher promoted the one shown best


@pytest.mark.storage  # listing and metrics queries
def test_experiment_list_filters_and_sorts(client: TestClient, seeded: dict[str, Any]) -> None:
    headers = login(client, "alice", "alice-pw")

    def names(**params: Any) -> list[str]:
        r = client.get("/api/v1/webui/experiments", params=params, headers=headers)
        assert r.status_code == 200, r.text
        return [e["name"] for e in r.json()["experiments"]]

    assert names() == ["single", "asha"]
    assert names(sortBy="name", orderBy="ORDER_BY_ASC") == ["asha", "single"]
    assert names(name="SIN") == ["single"]
    assert names(name="%") == []  # LIKE wildcards are literal
    assert names(users="alice") == ["asha"]
    assert names(states="STATE_ACTIVE") == ["single", "asha"]
    assert names(archived="true") == []


@pytest.mark.parametrize(
    "query",
    [
        "metricName=loss&maxDatapoints=5",
        "metricName=loss&maxDatapoints=100000",
        "metricName=loss&periodSeconds=-1",
        "metricName=loss&maxTrials=-1",
        "metricName=",
        "metricName=loss&startBatches=99999999999999999999",
    ],
)
def test_bounds(client: TestClient, seeded: dict[str, Any], query: str) -> None:
    headers = login(client, "alice", "alice-pw")
    r = client.get(
        f"/api/v1/experiments/{seeded['asha']}/metrics-stream/trials-sample?{query}", headers=headers
    )
    assert r.status_code == 400, r.text


def test_unknown_ids_are_404s(client: TestClient, seeded: dict[str, Any]) -> None:
    headers = login(client, "alice", "alice-pw")
    for url in (
        "/api/v1/experiments/999/metrics-stream/trials-sample?metricName=loss",
        "/api/v1/experiments/999/metrics-stream/metric-names",
        "/api/v1/webui/experiments/999/trials",
        "/api/v1/webui/experiments/999/rungs",
        "/api/v1/trials/time-series?trialIds=999",
    ):
        r = client.get(url, headers=headers)
        assert r.status_code == 404 and r.json()["code"] == "not_found", url


def test_pages_assets_and_not_found(client: TestClient) -> None:
    for path in ("/", "/login", "/experiments", "/experiments/12/trials", "/trials/abc", "/cluster"):
        r = client.get(path)
        assert r.status_code == 200 and "<!doctype html>" in r.text, path
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    assert client.get("/webui/js/main.js").headers["content-type"].startswith("text/javascript")
    assert "uPlot" in client.get("/webui/vendor/uPlot.iife.min.js").text
    r = client.get("/no/such/page", headers={"Accept": "text/html"})
    assert r.status_code == 404 and "Page not found" in r.text and "Traceback" not in r.text
    assert client.get("/api/v1/no-such-route").headers["content-type"] == "application/json"


def test_openapi_has_the_data_routes(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for p in (
        "/api/v1/experiments/{experiment_id}/metrics-stream/trials-sample",
        "/api/v1/experiments/{experiment_id}/metrics-stream/trials-snapshot",
        "/api/v1/experiments/{experiment_id}/metrics-stream/metric-names",
        "/api/v1/trials/time-series",
        "/api/v1/webui/experiments",
        "/api/v1/webui/cluster",
    ):
        assert p in paths
    assert "/experiments/{rest}" not in paths and "/" not in paths


def test_cluster_view_partitions_nodes_and_queue(
    client: TestClient, seeded: dict[str, Any], sessions: sessionmaker[Session]
) -> None:
    """Partitions and nodes with GPUs used/free from (captured) scontrol, Slurm asked once per cache period
    whoever asks, and the queued runs with Slurm's pending reason and since when."""
    trial = seeded["single_trials"][0]
    with transaction(sessions) as s:
        run = s.query(TrialRunModel).filter_by(trial_id=trial).one()
        run.state = "PENDING"
        run.pending_reason = "Resources"
        run.pending_since = dt.datetime(2026, 11, 24, 7, 0, tzinfo=dt.UTC)
    bob = login(client, "bob", "bob-pw")
    alice = login(client, "alice", "alice-pw")
    body = client.get("/api/v1/webui/cluster", headers=bob).json()
    assert client.get("/api/v1/webui/cluster", headers=alice).status_code == 200
    cache = client.app.state.cluster_view  # type: ignore[attr-defined]
    assert cache.fetches == 1 and len(cache.cli.runner.calls) == 2
    assert body["error"] == "" and body["cacheSeconds"] == 5.0
    pools = {p["name"]: p for p in body["resourcePools"]}
    assert pools["batch"]["defaultComputePool"] and pools["batch"]["agentIds"] == ["node1", "node2"]
    assert (pools["batch"]["slotsAvailable"], pools["batch"]["slotsUsed"], pools["batch"]["slotsFree"]) == (
        4,
        1,
        3,
    )
    agents = {a["id"]: a for a in body["agents"]}
    assert (agents["node1"]["numSlots"], agents["node1"]["slotsUsed"], agents["node1"]["gpuType"]) == (
        2,
        1,
        "a100",
    )
    assert agents["node2"]["slotsFree"] == 2
    (queued,) = body["queued"]
    assert queued["trialId"] == trial and queued["experimentId"] == seeded["single"]
    assert queued["owner"] == "bob" and queued["experimentName"] == "single"
    assert queued["pendingReason"] == "Resources" and queued["pendingSince"] == "2026-11-24T07:00:00Z"
    assert queued["waitingIn"] == "slurm"


def test_the_actions_offered_per_state_are_those_the_master_takes(
    client: TestClient, seeded: dict[str, Any], sessions: sessionmaker[Session]
) -> None:
    """The UI's buttons come from the vocabulary: an offered action is taken and moves the experiment (or
    archives it); one not offered is refused or changes nothing. Every state × every action, on the real
    routes."""
    alice = login(client, "alice", "alice-pw")
    vocab = client.get("/api/v1/webui/vocabulary", headers=alice).json()
    assert set(vocab["experimentActions"]) == set(vocab["experimentStates"])
    assert vocab["terminationReasons"]["PAUSED_BY_SEARCHER"] == "paused by the searcher until promoted"
    with transaction(sessions) as s:
        owner = s.query(UserModel).filter_by(username="alice").one().id
    offered_somewhere: set[str] = set()
    for state in vocab["experimentStates"]:
        offered = set(vocab["experimentActions"][state])
        offered_somewhere |= offered
        for action in ("pause", "activate", "cancel", "kill", "archive"):
            with transaction(sessions) as s:
                exp, _ = seed_experiment(s, owner, name=f"{state}-{action}", trials=1, points=1, state=state)
            r = client.post(f"/api/v1/experiments/{exp}/{action}", headers=alice)
            after = client.get(f"/api/v1/experiments/{exp}", headers=alice).json()["experiment"]
            moved = after["state"] != f"STATE_{state}" or after["archived"]
            if action in offered:
                assert r.status_code == 200 and moved, (state, action, r.text, after["state"])
            else:
                assert r.status_code >= 400 or not moved, (state, action, r.text, after["state"])
    assert offered_somewhere == {"pause", "activate", "cancel", "kill", "archive"}


def test_under_tls_the_session_cookie_is_host_only_and_secure(engine: Any, tmp_path: Any) -> None:
    """A master that serves TLS names its session cookie ``__Host-det_session`` (the browser then insists on
    Secure, Path=/ and no Domain: a page on another port of the host, over plain HTTP, never gets it)."""
    from hpc_master.api.app import create_app
    from hpc_master.masterconf import parse_master_config

    url = engine.url.render_as_string(hide_password=False)
    config = parse_master_config(
        {
            "db": {"url": url},
            "tls": {"cert": str(tmp_path / "cert.pem")},
            "listen": {"port": free_tcp_port()},
        },
        env={},
    )
    with TestClient(create_app(config, engine=engine), base_url="https://testserver") as tls:
        owner = tls.app.state.det  # type: ignore[attr-defined]
        from hpc_master import owner_key

        body = {
            "username": "determined",
            "password": "",
            "ownerKey": owner_key.read(owner.config.listen.port),
        }
        r = tls.post("/api/v1/auth/login?cookie=true", json=body)
        assert r.status_code == 200, r.text
        (session,) = [c for c in r.headers.get_list("set-cookie") if "HttpOnly" in c]
        assert session.startswith("__Host-det_session=") and "Secure" in session and "Path=/" in session
        assert "Domain" not in session
        assert tls.get("/api/v1/webui/session").status_code == 200  # the browser sends it back: it is read
        assert owner.task_origin.startswith("https://")  # tasks' pages over TLS too


def free_tcp_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
