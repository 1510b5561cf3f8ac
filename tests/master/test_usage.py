"""Usage (issue 37): slot-seconds of trial runs per run and per day or month, by user, label, pool, workspace and
Slurm account, at Determined's routes (JSON and CSV); clipped to the range asked; each user sees their own,
admins everyone's; bad ranges named. Determined's own ``det resources`` against it:
tests/determined_client/test_resources.py."""

from __future__ import annotations

import datetime as dt
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import ExperimentModel, TrialModel, TrialRunModel
from hpc_master.services.users import mint_trial_token
from tests.webui.seed import seed_experiment, seed_user

DAY = dt.datetime(2026, 11, 2, tzinfo=dt.UTC)


def _experiment(
    s: Session, owner: int, name: str, slots: int, runs: list[tuple[float, float | None]], **config: Any
) -> int:
    """An experiment of one trial per run, each run from ``start`` to ``end`` hours after DAY's midnight."""
    exp, trials = seed_experiment(s, owner, name=name, trials=len(runs), points=1, validations=0)
    experiment = s.get(ExperimentModel, exp)
    assert experiment is not None
    experiment.config = {**experiment.config, "resources": {"slots_per_trial": slots}, **config}
    for trial, (start, end) in zip(trials, runs, strict=True):
        s.execute(
            update(TrialRunModel)
            .where(TrialRunModel.trial_id == trial)
            .values(start_time=DAY + dt.timedelta(hours=start),
                    end_time=None if end is None else DAY + dt.timedelta(hours=end))
        )  # fmt: skip
    return exp


def _login(client: TestClient, name: str) -> dict[str, str]:
    r = client.post("/api/v1/auth/login", json={"username": name, "password": f"{name}-pw"})
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def _seed(sessions: sessionmaker[Session]) -> None:
    with transaction(sessions) as s:
        alice, bob = seed_user(s, "alice", "alice-pw"), seed_user(s, "bob", "bob-pw")
        seed_user(s, "root-admin", "root-admin-pw", admin=True)
        # alice: 2 GPUs from 01:00 to 03:00 and from 23:00 to 01:00 the next day; labels, her account.
        _experiment(s, alice, "a", 2, [(1, 3), (23, 25)], labels=["vision"], slurm={"account": "proj-a"})
        # bob: 1 GPU from 02:00 for 4 h, and a CPU-only trial (0 slots) in the pool's account.
        _experiment(s, bob, "b", 1, [(2, 6)])
        _experiment(s, bob, "c", 0, [(2, 6)])


def test_raw_runs_are_clipped_and_each_user_sees_their_own(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    _seed(sessions)
    params = {"timestamp_after": "2026-11-02T02:00:00Z", "timestamp_before": "2026-11-03T00:00:00Z"}
    alice = client.get(
        "/api/v1/resources/allocation/raw", params=params, headers=_login(client, "alice")
    ).json()
    got = sorted(
        (e["username"], e["slots"], e["seconds"], e["slotSeconds"]) for e in alice["resourceEntries"]
    )
    assert got == [("alice", 2, 3600.0, 7200.0), ("alice", 2, 3600.0, 7200.0)], got  # 02-03 and 23-24
    entry = alice["resourceEntries"][0]
    assert entry["labels"] == ["vision"] and entry["slurmAccount"] == "proj-a" and entry["kind"] == "trial"
    assert entry["startTime"] == "2026-11-02T02:00:00Z"  # clipped to the range

    admin = client.get("/api/v1/resources/allocation/raw", headers=_login(client, "root-admin"),
                       params={"timestampAfter": "2026-11-02T00:00:00Z", "timestampBefore": "2026-11-04T00:00:00Z"})  # fmt: skip
    assert sorted({e["username"] for e in admin.json()["resourceEntries"]}) == ["alice", "bob"]
    assert len(admin.json()["resourceEntries"]) == 4


def test_aggregated_per_day_and_month_by_user_account_and_label(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    _seed(sessions)
    headers = _login(client, "root-admin")
    params = {"start_date": "2026-11-02", "end_date": "2026-11-03"}
    days = client.get("/api/v1/resources/allocation/aggregated", params=params, headers=headers).json()
    first, second = days["resourceEntries"]
    assert (first["periodStart"], second["periodStart"]) == ("2026-11-02", "2026-11-03")
    assert first["period"] == "RESOURCE_ALLOCATION_AGGREGATION_PERIOD_DAILY"
    # Day 1: alice 2 GPUs × (2 h + 1 h) = 21,600; bob 1 GPU × 4 h = 14,400 (his CPU-only trial: 0).
    assert first["byUsername"] == {"alice": 21_600.0, "bob": 14_400.0}
    assert first["seconds"] == 36_000.0
    assert first["bySlurmAccount"] == {"proj-a": 21_600.0, "": 14_400.0}  # bob: his default association
    assert first["byExperimentLabel"] == {"vision": 21_600.0}
    assert first["byResourcePool"] == {"default": 36_000.0} and first["byWorkspace"] == {
        "Uncategorized": 36_000.0
    }
    assert second["byUsername"] == {"alice": 7_200.0}  # 00:00-01:00 on the next day
    month = client.get("/api/v1/resources/allocation/aggregated", headers=headers,
                       params={**params, "period": "RESOURCE_ALLOCATION_AGGREGATION_PERIOD_MONTHLY"}).json()  # fmt: skip
    (november,) = month["resourceEntries"]
    assert (november["periodStart"], november["seconds"]) == ("2026-11-01", 43_200.0)

    bob = client.get("/api/v1/resources/allocation/aggregated", params=params, headers=_login(client, "bob"))
    assert bob.json()["resourceEntries"][0]["byUsername"] == {"bob": 14_400.0}  # not alice's


def test_csv_forms_for_determineds_cli(client: TestClient, sessions: sessionmaker[Session]) -> None:
    _seed(sessions)
    headers = _login(client, "alice")
    raw = client.get("/resources/allocation/raw", headers=headers,
                     params={"timestamp_after": "2026-11-02T00:00:00Z", "timestamp_before": "2026-11-03T00:00:00Z"})  # fmt: skip
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/csv"), raw.text
    lines = raw.text.splitlines()
    assert lines[0].startswith("experimentId,trialId,trialRunId,slurmJobId,kind,username") and len(lines) == 3
    agg = client.get("/resources/allocation/aggregated", headers=headers,
                     params={"start_date": "2026-11-02", "end_date": "2026-11-02"})  # fmt: skip
    assert "2026-11-02,total,,21600.0" in agg.text and "2026-11-02,slurm_account,proj-a,21600.0" in agg.text


def test_bad_ranges_are_named_and_callers_are_checked(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    _seed(sessions)
    headers = _login(client, "alice")
    cases = [
        ("raw", {"timestamp_after": "2026-11-02T00:00:00Z"}, "timestamp_before"),
        ("raw", {"timestamp_after": "yesterday", "timestamp_before": "2026-11-03T00:00:00Z"}, "timestamp_after"),
        ("raw", {"timestamp_after": "2026-11-03T00:00:00Z", "timestamp_before": "2026-11-02T00:00:00Z"},
         "timestamp_before"),
        ("aggregated", {"start_date": "2026-11-02", "end_date": "2026-11-01"}, "end_date"),
        ("aggregated", {"start_date": "11/02/2026", "end_date": "2026-11-03"}, "start_date"),
        ("aggregated", {"start_date": "2026-11-02", "end_date": "2026-11-03", "period": "WEEKLY"}, "period"),
    ]  # fmt: skip
    for route, params, field in cases:
        r = client.get(f"/api/v1/resources/allocation/{route}", params=params, headers=headers)
        assert r.status_code == 400 and r.json()["field"] == field, (params, r.text)
    ok = {"start_date": "2026-11-02", "end_date": "2026-11-03"}
    for path in ("/api/v1/resources/allocation/aggregated", "/resources/allocation/aggregated"):
        assert client.get(path, params=ok).status_code == 401  # no token
    with transaction(sessions) as s:  # a trial's own token is not its owner's: no usage through it
        trial_id = s.scalars(select(TrialModel.id)).first()
        assert trial_id is not None
        trial_token = mint_trial_token(s, trial_id)
    r = client.get("/api/v1/resources/allocation/aggregated", params=ok,
                   headers={"Authorization": f"Bearer {trial_token}"})  # fmt: skip
    assert r.status_code in (401, 403), r.text
