"""``/health`` and ``/metrics`` (issue 37): the health check follows the database and the lifecycle loop; the
metrics parse as Prometheus' text format (with ``prometheus_client``'s own parser) and count what happened:
loop ticks, the queue in Slurm and in the master, Slurm commands run, per-user helpers started. Neither
says a user's name. The real master's ``/metrics`` with its real loop: tests/admin/test_det_master_service.py."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import TrialRunModel
from slurm_backend.cli import SlurmCli

from .helpers import seed_trial


def _metrics(client: TestClient) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_metrics_count_the_queue_slurm_calls_and_the_loop(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    trial = seed_trial(sessions, "alice")
    with transaction(sessions) as s:
        s.add(TrialRunModel(trial_id=trial, run_number=1, state="PENDING", slurm_job_id="12"))
        s.add(TrialRunModel(trial_id=trial, run_number=2, state="PENDING"))
        s.add(TrialRunModel(trial_id=trial, run_number=3, state="PENDING"))
    before = _metrics(client)
    assert before["det_queue_depth"] == {(("waiting_in", "slurm"),): 1.0, (("waiting_in", "master"),): 2.0}
    calls = before.get("det_slurm_calls_total", {}).get((("command", "squeue"),), 0.0)

    ran: list[list[str]] = []
    cli = SlurmCli(runner=lambda argv, *_: ran.append(list(argv)) or SimpleNamespace(returncode=0, stdout="", stderr=""))  # type: ignore[arg-type,func-returns-value]  # fmt: skip
    cli.run(["squeue", "-h"])
    cli.run(["runuser", "-u", "alice", "--", "squeue", "-h"])
    after = _metrics(client)
    assert after["det_slurm_calls_total"][(("command", "squeue"),)] == calls + 2

    client.app.state.loop = SimpleNamespace(
        ticks=7, tick_seconds=1.5, last_tick_at=time.monotonic(), interval_s=2
    )  # type: ignore[attr-defined]
    looped = _metrics(client)
    assert looped["det_loop_ticks_total"][()] == 7 and looped["det_loop_tick_seconds_total"][()] == 1.5
    assert "alice" not in client.get("/metrics").text  # counts, no names


def test_health_follows_the_database_and_the_loop(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    app: Any = client.app
    assert client.get("/health").json()["status"] == "ok"
    app.state.loop = SimpleNamespace(
        ticks=1, tick_seconds=0.1, last_tick_at=time.monotonic() - 3600, interval_s=2
    )
    stale = client.get("/health")
    assert stale.status_code == 503 and "lifecycle loop last ticked" in stale.json()["problems"][0], (
        stale.text
    )
    app.state.loop.last_tick_at = time.monotonic()
    assert client.get("/health").status_code == 200
    app.state.det.engine.dispose()
    real_connect = app.state.det.engine.connect
    app.state.det.engine.connect = lambda: (_ for _ in ()).throw(OSError("disk gone"))  # type: ignore[method-assign]
    try:
        down = client.get("/health")
        assert down.status_code == 503 and "database does not answer" in down.json()["problems"][0], down.text
    finally:
        app.state.det.engine.connect = real_connect  # type: ignore[method-assign]
    assert client.get("/health").status_code == 200  # the database answers again
