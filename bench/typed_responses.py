"""Typed responses (issue 42) against the untyped answers they replaced, on the read paths with the largest answers.

    .venv/bin/python bench/typed_responses.py [--base REV] [--rounds N] [--out FILE]

Since issue 42 every JSON route names its answer (``hpc_master/api/responses.py``): FastAPI validates the
route's dict against that ``TypedDict`` and writes the JSON with pydantic's serializer, where it walked the
dict with ``jsonable_encoder`` and wrote it with ``json.dumps`` before. This times the same requests,
in-process on SQLite (FastAPI's ``TestClient``), in this tree and in a ``git worktree`` of `--base`
(default: the commit before typed responses), alternately ``--rounds`` times, each round a fresh process
and database, and reports each request's median time and the median of the rounds' ratios (this tree /
base) with their range. The database: 100 experiments, one of them with 10,000 trials; a trial with 5,000
training reports; each request runs twice before it is timed, then the garbage collector runs.

Results are appended to ``--out`` (default ``bench/results/typed_responses.md``).
"""

from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path

from _against_base import Report, main

BASE_REV = "4a45afb"
EXPERIMENTS = 100
TRIALS = 10_000
REPORTS = 5_000


def inner(db: Path) -> dict[str, float]:
    """Run in a tree's own Python path: build the database, time each request (ms per request)."""
    import datetime as dt

    from fastapi.testclient import TestClient

    from hpc_master.api.app import create_app
    from hpc_master.db.engine import make_engine, make_sessionmaker, transaction
    from hpc_master.db.migrate import upgrade_to_head
    from hpc_master.db.models import MetricModel, TrialRunModel, UserModel
    from hpc_master.masterconf import parse_master_config
    from hpc_master.services import lifecycle
    from hpc_master.services.experiments import create_experiment
    from hpc_master.services.users import Principal
    from tests.master.helpers import CONFIG, login

    engine = make_engine(f"sqlite:///{db}")
    upgrade_to_head(engine)
    sessions = make_sessionmaker(engine)
    master = parse_master_config({"db": {"url": f"sqlite:///{db}"}}, env={})
    client = TestClient(create_app(master, engine=engine)).__enter__()
    admin = login(client)
    with transaction(sessions) as s:
        user = UserModel(username="alice", password_hash="", admin=False)
        s.add(user)
        s.flush()
        alice = Principal(user_id=user.id, username="alice", admin=False)
        ids = []
        for _ in range(EXPERIMENTS):
            exp, _ = create_experiment(s, alice, config_text=CONFIG, model_definition=[], activate=True)
            assert exp is not None
            ids.append(exp.id)
        big = ids[0]
        trials = [lifecycle.create_trial(s, big, f"r{i}", {"lr": 0.1 + i * 1e-6}) for i in range(TRIALS)]
        s.flush()
        first = trials[0].id
        run = TrialRunModel(trial_id=first, run_number=1, state="RUNNING")
        s.add(run)
        s.flush()
        now = dt.datetime.now(dt.UTC)
        s.add_all(
            MetricModel(trial_id=first, trial_run_id=1, steps_completed=i + 1, group="training",
                        metrics={"avgMetrics": {"loss": 1.0 / (i + 1), "acc": i / REPORTS}}, report_time=now)
            for i in range(REPORTS)
        )  # fmt: skip
    some = "&".join(f"trialIds={t.id}" for t in trials[:10])
    requests = {
        f"GET /api/v1/experiments?limit={EXPERIMENTS} (one has {TRIALS:,} trials)": f"/api/v1/experiments?limit={EXPERIMENTS}",
        f"GET /api/v1/experiments/{{id}} ({TRIALS:,} trials)": f"/api/v1/experiments/{big}",
        "GET /api/v1/experiments/{id}/trials?limit=1000": f"/api/v1/experiments/{big}/trials?limit=1000",
        f"GET /api/v1/webui/experiments/{{id}}/trials ({TRIALS:,} trials)": f"/api/v1/webui/experiments/{big}/trials",
        f"GET /api/v1/trials/{{id}}/metrics ({REPORTS:,} reports)": f"/api/v1/trials/{first}/metrics",
        "GET /api/v1/trials/time-series (10 trials, the UI's curves)": f"/api/v1/trials/time-series?{some}",
        "GET /api/v1/webui/experiments?limit=100": "/api/v1/webui/experiments?limit=100",
    }  # fmt: skip
    out = {}
    for name, path in requests.items():
        for _ in range(2):
            r = client.get(path, headers=admin)
            assert r.status_code == 200, (path, r.text[:300])
        gc.collect()
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            r = client.get(path, headers=admin)
            times.append((time.perf_counter() - t0) * 1e3)
            assert r.status_code == 200
        out[name] = statistics.median(times)
    client.__exit__(None, None, None)
    return out


REPORT = Report(
    title="# Typed responses against untyped answers\n\n`.venv/bin/python bench/typed_responses.py` (issue 42).\n",
    base_name="untyped",
    head_name="typed",
    unit="ms",
    what="request",
)


if __name__ == "__main__":
    main(__file__, inner, BASE_REV, 3, REPORT)
