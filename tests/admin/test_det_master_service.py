"""``det-master`` as systemd runs it (``det-master.service``): ready only when serving, a SIGTERM in the
middle of work ends in exit status 0 with nothing half-written, and the start/stop/kill/restart sequence of
``Restart=on-failure`` loses nothing. The process is real; this machine's PID 1 is not systemd, so the
service manager's side (the notification socket, the signals) is played by the test."""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import sqlite3
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text

from hpc_master.db.migrate import alembic_config

from ._master_process import MasterProcess, free_port, master_env, start_master

ADMIN_PASSWORD = "admin-pw-for-tests"
CONFIG = """\
name: sigterm
entrypoint: python3 train.py
searcher:
  name: single
  metric: validation_loss
  smaller_is_better: true
  max_length:
    batches: 100000
hyperparameters:
  lr: 0.1
"""
BATCH_ROWS = 100


def login(http: httpx.Client, username: str, password: str) -> dict[str, str]:
    r = http.post("/api/v1/auth/login", json={"username": username, "password": password})
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def batch(run_id: int, index: int) -> dict[str, Any]:
    """Batch `index`: BATCH_ROWS training rows with steps of its own."""
    first = index * BATCH_ROWS
    return {
        "metrics": [
            {
                "trialRunId": run_id,
                "stepsCompleted": s,
                "group": "training",
                "metrics": {"avgMetrics": {"loss": 1.0 / s}},
            }
            for s in range(first + 1, first + BATCH_ROWS + 1)
        ]
    }


def start_experiment(m: MasterProcess, jobs_root: Path) -> tuple[int, int, str]:
    """As a researcher (a Unix account when the master is root): an experiment whose trial's job the fake
    Slurm starts at once. (trial id, run id, the trial's token from its run directory)."""
    with httpx.Client(base_url=m.url, timeout=30) as http:
        admin = login(http, "admin", ADMIN_PASSWORD)
        user: dict[str, Any] = {"username": "alice"}
        if os.geteuid() == 0:
            user["unixUsername"] = "nobody"  # a root master runs jobs as their owner's (non-root) account
        r = http.post("/api/v1/users", headers=admin, json={"user": user, "password": "alice-pw"})
        assert r.status_code == 200, r.text
        alice = login(http, "alice", "alice-pw")
        train = base64.b64encode(b"print('hi')\n").decode()
        body = {
            "config": CONFIG,
            "modelDefinition": [{"path": "train.py", "type": 48, "content": train, "mode": 0o644}],
            "activate": True,
        }
        r = http.post("/api/v1/experiments", headers=alice, json=body)
        assert r.status_code == 200, r.text
        exp_id = r.json()["experiment"]["id"]
    deadline = time.monotonic() + 60
    # below the researcher's own directory (a master that acts for users), or the root (a personal one)
    pattern = f"exp-{exp_id}/trial-*/run-*/session_token"
    while not (tokens := [*jobs_root.glob(pattern), *jobs_root.glob(f"*/{pattern}")]):
        assert time.monotonic() < deadline, f"no job was submitted\n{m.log()}"
        time.sleep(0.2)
    (token_file,) = tokens
    trial_id = int(token_file.parent.parent.name.removeprefix("trial-"))
    run_id = int(token_file.parent.name.removeprefix("run-"))
    return trial_id, run_id, token_file.read_text().strip()


class Reporter(threading.Thread):
    """Posts metric batches (as a trial's harness does) until the master goes away; records which batches
    the master acknowledged (2xx: durable)."""

    def __init__(self, url: str, trial_id: int, run_id: int, token: str, indexes: range) -> None:
        super().__init__(daemon=True)
        self.url, self.trial_id, self.run_id, self.token, self.indexes = url, trial_id, run_id, token, indexes
        self.acknowledged: list[int] = []
        self.errors: list[str] = []

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.url, timeout=30, headers=headers) as http:
            for index in self.indexes:
                try:
                    r = http.post(
                        f"/api/v1/trials/{self.trial_id}/metrics/batch", json=batch(self.run_id, index)
                    )
                except httpx.HTTPError:
                    return  # the master stopped: a harness would retry the batch later
                if r.status_code == 200:
                    self.acknowledged.append(index)
                elif r.status_code < 500 and r.status_code != 429:
                    self.errors.append(f"{r.status_code} {r.text}")
                    return


def open_log_stream(url: str, trial_id: int, admin: dict[str, str]) -> threading.Thread:
    """A ``det trial logs -f`` that never ends by itself (its trial runs): the stop must not wait for it."""

    def follow() -> None:
        try:
            with (
                httpx.Client(base_url=url, timeout=None, headers=admin) as http,
                http.stream("GET", f"/api/v1/trials/{trial_id}/logs", params={"follow": "true"}) as r,
            ):
                for _ in r.iter_bytes():
                    pass
        except httpx.HTTPError:
            pass

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    return thread


def check_database(db_url: str, trial_id: int, acknowledged: set[int]) -> int:
    """Migrated to head, intact (SQLite's integrity check), every acknowledged batch stored once, the trial
    and its experiment still active. The number of metric rows of the trial."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT version_num FROM alembic_version")) == head_revision()
            if engine.dialect.name == "sqlite":
                assert conn.scalar(text("PRAGMA integrity_check")) == "ok"
            steps = [
                int(s)
                for (s,) in conn.execute(
                    text(
                        "SELECT steps_completed FROM metrics WHERE trial_id = :t AND \"group\" = 'training'"
                    ),
                    {"t": trial_id},
                )
            ]
            states = conn.execute(
                text("SELECT t.state, e.state FROM trials t JOIN experiments e ON e.id = t.experiment_id "
                     "WHERE t.id = :t"),
                {"t": trial_id},
            ).one()  # fmt: skip
    finally:
        engine.dispose()
    assert len(steps) == len(set(steps)), "a metric row is stored twice"
    rows_of = Counter((s - 1) // BATCH_ROWS for s in steps)
    assert acknowledged <= set(rows_of), f"acknowledged batches lost: {sorted(acknowledged - set(rows_of))}"
    partial = {index: n for index, n in rows_of.items() if n != BATCH_ROWS}
    assert not partial, f"batches stored in part (each is one transaction): {partial}"
    assert tuple(states) == ("ACTIVE", "ACTIVE"), states
    return len(steps)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_sigterm_mid_work_exits_0_and_leaves_a_consistent_database(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    db_url = (
        f"sqlite:///{tmp_path / 'master.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("pg_database")
    )
    # The job storage where the researcher's helper can reach it (pytest's own tmp_path is root's 0700).
    jobs = Path(tempfile.mkdtemp(prefix="det-master-service-jobs-", dir="/var/tmp"))
    jobs.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(jobs, ignore_errors=True))
    env = master_env(
        tmp_path, DET_DB_URL=db_url, DET_REQUIRE_PASSWORDS="1", DET_ADMIN_PASSWORD=ADMIN_PASSWORD,
        DET_POLL_INTERVAL_S="0.5", DET_JOB_STORAGE_ROOT=str(jobs),
    )  # fmt: skip
    port = free_port()
    m = start_master(tmp_path, env=env, module="tests.admin._fake_slurm_master", port=port)
    try:
        trial_id, run_id, token = start_experiment(m, jobs)
        with httpx.Client(base_url=m.url, timeout=30) as http:
            admin = login(http, "admin", ADMIN_PASSWORD)
        stream = open_log_stream(m.url, trial_id, admin)
        reporters = [
            Reporter(m.url, trial_id, run_id, token, range(i * 10_000, (i + 1) * 10_000)) for i in range(3)
        ]
        for reporter in reporters:
            reporter.start()
        deadline = time.monotonic() + 30
        while sum(len(r.acknowledged) for r in reporters) < 10:  # mid-work: batches are flowing
            assert time.monotonic() < deadline, m.log()
            time.sleep(0.05)
        started = time.monotonic()
        status = m.stop(signal.SIGTERM)
        took_s = time.monotonic() - started
    finally:
        m.close()
    for reporter in reporters:
        reporter.join(30)
        assert not reporter.errors, reporter.errors
    stream.join(30)
    assert status == 0, m.log()
    assert took_s < 20, f"the stop took {took_s:.1f} s (an open log stream must not hold it up for long)"
    assert "STOPPING=1" in m.messages and m.messages[-1] == "STATUS=stopped", m.messages
    log = m.log()
    assert "Traceback" not in log, log
    acknowledged = {i for r in reporters for i in r.acknowledged}
    check_database(db_url, trial_id, acknowledged)

    # A harness retries what it did not get an answer for: after a restart every batch is stored once.
    m = start_master(tmp_path, env=env, module="tests.admin._fake_slurm_master", port=port)
    try:
        # What each harness sent: its acknowledged batches and the few after them it had in flight.
        sent = sorted(i for r in reporters for i in r.indexes if i <= max(r.acknowledged, default=-1) + 3)
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=m.url, timeout=30, headers=headers) as http:
            for index in sent:
                r = http.post(f"/api/v1/trials/{trial_id}/metrics/batch", json=batch(run_id, index))
                assert r.status_code == 200, r.text
                answer = r.json()
                assert answer["accepted"] + answer["duplicates"] == BATCH_ROWS
                if index in acknowledged:
                    assert answer == {"accepted": 0, "duplicates": BATCH_ROWS}
        assert m.stop(signal.SIGTERM) == 0, m.log()
    finally:
        m.close()
    assert check_database(db_url, trial_id, set(sent)) == len(sent) * BATCH_ROWS


def test_ready_only_once_serving_then_stopping_and_exit_0(tmp_path: Path) -> None:
    """``Type=notify``: READY=1 comes once the API answers (the database migrated), STOPPING=1 when a stop
    begins; SIGINT (Ctrl-C in a terminal) stops the same way as SIGTERM."""
    m = start_master(tmp_path, abstract_socket=True)
    try:
        assert m.messages[0].startswith("STATUS=starting")
        assert httpx.get(f"{m.url}/api/v1/master", timeout=5).status_code == 200
        assert m.messages.index("READY=1") > 0
        # The unit's health check and Prometheus' scrape, on the real process with its real loop.
        deadline = time.monotonic() + 60
        while "det_loop_ticks_total" not in (text := httpx.get(f"{m.url}/metrics", timeout=5).text):
            assert time.monotonic() < deadline, text[-2000:]
            time.sleep(0.2)
        health = httpx.get(f"{m.url}/health", timeout=5)
        assert health.status_code == 200 and health.json()["lastTickAgeSeconds"] is not None, health.text
        assert m.stop(signal.SIGINT) == 0, m.log()
    finally:
        m.close()
    assert m.messages[-3:] == ["STOPPING=1", "STATUS=stopping: draining requests", "STATUS=stopped"], (
        m.messages
    )


def test_start_stop_kill_restart_sequence(tmp_path: Path) -> None:
    """What ``Restart=on-failure`` does, on the real process: start, stop (0), start, a crash (SIGKILL: the
    unit restarts it), start again on the same state; a config error exits 2 (``RestartPreventExitStatus``),
    a port in use exits non-zero (restarted until it is free)."""
    db = tmp_path / "master.db"
    env = master_env(tmp_path, DET_DB_URL=f"sqlite:///{db}")
    port = free_port()
    m = start_master(tmp_path, env=env, port=port)
    assert m.stop() == 0, m.log()
    m = start_master(tmp_path, env=env, port=port)
    with httpx.Client(base_url=m.url, timeout=10) as http:
        users_before = http.get("/api/v1/master").json()["clusterId"]
    assert m.stop(signal.SIGKILL) == -signal.SIGKILL
    m = start_master(tmp_path, env=env, port=port)
    try:
        assert httpx.get(f"{m.url}/api/v1/master", timeout=5).json()["clusterId"] == users_before
        busy = start_master(tmp_path / "second", port=port, wait_ready=False)
        assert busy.proc.wait(60) != 0
        busy.close()
        assert "READY=1" not in busy.messages
    finally:
        assert m.stop() == 0, m.log()
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen:\n  hots: 0.0.0.0\n")
    broken = start_master(tmp_path, "--config", str(bad), env=env, wait_ready=False)
    assert broken.proc.wait(60) == 2
    broken.close()
    assert "listen.hots" in broken.log() and "did you mean `host`" in broken.log()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_logs_carry_journald_priorities_when_stderr_is_the_journal(tmp_path: Path) -> None:
    """Under systemd stderr is the journal's stream (``$JOURNAL_STREAM`` names it): each line starts with its
    syslog priority and carries no timestamp (journald adds it); elsewhere lines keep their timestamps."""
    m = start_master(tmp_path, journal=True)
    assert m.stop() == 0
    lines = [line for line in m.log().splitlines() if line]
    assert lines and all(re.match(r"<[0-7]>[a-z_.]+: ", line) for line in lines), lines
    assert any(line.startswith("<6>uvicorn.error: Uvicorn running on http://127.0.0.1:") for line in lines)
    assert "<6>hpc_master: stopped" in lines
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: {port: http}\n")
    broken = start_master(tmp_path, "--config", str(bad), journal=True, wait_ready=False)
    assert broken.proc.wait(60) == 2
    broken.close()
    assert f"<3>det-master: {bad}: listen.port: " in broken.log()
    plain = start_master(tmp_path / "plain")
    assert plain.stop() == 0
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ INFO ", plain.log())
