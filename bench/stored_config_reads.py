"""Typed stored-config reads (issue 42) against the raw-dict reads they replaced, on the hot paths that read it.

    .venv/bin/python bench/stored_config_reads.py [--base REV] [--rounds N] [--out FILE]

The master reads an experiment's stored config on every experiment it lists, every validation a trial
reports, every searcher-operation poll of the harness and every checkpoint list. Since issue 42 those reads
go through ``services.stored_config.experiment_config`` (the typed model, kept per experiment beside the dict
it came from) instead of ``experiment.config.get(...)``. This runs the same operations, in-process on SQLite,
in this tree and in a ``git worktree`` of `--base` (default: the commit before the accessor), alternately
``--rounds`` times each, each round a fresh process and database, and reports the median time per operation
and the median of the rounds' ratios (this tree / base, each round's pair run back to back), with their range. Each operation opens its own session, as a request does, so the row and
its config dict are read from the database every time (the accessor's cache hit is a dict comparison). Each
operation runs once before it is timed (the accessor's first parse of each experiment, about 0.1 to 0.8 ms,
is not what is measured), then the garbage collector runs, so that the warm-up's garbage is not collected
inside one tree's timing only (a full collection of the master's heap takes about 50 ms here).

Results are appended to ``--out`` (default ``bench/results/stored_config_reads.md``).
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

from _against_base import Report, main

BASE_REV = "8d6c4b1"
EXPERIMENTS = 100
REPS = 5


def inner(db: Path) -> dict[str, float]:
    """Run in a tree's own Python path: build the database, time each operation (µs per call)."""
    from fastapi.testclient import TestClient
    from sqlalchemy import select

    from hpc_master.api import convert
    from hpc_master.api.app import create_app
    from hpc_master.db.engine import make_engine, make_sessionmaker, transaction
    from hpc_master.db.migrate import upgrade_to_head
    from hpc_master.db.models import ExperimentModel, TrialRunModel, UserModel
    from hpc_master.masterconf import parse_master_config
    from hpc_master.services import harness, lifecycle

    try:
        from hpc_master.services.checkpoints.views import CheckpointQuery, experiment_checkpoints
    except ImportError:  # a base tree from before services/checkpoints/ (session 21)
        from hpc_master.services.checkpoint_views import (  # type: ignore[no-redef]
            CheckpointQuery,
            experiment_checkpoints,
        )
    from hpc_master.services.experiments import create_experiment
    from hpc_master.services.metrics import MetricReport
    from hpc_master.services.users import Principal
    from tests.master.helpers import CONFIG, login

    engine = make_engine(f"sqlite:///{db}")
    upgrade_to_head(engine)
    sessions = make_sessionmaker(engine)
    master = parse_master_config({"db": {"url": f"sqlite:///{db}"}}, env={})
    client = TestClient(create_app(master, engine=engine)).__enter__()
    admin = login(client)

    config = CONFIG + "labels: [sweep, resnet]\nworkspace: vision\nproject: p1\nmax_restarts: 3\n"
    with transaction(sessions) as s:
        user = UserModel(username="alice", password_hash="", admin=False)
        s.add(user)
        s.flush()
        alice = Principal(user_id=user.id, username="alice", admin=False)
        ids = []
        for _ in range(EXPERIMENTS):
            exp, _ = create_experiment(s, alice, config_text=config, model_definition=[], activate=True)
            assert exp is not None
            ids.append(exp.id)
        trial_id = lifecycle.create_trial(s, ids[0], "r1", {"lr": 0.1}).id
        s.add(TrialRunModel(trial_id=trial_id, run_number=1, state="RUNNING"))
    with transaction(sessions) as s:
        run_id = s.scalar(select(TrialRunModel.id).where(TrialRunModel.trial_id == trial_id))
    step = iter(range(1, 10**9))

    def list_experiments() -> None:
        with transaction(sessions) as s:
            rows = s.scalars(select(ExperimentModel).order_by(ExperimentModel.id)).all()
            for e in rows:
                convert.experiment_to_api(e, "alice", [], viewer=alice)

    def report_validation() -> None:
        with transaction(sessions) as s:
            n = next(step)
            report = MetricReport(run_id, n, "validation", {"avgMetrics": {"validation_loss": 1.0 / n}})
            harness.record_validations_for_searcher(s, trial_id, [report])

    def searcher_op() -> None:
        with transaction(sessions) as s:
            harness.searcher_operation(s, trial_id, deliver=False)

    def get_experiments() -> None:
        r = client.get(f"/api/v1/experiments?limit={EXPERIMENTS}", headers=admin)
        assert r.status_code == 200 and len(r.json()["experiments"]) == EXPERIMENTS, r.text

    def checkpoints() -> None:
        with transaction(sessions) as s:
            experiment_checkpoints(s, ids[0], CheckpointQuery())

    out = {}
    # The accessor's own cost, without the database or the garbage collector: convert each of 100 rows
    # (loaded once per pass, in a fresh session, as a request does), best of 30 passes.
    passes = []
    for _ in range(31):
        with sessions() as s:
            passes.append(s.scalars(select(ExperimentModel).order_by(ExperimentModel.id)).all())
    for e in passes[0]:
        convert.experiment_to_api(e, "alice", [], viewer=alice)
    gc.collect()
    gc.disable()
    best = float("inf")
    for rows in passes[1:]:
        t0 = time.perf_counter()
        for e in rows:
            convert.experiment_to_api(e, "alice", [], viewer=alice)
        best = min(best, (time.perf_counter() - t0) / len(rows) * 1e6)
    gc.enable()
    out["one experiment's JSON, CPU only (best of 30, no GC)"] = best
    for name, fn, per in (
        (f"GET /api/v1/experiments?limit={EXPERIMENTS} (per request)", get_experiments, 1),
        (f"list {EXPERIMENTS} experiments (per experiment)", list_experiments, EXPERIMENTS),
        ("a validation report's searcher bookkeeping", report_validation, 1),
        ("the harness's searcher-operation poll", searcher_op, 1),
        ("an experiment's checkpoint list (empty)", checkpoints, 1),
    ):
        fn()  # warm: imports, statement caches, the accessor's cache
        n = max(REPS, 200 // per) if fn is not get_experiments else 100
        gc.collect()  # the warm-up's garbage is not collected inside one tree's timing only
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter() - t0) / (n * per) * 1e6
    client.__exit__(None, None, None)
    return out


REPORT = Report(
    title="# Stored-config reads: the typed accessor against raw dict reads\n\n`.venv/bin/python bench/stored_config_reads.py` (issue 42).\n",
    base_name="raw reads",
    head_name="typed accessor",
    unit="µs",
    what="operation",
)


if __name__ == "__main__":
    main(__file__, inner, BASE_REV, 5, REPORT)
