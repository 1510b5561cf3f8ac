"""Hostile configs cannot take the master down (issue 18, items 2 and 5), on SQLite and PostgreSQL.

- An alias bomb or an oversized config is refused at create (400 invalid_config) and nothing is stored.
- The lifecycle loop reads no experiment's config on a tick where that experiment has nothing to do, so a
  huge config stored by an older release is not decoded every few seconds (nor after a restart).
- A trial whose job cannot be built (an entrypoint an older release accepted) or whose submission raises
  fails with the reason; the other trials are still submitted in the same tick.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from hpc_master import trialjob
from hpc_master.db.engine import transaction
from hpc_master.db.models import EventModel, ExperimentModel, TrialModel, TrialRunModel
from hpc_master.errors import SlurmError
from hpc_master.lifecycle import jobs as jobs_module
from hpc_master.lifecycle import searchers
from hpc_master.lifecycle.jobs import JobDriver
from hpc_master.lifecycle.loop import LifecycleLoop
from hpc_master.masterconf import MasterConfig
from slurm_backend import JobStatus, Outcome, Poller, SlurmCli
from tests.master.helpers import count, create_experiment, login
from tests.unit.test_expconf_yaml_safety import BILLION_LAUGHS, SMALL_BOMB

CONFIG = """\
entrypoint: python3 train.py
searcher: {name: single, metric: validation_loss, max_length: {batches: 100}}
hyperparameters: {lr: 0.1}
"""
BAD_ENTRYPOINT = 'python3 train.py "unterminated'


def _post(client: TestClient, headers: dict[str, str], config: str) -> Any:
    body = {"config": config, "modelDefinition": [], "activate": True}
    return client.post("/api/v1/experiments", headers=headers, json=body)


# ---- create ---------------------------------------------------------------------------------------------


def test_an_alias_bomb_is_refused_at_create_and_nothing_is_stored(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    headers = login(client)
    for bomb in (SMALL_BOMB, BILLION_LAUGHS):
        r = _post(client, headers, bomb)
        assert r.status_code == 400, r.text[:300]
        body = r.json()
        assert body["code"] == "invalid_config"
        assert "invalid YAML at line" in body["message"] and "repeated by aliases" in body["message"]
        assert body["field"] == "config"
    assert count(sessions, ExperimentModel) == 0


def test_an_oversized_config_is_refused_at_create(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    headers = login(client)
    r = _post(client, headers, CONFIG + "# " + "x" * (1024 * 1024) + "\n")
    assert r.status_code == 400
    assert r.json()["code"] == "invalid_config"
    assert "over the limit of 1 MiB (1,048,576 bytes)" in r.json()["message"]
    assert count(sessions, ExperimentModel) == 0


def test_a_merge_key_config_is_accepted(client: TestClient, sessions: sessionmaker[Session]) -> None:
    headers = login(client)
    config = CONFIG + "data:\n  base: &base {batch: 32, workers: 4}\n  eval: {<<: *base, batch: 64}\n"
    exp_id = create_experiment(client, headers, config)
    with transaction(sessions) as s:
        exp = s.get(ExperimentModel, exp_id)
        assert exp is not None
        assert exp.config["data"]["eval"] == {"batch": 64, "workers": 4}


def test_an_entrypoint_with_an_unbalanced_quote_is_refused_at_create(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    headers = login(client)
    r = _post(client, headers, CONFIG.replace("python3 train.py", BAD_ENTRYPOINT))
    assert r.status_code == 400
    assert r.json()["code"] == "invalid_config"
    assert r.json()["field"] == "entrypoint"
    assert "no closing quotation" in r.json()["message"]
    assert count(sessions, ExperimentModel) == 0


# ---- the loop ---------------------------------------------------------------------------------------------


class FakeSlurm(SlurmCli):
    """sbatch hands out job ids; every job then stays RUNNING."""

    def __init__(self) -> None:
        super().__init__()
        self.submitted: list[str] = []
        self.fail_submit: Exception | None = None

    def submit(self, script_text: str, *, as_user: str | None = None) -> str:
        if self.fail_submit is not None:
            raise self.fail_submit
        job_id = str(1000 + len(self.submitted))
        self.submitted.append(script_text)
        return job_id

    def find_by_comment(self, comment: str, *, user: str | None = None) -> list[str]:
        return []

    def cancel(self, job_id: str, *, signal: str | None = None) -> None:
        pass

    def poll_squeue(self, job_ids: Iterable[str]) -> tuple[dict[str, JobStatus], int]:
        return self.squeue(job_ids), 0

    def squeue(self, job_ids: Iterable[str]) -> dict[str, JobStatus]:
        return {j: JobStatus(j, Outcome.RUNNING, "RUNNING", node_list="n1", source="squeue") for j in job_ids}

    def sacct(self, job_ids: Iterable[str]) -> dict[str, JobStatus] | None:
        return {}


def _loop(sessions: sessionmaker[Session], config: MasterConfig, slurm: FakeSlurm) -> LifecycleLoop:
    driver = JobDriver(sessions, config, slurm, Poller(slurm, interval_s=0), python="/usr/bin/python3")
    driver.acts_for_users = False  # jobs run as the master's account (tests may run as root)
    return LifecycleLoop(sessions, driver)


_READS_CONFIG = re.compile(r"experiments\.config\b")  # config or config_text, in a SELECT


@contextmanager
def _config_reads(engine: Engine) -> Iterator[list[str]]:
    """The SQL statements that read an experiment's config or config text while the block runs."""
    seen: list[str] = []

    def before(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and _READS_CONFIG.search(statement):
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", before)


def _store_huge_config(sessions: sessionmaker[Session], exp_id: int) -> None:
    """What an older release stored for an alias bomb: the expanded config (here 200,000 strings)."""
    with transaction(sessions) as s:
        exp = s.get(ExperimentModel, exp_id)
        assert exp is not None
        exp.config = {**exp.config, "data": {"lol": ["lol"] * 200_000}}
        exp.config_text = CONFIG + "# " + "lol " * 200_000 + "\n"


def _validate(client: TestClient, headers: dict[str, str], trial_id: int, steps: int) -> None:
    item = {"trialRunId": 1, "stepsCompleted": steps, "group": "validation",
            "metrics": {"avgMetrics": {"validation_loss": 1.0 / steps}}}  # fmt: skip
    r = client.post(f"/api/v1/trials/{trial_id}/metrics/batch", headers=headers, json={"metrics": [item]})
    assert r.status_code == 200, r.text


def test_a_tick_reads_no_config_of_an_experiment_with_nothing_to_do(
    client: TestClient,
    sessions: sessionmaker[Session],
    engine: Engine,
    config: MasterConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    headers = login(client)
    built: list[int] = []  # experiments whose search method was built (restored from its snapshot)
    real_load = searchers.load

    def load(experiment: ExperimentModel, *args: Any) -> Any:
        built.append(experiment.id)
        return real_load(experiment, *args)

    monkeypatch.setattr(searchers, "load", load)
    exp_id = create_experiment(client, headers, CONFIG)
    slurm = FakeSlurm()
    _loop(sessions, config, slurm).tick()  # the searcher creates the trial, whose job is submitted
    assert len(slurm.submitted) == 1
    _store_huge_config(sessions, exp_id)

    loop = _loop(sessions, config, slurm)  # the master restarted
    with _config_reads(engine) as reads:
        for _ in range(3):
            loop.tick()  # the job runs; the searcher has no event: nothing needs the config
    assert reads == []
    assert loop.search_inputs.decodes == 0
    assert built == [exp_id]  # only the first tick's, before the restart
    with transaction(sessions) as s:
        (run,) = s.scalars(select(TrialRunModel))
        assert run.state == "RUNNING"

    # Events need the search method: the config is decoded once, then kept (configs never change).
    with transaction(sessions) as s:
        trial_id = s.scalars(select(TrialModel.id).where(TrialModel.experiment_id == exp_id)).one()
    _validate(client, headers, trial_id, 50)
    with _config_reads(engine) as reads:
        loop.tick()
    assert loop.search_inputs.decodes == 1
    assert len(reads) == 1 and "experiments.config_text" not in reads[0]  # the config column alone
    _validate(client, headers, trial_id, 60)
    with _config_reads(engine) as reads:
        loop.tick()
    assert reads == []
    assert loop.search_inputs.decodes == 1
    assert built == [exp_id] * 3


def _trial_of(sessions: sessionmaker[Session], exp_id: int) -> tuple[TrialModel, list[TrialRunModel]]:
    with transaction(sessions) as s:
        trial = s.scalars(select(TrialModel).where(TrialModel.experiment_id == exp_id)).one()
        runs = list(s.scalars(select(TrialRunModel).where(TrialRunModel.trial_id == trial.id)))
        s.expunge_all()
        return trial, runs


def _trial_events(sessions: sessionmaker[Session], trial_id: int) -> list[tuple[str, str]]:
    with transaction(sessions) as s:
        rows = s.scalars(
            select(EventModel)
            .where(EventModel.entity == "trial", EventModel.entity_id == trial_id)
            .order_by(EventModel.id)
        )
        return [(e.new_state, e.reason) for e in rows]


def test_a_trial_whose_job_cannot_be_built_fails_and_the_others_are_submitted(
    client: TestClient, sessions: sessionmaker[Session], config: MasterConfig
) -> None:
    headers = login(client)
    bad = create_experiment(client, headers, CONFIG)
    good = create_experiment(client, headers, CONFIG)
    with transaction(sessions) as s:  # as an older release stored it, before entrypoints were split at create
        exp = s.get(ExperimentModel, bad)
        assert exp is not None
        exp.config = {**exp.config, "entrypoint": BAD_ENTRYPOINT}
    slurm = FakeSlurm()
    loop = _loop(sessions, config, slurm)
    loop.tick()  # does not raise

    trial, runs = _trial_of(sessions, bad)
    assert trial.state == "ERROR"
    assert trial.exit_message is not None
    assert trial.exit_message.startswith("the job could not be submitted: `entrypoint`: cannot be split")
    assert [(r.state, r.exit_reason, r.slurm_job_id) for r in runs] == [("FAILED", "SUBMIT_FAILED", None)]
    assert _trial_events(sessions, trial.id)[-1] == ("ERROR", trial.exit_message)
    shown = client.get(f"/api/v1/trials/{trial.id}", headers=headers).json()
    assert "no closing quotation" in str(shown)

    trial, runs = _trial_of(sessions, good)  # the other experiment's trial went on in the same tick
    assert trial.state == "ACTIVE"
    assert [(r.state, r.slurm_job_id) for r in runs] == [("PENDING", "1000")]
    assert len(slurm.submitted) == 1

    loop.tick()  # the searcher learns of the failed trial; nothing is resubmitted
    assert len(slurm.submitted) == 1
    assert _trial_of(sessions, bad)[0].state == "ERROR"


def test_any_exception_while_submitting_fails_only_that_trial(
    client: TestClient, sessions: sessionmaker[Session], config: MasterConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    headers = login(client)
    first = create_experiment(client, headers, CONFIG)
    second = create_experiment(client, headers, CONFIG)
    real_build = trialjob.build_trial_job

    def build(cfg: Any, pool: Any, trial: Any, *args: Any, **kwargs: Any) -> Any:
        if trial.experiment_id == first:
            raise RuntimeError("boom")
        return real_build(cfg, pool, trial, *args, **kwargs)

    monkeypatch.setattr(jobs_module, "build_trial_job", build)
    slurm = FakeSlurm()
    _loop(sessions, config, slurm).tick()

    trial, runs = _trial_of(sessions, first)
    assert trial.state == "ERROR"
    assert trial.exit_message == "the job could not be submitted: internal error: RuntimeError: boom"
    assert [r.exit_reason for r in runs] == ["SUBMIT_FAILED"]
    trial, runs = _trial_of(sessions, second)
    assert trial.state == "ACTIVE" and [r.slurm_job_id for r in runs] == ["1000"]


def test_an_unexpected_slurm_failure_at_submit_loses_the_run_not_the_trial(
    client: TestClient, sessions: sessionmaker[Session], config: MasterConfig
) -> None:
    headers = login(client)
    exp_id = create_experiment(client, headers, CONFIG)
    slurm = FakeSlurm()
    # Not a refusal and not an unanswering controller (those wait): a failure of unknown kind.
    slurm.fail_submit = SlurmError("sbatch failed: an error Slurm has never printed")
    loop = _loop(sessions, config, slurm)
    loop.tick()
    trial, runs = _trial_of(sessions, exp_id)
    assert trial.state == "ACTIVE"  # resubmitted while restarts last
    assert [(r.state, r.exit_reason) for r in runs] == [("FAILED", "JOB_LOST")]
    slurm.fail_submit = None
    loop.tick()
    trial, runs = _trial_of(sessions, exp_id)
    assert trial.state == "ACTIVE" and [r.slurm_job_id for r in runs] == [None, "1000"]
