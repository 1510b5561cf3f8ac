"""Storage contract: the same suite on SQLite and PostgreSQL (see conftest ``engine``)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, inspect, select
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.exc import StaleDataError

from hpc_master.db.engine import transaction
from hpc_master.db.migrate import upgrade_to_head
from hpc_master.db.models import EventModel, ExperimentModel, MetricModel, TrialModel, UserModel
from hpc_master.services import experiments as exps
from hpc_master.services import harness, lifecycle
from hpc_master.services.access import Principal
from hpc_master.services.common import InvalidTransitionError
from hpc_master.services.metrics import MetricReport, ingest_metrics
from hpc_master.services.states import ExperimentState, RunState, TerminationReason, TrialState

from .helpers import CONFIG, count

pytestmark = pytest.mark.storage  # the storage functions and migrations


@pytest.fixture
def owner(sessions: sessionmaker[Session]) -> Principal:
    with transaction(sessions) as s:
        user = UserModel(username="alice", password_hash="", admin=False)
        s.add(user)
        s.flush()
        return Principal(user_id=user.id, username="alice", admin=False)


def new_experiment(sessions: sessionmaker[Session], owner: Principal, config: str = CONFIG) -> int:
    with transaction(sessions) as s:
        exp, _ = exps.create_experiment(s, owner, config_text=config, model_definition=[], activate=True)
        assert exp is not None
        return exp.id


def new_trial(sessions: sessionmaker[Session], exp_id: int, request_id: str = "r1") -> int:
    with transaction(sessions) as s:
        return lifecycle.create_trial(s, exp_id, request_id, {"lr": 0.1}).id


def test_migrations_are_idempotent(engine: Engine) -> None:
    upgrade_to_head(engine)
    names = set(inspect(engine).get_table_names())
    assert {
        "users",
        "sessions",
        "experiments",
        "trials",
        "trial_runs",
        "metrics",
        "checkpoints",
        "events",
    } <= names


def test_create_trial_is_idempotent_on_request_id(sessions: sessionmaker[Session], owner: Principal) -> None:
    exp_id = new_experiment(sessions, owner)
    assert new_trial(sessions, exp_id, "a") == new_trial(sessions, exp_id, "a")
    assert new_trial(sessions, exp_id, "b") != new_trial(sessions, exp_id, "a")


def test_run_lifecycle_preemption_resubmits(sessions: sessionmaker[Session], owner: Principal) -> None:
    exp_id = new_experiment(sessions, owner)
    trial_id = new_trial(sessions, exp_id)
    with transaction(sessions) as s:
        assert [t.id for t in lifecycle.list_trials_to_submit(s)] == [trial_id]
        run = lifecycle.allocate_trial_run(s, trial_id, log_path="/tmp/x.log")
        run_id = run.id
        assert run.run_number == 1
    with transaction(sessions) as s:
        lifecycle.start_trial_run(s, run_id, "1234")
        lifecycle.mark_run_running(s, run_id, "node[1-2]")
    with transaction(sessions) as s:
        live = lifecycle.list_live_runs(s)
        assert [(r.slurm_job_id, r.state) for r in live] == [("1234", RunState.RUNNING)]
        assert lifecycle.list_trials_to_submit(s) == []
        with pytest.raises(InvalidTransitionError):
            lifecycle.allocate_trial_run(s, trial_id)
    with transaction(sessions) as s:
        outcome = lifecycle.finish_trial_run(s, run_id, TerminationReason.SLURM_PREEMPTED)
        assert outcome.resubmit and outcome.trial_state == TrialState.ACTIVE
    with transaction(sessions) as s:
        again = lifecycle.finish_trial_run(s, run_id, TerminationReason.SLURM_PREEMPTED)
        assert not again.resubmit  # idempotent
        assert lifecycle.allocate_trial_run(s, trial_id).run_number == 2
        trial = s.get(TrialModel, trial_id)
        assert trial is not None and trial.restarts == 0


def test_failures_restart_until_max_restarts(sessions: sessionmaker[Session], owner: Principal) -> None:
    exp_id = new_experiment(sessions, owner, CONFIG + "max_restarts: 1\n")
    trial_id = new_trial(sessions, exp_id)
    outcomes = []
    for _ in range(2):
        with transaction(sessions) as s:
            run_id = lifecycle.allocate_trial_run(s, trial_id).id
        with transaction(sessions) as s:
            outcomes.append(lifecycle.finish_trial_run(s, run_id, TerminationReason.NODE_FAIL))
    assert [o.resubmit for o in outcomes] == [True, False]
    assert outcomes[-1].trial_state == TrialState.ERROR
    with transaction(sessions) as s:
        events = s.scalars(
            select(EventModel.new_state).where(EventModel.entity == "trial", EventModel.entity_id == trial_id)
        ).all()
        assert events == [TrialState.ACTIVE, TrialState.ERROR]


def test_invalid_transition_is_refused(sessions: sessionmaker[Session], owner: Principal) -> None:
    exp_id = new_experiment(sessions, owner)
    trial_id = new_trial(sessions, exp_id)
    with transaction(sessions) as s:
        trial = s.get(TrialModel, trial_id)
        assert trial is not None
        lifecycle.set_trial_state(s, trial, TrialState.COMPLETED, "done")
        with pytest.raises(InvalidTransitionError):
            lifecycle.set_trial_state(s, trial, TrialState.ACTIVE, "again")


def test_version_guards_stale_writers(sessions: sessionmaker[Session], owner: Principal) -> None:
    exp_id = new_experiment(sessions, owner)
    with transaction(sessions) as s:
        loaded = s.get(ExperimentModel, exp_id)
        assert loaded is not None
        version = loaded.version
    with transaction(sessions) as s:
        assert lifecycle.record_searcher_snapshot(s, exp_id, {"rng": [1, 2]}, version)
    with transaction(sessions) as s:
        assert not lifecycle.record_searcher_snapshot(s, exp_id, {"rng": [3]}, version)  # stale
        row = s.get(ExperimentModel, exp_id)
        assert row is not None and row.searcher_snapshot == {"rng": [1, 2]}
    # ORM updates are guarded too: two sessions editing the same row, the second one loses.
    s1, s2 = sessions(), sessions()
    try:
        a = s1.get(ExperimentModel, exp_id)
        s1.commit()  # end the read; `a` keeps the loaded version (expire_on_commit=False)
        b = s2.get(ExperimentModel, exp_id)
        assert a is not None and b is not None
        b.progress = 0.5
        s2.commit()
        a.progress = 0.25
        s1.add(a)
        with pytest.raises(StaleDataError):
            s1.commit()
    finally:
        s1.close()
        s2.close()


def test_metrics_ingest_is_idempotent(sessions: sessionmaker[Session], owner: Principal) -> None:
    exp_id = new_experiment(sessions, owner)
    trial_id = new_trial(sessions, exp_id)
    batch = [
        MetricReport(1, steps, "training", {"avgMetrics": {"loss": 1.0 / (steps + 1)}}) for steps in range(50)
    ]
    with transaction(sessions) as s:
        assert ingest_metrics(s, trial_id, batch) == (50, 0)
    with transaction(sessions) as s:
        assert ingest_metrics(s, trial_id, [*batch[:10], MetricReport(2, 0, "training", {})]) == (1, 10)
    assert count(sessions, MetricModel) == 51
    with transaction(sessions) as s:
        trial = s.get(TrialModel, trial_id)
        assert trial is not None and trial.steps_completed == 49


def test_cancel_waits_for_live_runs(sessions: sessionmaker[Session], owner: Principal) -> None:
    exp_id = new_experiment(sessions, owner)
    running = new_trial(sessions, exp_id, "a")
    idle = new_trial(sessions, exp_id, "b")
    with transaction(sessions) as s:
        run_id = lifecycle.allocate_trial_run(s, running).id
    with transaction(sessions) as s:
        exps.cancel_experiment(s, owner, exp_id)
    with transaction(sessions) as s:
        assert s.get(ExperimentModel, exp_id).state == ExperimentState.STOPPING_CANCELED  # type: ignore[union-attr]
        assert s.get(TrialModel, idle).state == TrialState.CANCELED  # type: ignore[union-attr]
        assert s.get(TrialModel, running).state == TrialState.STOPPING_CANCELED  # type: ignore[union-attr]
        assert lifecycle.list_live_runs(s)[0].preempt_requested
    with transaction(sessions) as s:
        lifecycle.finish_trial_run(s, run_id, TerminationReason.SLURM_PREEMPTED)
    with transaction(sessions) as s:
        assert s.get(ExperimentModel, exp_id).state == ExperimentState.CANCELED  # type: ignore[union-attr]
        assert s.get(TrialModel, running).state == TrialState.CANCELED  # type: ignore[union-attr]


def test_kill_lists_runs_to_scancel(sessions: sessionmaker[Session], owner: Principal) -> None:
    exp_id = new_experiment(sessions, owner)
    trial_id = new_trial(sessions, exp_id)
    with transaction(sessions) as s:
        run_id = lifecycle.allocate_trial_run(s, trial_id).id
        lifecycle.start_trial_run(s, run_id, "77")
    with transaction(sessions) as s:
        exps.kill_experiment(s, owner, exp_id)
    with transaction(sessions) as s:
        assert [r.slurm_job_id for r in lifecycle.list_runs_to_kill(s)] == ["77"]
        lifecycle.finish_trial_run(s, run_id, TerminationReason.KILLED_BY_USER)
    with transaction(sessions) as s:
        assert s.get(ExperimentModel, exp_id).state == ExperimentState.CANCELED  # type: ignore[union-attr]


def test_activate_keeps_searcher_paused_trials_paused(
    sessions: sessionmaker[Session], owner: Principal
) -> None:
    exp_id = new_experiment(sessions, owner)
    by_searcher = new_trial(sessions, exp_id, "a")
    by_user = new_trial(sessions, exp_id, "b")
    with transaction(sessions) as s:
        run_id = lifecycle.allocate_trial_run(s, by_searcher).id
    with transaction(sessions) as s:
        outcome = lifecycle.finish_trial_run(s, run_id, TerminationReason.PAUSED_BY_SEARCHER)
        assert outcome.trial_state == TrialState.PAUSED and not outcome.resubmit
    with transaction(sessions) as s:
        exps.pause_experiment(s, owner, exp_id)
    with transaction(sessions) as s:
        exps.activate_experiment(s, owner, exp_id)
    with transaction(sessions) as s:
        assert s.get(TrialModel, by_searcher).state == TrialState.PAUSED  # type: ignore[union-attr]
        assert s.get(TrialModel, by_user).state == TrialState.ACTIVE  # type: ignore[union-attr]


def test_searcher_op_outbox(sessions: sessionmaker[Session], owner: Principal) -> None:
    exp_id = new_experiment(sessions, owner)
    trial_id = new_trial(sessions, exp_id)
    with transaction(sessions) as s:
        lifecycle.set_searcher_operation(s, trial_id, 50)  # max_length is 100
        assert harness.searcher_operation(s, trial_id, deliver=True) == (50, harness.OpState.READY)
    with transaction(sessions) as s:
        harness.complete_searcher_operation(s, trial_id, 50, 0.5)
        harness.complete_searcher_operation(s, trial_id, 50, 0.5)  # retried: recorded once
        assert harness.searcher_operation(s, trial_id, deliver=True) == (50, harness.OpState.WAITING)
    with transaction(sessions) as s:
        taken = lifecycle.take_searcher_op_completions(s)
        assert [(c.trial_id, c.length, c.metric) for c in taken] == [(trial_id, 50, 0.5)]
        # Seen, with no new operation and no pause: the searcher may still promote the trial.
        assert harness.searcher_operation(s, trial_id, deliver=True) == (50, harness.OpState.WAITING)
    with transaction(sessions) as s:
        assert lifecycle.take_searcher_op_completions(s) == []
        assert harness.best_searcher_validation(s, exp_id) == 0.5
    # The searcher's max_length is the last operation any method gives: done once completed, unseen or not.
    with transaction(sessions) as s:
        lifecycle.set_searcher_operation(s, trial_id, 100)
        harness.complete_searcher_operation(s, trial_id, 100, 0.25)
        assert harness.searcher_operation(s, trial_id, deliver=True) == (100, harness.OpState.DONE)


def test_active_listings_for_reconciliation(sessions: sessionmaker[Session], owner: Principal) -> None:
    exp_id = new_experiment(sessions, owner)
    trial_id = new_trial(sessions, exp_id)
    with transaction(sessions) as s:
        assert [e.id for e in lifecycle.list_active_experiments(s)] == [exp_id]
        assert [t.id for t in lifecycle.list_active_trials(s, exp_id)] == [trial_id]
        token = lifecycle.mint_trial_token(s, trial_id)
        assert len(token) > 30
