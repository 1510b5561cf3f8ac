"""Our ``det resources raw|aggregated`` (Determined's commands) against a real master: a user's slot-hours of
trial runs as a table, CSV or JSON; a bad date named by the master. Determined's own client: tests/determined_client/test_resources.py."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable

from sqlalchemy import create_engine, select, update
from sqlalchemy.orm import Session

from hpc_master.db.models import TrialModel, TrialRunModel, UserModel
from hpc_master.services import lifecycle
from hpc_master.services.access import Principal
from hpc_master.services.experiments import create_experiment
from tests.cli.conftest import Det, Master
from tests.master.helpers import CONFIG

DAY = dt.datetime(2021, 5, 6, tzinfo=dt.UTC)


def _two_gpu_hours(master: Master, username: str) -> None:
    with Session(create_engine(master.db_url)) as s, s.begin():
        user = s.scalars(select(UserModel).where(UserModel.username == username)).one()
        owner = Principal(user_id=user.id, username=username, admin=False)
        exp, _ = create_experiment(s, owner, config_text=CONFIG + "resources: {slots_per_trial: 2}\n",
                                   model_definition=[], activate=True)  # fmt: skip
        assert exp is not None
        trial = lifecycle.create_trial(s, exp.id, "r1", {"lr": 0.1})
        s.add(TrialRunModel(trial_id=trial.id, run_number=1, state="COMPLETED", slurm_job_id="42",
                            start_time=DAY, end_time=DAY + dt.timedelta(hours=1)))  # fmt: skip
        s.execute(update(TrialModel).where(TrialModel.id == trial.id).values(state="COMPLETED"))


def test_det_resources_aggregated_and_raw(
    det: Det, master: Master, make_user: Callable[[str], dict[str, str]]
) -> None:
    who = make_user("usage")
    _two_gpu_hours(master, who["DET_USER"])
    r = det("resources", "aggregated", "2021-05-06", "2021-05-06", env=who)
    assert r.rc == 0, r.err
    rows = [[c.strip() for c in line.split("|")] for line in r.out.splitlines()]
    assert ["2021-05-06", "user", who["DET_USER"], "2"] in rows, r.out  # 2 GPUs for an hour
    r = det("res", "raw", "2021-05-06T00:00:00Z", "2021-05-07T00:00:00Z", "--json", env=who)
    assert r.rc == 0, r.err
    (entry,) = json.loads(r.out)["resourceEntries"]
    assert (entry["slots"], entry["slotSeconds"], entry["slurmJobId"]) == (2, 7200.0, "42")
    r = det("resources", "aggregated", "2021-05-06", "2021-05-06", "--csv", env=who)
    assert r.rc == 0 and "Period,By,Name,Slot-hours" in r.out, r.out
    r = det("resources", "aggregated", "06/05/2021", "2021-05-06", env=who)
    assert r.rc != 0 and "start_date" in r.err, r.err
