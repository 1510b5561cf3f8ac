"""Determined 0.38.1's ``det resources raw|aggregated`` (JSON and CSV) against our master: the slot-seconds of a
user's trial runs (``services.usage``), and only theirs."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from sqlalchemy import create_engine, update
from sqlalchemy.orm import Session

from hpc_master.db.models import TrialRunModel
from tests.determined_client.conftest import DeterminedClient, OurApi
from tests.determined_client.test_cli_and_sdk import PASSWORD, as_user

pytestmark = pytest.mark.determined_client
DAY = dt.datetime(2020, 3, 4, tzinfo=dt.UTC)  # a day no other test's runs are on


def test_det_resources_reports_a_users_slot_seconds(determined: DeterminedClient, our_api: OurApi) -> None:
    name = our_api.create_user("usage", PASSWORD)
    experiment_id = our_api.create_experiment(our_api.login(name, PASSWORD), f"usage-{name}")
    (trial,) = our_api.seed_trials(experiment_id, [{"lr": 0.1}])
    with Session(create_engine(our_api.master.db_url)) as s, s.begin():  # one slot for 90 minutes
        s.execute(update(TrialRunModel).where(TrialRunModel.trial_id == trial).values(
            start_time=DAY + dt.timedelta(hours=1), end_time=DAY + dt.timedelta(hours=2, minutes=30)))  # fmt: skip
    who = as_user(name)

    r = determined.det("resources", "aggregated", "2020-03-04", "2020-03-04", "--json", env=who)
    assert r.rc == 0, r.err
    (day,) = json.loads(r.out)["resourceEntries"]
    assert day["byUsername"] == {name: 5400.0} and day["seconds"] == 5400.0, day

    r = determined.det("resources", "raw", "2020-03-04T00:00:00Z", "2020-03-05T00:00:00Z", "--json", env=who)
    assert r.rc == 0, r.err
    (entry,) = json.loads(r.out)["resourceEntries"]
    assert (entry["experimentId"], entry["username"], entry["seconds"]) == (experiment_id, name, 5400.0)

    r = determined.det("resources", "aggregated", "2020-03-04", "2020-03-04", env=who)  # CSV
    assert r.rc == 0 and f"2020-03-04,username,{name},5400.0" in r.out, r.out + r.err
    other = our_api.create_user("usage-other", PASSWORD)
    r = determined.det("resources", "aggregated", "2020-03-04", "2020-03-04", "--json", env=as_user(other))
    assert r.rc == 0 and json.loads(r.out)["resourceEntries"][0]["byUsername"] == {}, r.out
