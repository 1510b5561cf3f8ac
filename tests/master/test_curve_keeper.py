"""Learning curves saved in the database (``metric_curves``) by the curve keeper: a restarted master starts
from them and reads only the rows after them, and what it draws is what a full read of every row draws (on
SQLite and PostgreSQL)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, event, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import MetricCurveMarkModel, MetricCurveModel, MetricModel, TrialRunModel, utcnow
from hpc_master.services.curves import experiment as curves_module
from hpc_master.services.curves.experiment import CurveCache, ExperimentCurves
from hpc_master.services.curves.keeper import CurveKeeper
from tests.webui.seed import seed_experiment, seed_user

pytestmark = pytest.mark.storage  # saved curves and the queries that read them

Sample = dict[int, tuple[list[int], list[float]]]


@pytest.fixture
def tx(sessions: sessionmaker[Session]) -> Any:
    return lambda: transaction(sessions)


@pytest.fixture
def seeded(sessions: sessionmaker[Session]) -> tuple[int, list[int]]:
    with transaction(sessions) as s:
        alice = seed_user(s, "alice", "alice-pw")
        return seed_experiment(s, alice, name="search", trials=5, points=400, state="ACTIVE")


def sample(curves: ExperimentCurves, group: str = "training", name: str = "loss", n: int = 100) -> Sample:
    return {t: (s.tolist(), v.tolist()) for t, (s, v) in curves.sample(group, name, n).items()}


def full_read(tx: Any, experiment_id: int) -> ExperimentCurves:
    """Every row read, the saved copy ignored."""
    curves = ExperimentCurves(experiment_id, looked_for_saved=True)
    curves.refresh(tx)
    return curves


def add_rows(sessions: sessionmaker[Session], trial_id: int, steps: range, run: int = 2) -> None:
    with transaction(sessions) as s:
        s.execute(
            insert(MetricModel),
            [
                {
                    "trial_id": trial_id,
                    "trial_run_id": run,
                    "group": "training",
                    "steps_completed": step,
                    "metrics": {"avgMetrics": {"loss": 100.0 + step, "new_metric": float(step)}},
                    "report_time": utcnow(),
                }
                for step in steps
            ],
        )


def no_full_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any) -> int:
        raise AssertionError("read every row again instead of starting from the saved curves")

    monkeypatch.setattr(ExperimentCurves, "_load_all", refuse)


def test_a_restarted_master_starts_from_the_saved_curves(
    tx: Any, sessions: sessionmaker[Session], seeded: tuple[int, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    experiment, trials = seeded
    keeper = CurveKeeper(CurveCache(), tx)
    assert keeper.run_once() == [experiment]
    with transaction(sessions) as s:
        saved = s.scalar(select(func.count()).select_from(MetricCurveModel))
        mark = s.get(MetricCurveMarkModel, experiment)
        assert mark is not None and mark.last_id == s.scalar(select(func.max(MetricModel.id)))
    assert saved == 5 * 3  # each trial's loss, validation_loss and accuracy

    expected = {
        (g, n, p): sample(full_read(tx, experiment), g, n, p)
        for g, n in (("training", "loss"), ("validation", "validation_loss"))
        for p in (0, 40)
    }
    no_full_read(monkeypatch)
    restarted = ExperimentCurves(experiment)
    restarted.refresh(tx)
    for (g, n, p), want in expected.items():
        assert sample(restarted, g, n, p) == want, (g, n, p)
    assert restarted.names() == {"training": ["loss"], "validation": ["accuracy", "validation_loss"]}

    # Rows after the save (a new run of trial 0, a new metric) are read on top of the saved curves.
    add_rows(sessions, trials[0], range(4000, 6000, 10))
    monkeypatch.undo()
    want_loss, want_new = (
        sample(full_read(tx, experiment)),
        sample(full_read(tx, experiment), name="new_metric"),
    )
    no_full_read(monkeypatch)
    again = ExperimentCurves(experiment)
    again.refresh(tx)
    assert sample(again) == want_loss and sample(again, name="new_metric") == want_new
    assert again.sample("training", "loss", 100)[trials[0]][1].max() == 100.0 + 5990


def test_the_keeper_saves_a_first_change_at_once_then_at_most_every_save_every_s(
    tx: Any, sessions: sessionmaker[Session], seeded: tuple[int, list[int]]
) -> None:
    experiment, trials = seeded
    now = [1000.0]
    cache = CurveCache()
    keeper = CurveKeeper(cache, tx, save_every_s=30.0, clock=lambda: now[0])
    keeper.run_once()

    def saved_last_id() -> int:
        with transaction(sessions) as s:
            mark = s.get(MetricCurveMarkModel, experiment)
            assert mark is not None
            return mark.last_id

    first = saved_last_id()
    add_rows(sessions, trials[1], range(5000, 5100, 10))
    now[0] += 5
    assert keeper.run_once() == [experiment]  # refreshed in memory...
    assert saved_last_id() == first  # ...not saved again within 30 s
    assert sample(cache.get(experiment)) == sample(full_read(tx, experiment))
    now[0] += 30
    assert keeper.run_once() == []  # no new rows: nothing to refresh, but the change is due for saving
    assert saved_last_id() > first
    # Stopping saves what changed since the last save, however recent.
    add_rows(sessions, trials[2], range(5000, 5010, 10))
    keeper.run_once()
    before_stop = saved_last_id()
    keeper.stop()
    assert saved_last_id() > before_stop


def test_saved_curves_that_do_not_read_back_are_ignored(
    tx: Any, sessions: sessionmaker[Session], seeded: tuple[int, list[int]]
) -> None:
    experiment, _ = seeded
    CurveKeeper(CurveCache(), tx).run_once()
    want = sample(full_read(tx, experiment))
    with transaction(sessions) as s:
        s.execute(update(MetricCurveModel).values(data=b"not a curve"))
    restarted = ExperimentCurves(experiment)
    restarted.refresh(tx)
    assert sample(restarted) == want


def test_a_curve_saved_holds_buckets_not_points(
    tx: Any, sessions: sessionmaker[Session], seeded: tuple[int, list[int]]
) -> None:
    experiment, trials = seeded
    add_rows(sessions, trials[0], range(0, 200_000, 2))  # 100,000 more points
    CurveKeeper(CurveCache(), tx).run_once()
    with transaction(sessions) as s:
        sizes = s.scalars(
            select(func.length(MetricCurveModel.data)).where(
                MetricCurveModel.trial_id == trials[0], MetricCurveModel.name == "loss"
            )
        ).all()
    assert len(sizes) == 1 and sizes[0] <= 100 + 40 * 1024
    restarted = ExperimentCurves(experiment)
    restarted.refresh(tx)
    steps, values = restarted.sample("training", "loss", 0)[trials[0]]
    assert len(steps) <= 2 * 1024 + 2 and int(steps.max()) == 199_998 and np.all(np.diff(steps) > 0)
    assert values.max() == 100.0 + 199_998


def end_runs(sessions: sessionmaker[Session], trial_ids: list[int], when: dt.datetime) -> None:
    with transaction(sessions) as s:
        s.execute(
            update(TrialRunModel)
            .where(TrialRunModel.trial_id.in_(trial_ids))
            .values(state="COMPLETED", end_time=when)
        )


def test_rows_of_runs_that_ended_after_the_save_are_read_after_a_restart(
    tx: Any, sessions: sessionmaker[Session], seeded: tuple[int, list[int]]
) -> None:
    """The master was killed an hour after its last save; meanwhile trial 0 reported more and its run ended
    (30 min ago). However long ago that was, a restarted master reads those rows."""
    experiment, trials = seeded
    CurveKeeper(CurveCache(), tx).run_once()
    an_hour_ago = utcnow() - dt.timedelta(hours=1)
    with transaction(sessions) as s:
        s.execute(update(MetricCurveMarkModel).values(updated_at=an_hour_ago))
    add_rows(sessions, trials[0], range(4000, 4100, 10))
    end_runs(sessions, trials, utcnow() - dt.timedelta(minutes=30))
    restarted = ExperimentCurves(experiment)
    restarted.refresh(tx)
    assert sample(restarted) == sample(full_read(tx, experiment))
    assert restarted.sample("training", "loss", 0)[trials[0]][0].max() == 4090


def test_an_experiment_that_is_not_running_reads_no_metric_rows(
    tx: Any, engine: Engine, sessions: sessionmaker[Session], seeded: tuple[int, list[int]]
) -> None:
    """However many rows it and others have: one query of its runs, none of the metrics."""
    experiment, trials = seeded
    CurveKeeper(CurveCache(), tx).run_once()
    end_runs(sessions, trials, utcnow() - dt.timedelta(hours=2))
    with transaction(sessions) as s:
        s.execute(update(MetricCurveMarkModel).values(updated_at=utcnow() - dt.timedelta(hours=1)))
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    restarted = ExperimentCurves(experiment)
    event.listen(engine, "before_cursor_execute", record)
    try:
        restarted.refresh(tx)
        loaded = len(statements)
        restarted.refresh(tx)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert sample(restarted) == sample(full_read(tx, experiment))
    again = statements[loaded:]
    assert again and not [q for q in again if "FROM metrics" in q], again


def test_a_first_read_without_saved_curves_takes_a_few_trials_per_transaction(
    sessions: sessionmaker[Session], seeded: tuple[int, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite the master has one connection: a search of ten million rows must not hold it for their whole
    read. Each transaction reads at most TRIALS_PER_READ trials' rows."""
    experiment, trials = seeded
    monkeypatch.setattr(curves_module, "TRIALS_PER_READ", 2)
    opened = []

    def counting_tx() -> Any:
        opened.append(1)
        return transaction(sessions)

    curves = ExperimentCurves(experiment)
    curves.refresh(counting_tx)
    assert len(opened) >= 1 + 1 + 3  # the saved copy looked for, the trial list, 5 trials 2 at a time
    assert sample(curves) == sample(full_read(lambda: transaction(sessions), experiment))
    assert set(curves.sample("training", "loss", 10)) == set(trials)
