"""Metric ingest benchmark: rows/s accepted through the real HTTP API vs raw inserts, and a kill -9 check.

    .venv/bin/python bench/metrics_ingest.py [--pg-url URL] [--quick]

For each backend (SQLite always; PostgreSQL with --pg-url or DET_TEST_PG_URL) and batch size 1, 10, 100: start
``det-master`` (uvicorn, one process) on a loopback port, drive ``POST /api/v1/trials/{id}/metrics/batch`` from
client processes (each a closed loop with one request in flight, keep-alive), and count rows acknowledged per
second. Next to it, the raw rate of inserting the same rows into the same database (DBAPI ``executemany`` of
the same INSERT … ON CONFLICT DO NOTHING, one transaction per batch). Once per batch size, the HTTP ceiling: the
same clients against the same server stack running an app that only parses the body (``bench/_ingest_ceiling.py``),
which bounds what any ingest route can accept on this machine. Then a durability check: stream batches,
``kill -9`` the master mid-stream, and verify every row of every 2xx-acknowledged batch is in the database.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpc_master.db.engine import make_engine, make_sessionmaker, transaction  # noqa: E402
from hpc_master.db.migrate import upgrade_to_head  # noqa: E402
from hpc_master.db.models import MetricModel, UserModel  # noqa: E402
from hpc_master.services import lifecycle  # noqa: E402
from hpc_master.services.experiments import create_experiment  # noqa: E402
from hpc_master.services.users import Principal  # noqa: E402

BATCH_SIZES = (1, 10, 100)
CONFIG = "name: bench\nentrypoint: python3 train.py\nsearcher:\n  name: single\n  metric: loss\n  max_length:\n    batches: 1\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def metric_item(run: int, step: int) -> dict[str, Any]:
    return {
        "trialRunId": run,
        "stepsCompleted": step,
        "group": "training",
        "metrics": {"avgMetrics": {"loss": 1.0 / (step + 1), "accuracy": step / (step + 1), "lr": 0.001}},
        "reportTime": datetime.datetime.now(datetime.UTC).isoformat(),  # as harness.core sends it
    }


# ---------------------------------------------------------------- setup and master process


@dataclass
class Target:
    url: str
    trial_ids: list[int]
    tokens: list[str]


def prepare(url: str, trials: int) -> Target:
    engine = make_engine(url)
    upgrade_to_head(engine)
    sessions = make_sessionmaker(engine)
    with transaction(sessions) as s:
        user = s.scalar(select(UserModel).where(UserModel.username == "bench"))
        if user is None:
            user = UserModel(username="bench", password_hash="")
            s.add(user)
            s.flush()
        principal = Principal(user_id=user.id, username="bench", admin=False)
        exp, _ = create_experiment(s, principal, config_text=CONFIG, model_definition=[], activate=True)
        assert exp is not None
        ids, tokens = [], []
        for i in range(trials):
            trial = lifecycle.create_trial(s, exp.id, f"bench-{uuid.uuid4().hex[:8]}-{i}", {})
            ids.append(trial.id)
            tokens.append(lifecycle.mint_trial_token(s, trial.id))
    engine.dispose()
    return Target(url, ids, tokens)


def wait_listening(proc: subprocess.Popen[bytes], port: int, workdir: Path) -> subprocess.Popen[bytes]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/api/v1/master")
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server on port {port} did not start; see {workdir}")


def start_ceiling(port: int, workdir: Path) -> subprocess.Popen[bytes]:
    log = open(workdir / f"ceiling-{port}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("_ingest_ceiling.py")), str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return wait_listening(proc, port, workdir)


def start_master(db_url: str, port: int, workdir: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DET_DB_URL": db_url,
        "DET_MASTER_DATA_DIR": str(workdir),
        "DET_CHECKPOINT_ROOT": str(workdir / "ckpt"),
        "PYTHONPATH": str(ROOT),
    }
    log = open(workdir / f"master-{port}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpc_master.server", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return wait_listening(proc, port, workdir)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------- load generation


def connect(port: int, timeout_s: float) -> http.client.HTTPConnection:
    """Keep-alive connection with TCP_NODELAY: http.client sends headers and body in two writes, and with
    Nagle on, the body waits for the delayed ACK of the headers (~3-40 ms per request on Linux)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    conn.connect()
    assert conn.sock is not None
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


_METRICS = '{"avgMetrics":{"loss":%r,"accuracy":%r,"lr":0.001}}'
"""A row's metrics (loss, accuracy) as ``metric_item`` has them, as JSON text."""
_ITEM = (
    '{"trialRunId":%d,"stepsCompleted":%d,"group":"training","metrics":' + _METRICS + ',"reportTime":"%s"}'
)


def batch_body(run: int, first_step: int, batch: int) -> bytes:
    """The body ``metric_item`` rows give, in the harness's form, built by string formatting (~2 µs a row
    instead of ~4 for dicts + ``json.dumps``). One ``reportTime`` per batch, in the harness's layout."""
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")
    items = [_ITEM % (run, s, 1.0 / (s + 1), s / (s + 1), now) for s in range(first_step, first_step + batch)]
    return b'{"metrics":[' + ",".join(items).encode() + b"]}"


class LeanClient:
    """A keep-alive HTTP/1.1 client that writes each request with one ``sendall`` and reads the answer by its
    Content-Length. ``http.client`` spends ~0.5 ms of client CPU per request (two writes, headers parsed
    by ``email``); on a small host that the clients share with the master, that is CPU the master loses,
    so the load generator, not the master, would be measured."""

    def __init__(self, port: int, timeout_s: float) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def post(self, path: str, headers: bytes, body: bytes) -> tuple[int, bytes]:
        self.sock.sendall(
            b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%sContent-Length: %d\r\n\r\n%s"
            % (path.encode(), headers, len(body), body)
        )
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = next(
            int(v) for k, _, v in (x.partition(b":") for x in lines[1:]) if k.lower() == b"content-length"
        )
        while len(self.buf) < length:
            self._fill()
        payload, self.buf = self.buf[:length], self.buf[length:]
        return status, payload

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buf += chunk


def client_loop(
    port: int, trial_id: int, token: str, batch: int, duration_s: float, run: int, out: Any
) -> None:
    """One client: closed loop, one request in flight. Reports (rows acked, requests, errors, CPU seconds)."""
    conn = LeanClient(port, 30)
    headers = b"Authorization: Bearer %s\r\nContent-Type: application/json\r\n" % token.encode()
    path = f"/api/v1/trials/{trial_id}/metrics/batch"
    step, acked, requests, errors = 0, 0, 0, 0
    cpu0 = time.process_time()
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline:
        status, payload = conn.post(path, headers, batch_body(run, step, batch))
        requests += 1
        if status == 200:
            acked += int(json.loads(payload)["accepted"])
            step += batch
        else:
            errors += 1
    out.put((acked, requests, errors, time.process_time() - cpu0))


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process and its children (the master's ingest worker)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            _, _, rest = stat.read_text().rpartition(")")
        except OSError:
            continue  # exited meanwhile
        fields = rest.split()
        if int(stat.parent.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


@dataclass
class Rate:
    rows_s: float
    errors: int
    server_us_row: float  # server CPU per accepted row: all its threads and child processes
    client_us_row: float  # load generator CPU per accepted row, all clients


def api_rate(
    port: int, server_pid: int, target: Target, batch: int, clients: int, duration_s: float, run: int
) -> Rate:
    queue: Any = mp.Queue()
    procs = [
        mp.Process(
            target=client_loop,
            args=(port, target.trial_ids[i], target.tokens[i], batch, duration_s, run, queue),
        )
        for i in range(clients)
    ]
    cpu0 = process_cpu_s(server_pid)
    start = time.monotonic()
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    elapsed = time.monotonic() - start
    server_cpu = process_cpu_s(server_pid) - cpu0
    for p in procs:
        p.join()
    acked = sum(r[0] for r in results)
    per_row = 1e6 / max(acked, 1)
    return Rate(
        acked / elapsed,
        sum(r[2] for r in results),
        server_cpu * per_row,
        sum(r[3] for r in results) * per_row,
    )


def raw_rate(url: str, trial_id: int, batch: int, duration_s: float, run: int) -> float:
    """The same rows, the same INSERT … ON CONFLICT DO NOTHING, one transaction per batch, via the DBAPI
    (rows built by string formatting, as the clients build theirs)."""
    engine = create_engine(url)
    is_pg = engine.dialect.name == "postgresql"
    sql = 'INSERT INTO metrics (trial_id, trial_run_id, "group", steps_completed, metrics, report_time) ' + (
        "VALUES (%s, %s, %s, %s, %s, now()) ON CONFLICT DO NOTHING"
        if is_pg
        else "VALUES (?, ?, ?, ?, ?, datetime('now')) ON CONFLICT DO NOTHING"
    )
    raw: Any = engine.raw_connection()
    dbapi = raw.driver_connection
    if not is_pg:
        dbapi.isolation_level = None
        dbapi.execute("PRAGMA journal_mode=WAL")
        dbapi.execute("PRAGMA synchronous=NORMAL")
        dbapi.execute("PRAGMA busy_timeout=10000")
    rows_done, step = 0, 0
    start = time.monotonic()
    deadline = start + duration_s
    while time.monotonic() < deadline:
        params = [
            (trial_id, run, "training", s, _METRICS % (1.0 / (s + 1), s / (s + 1)))
            for s in range(step, step + batch)
        ]
        if is_pg:
            with dbapi.transaction(), dbapi.cursor() as cur:
                cur.executemany(sql, params)
        else:
            dbapi.execute("BEGIN IMMEDIATE")
            dbapi.executemany(sql, params)
            dbapi.execute("COMMIT")
        rows_done += batch
        step += batch
    elapsed = time.monotonic() - start
    raw.close()
    engine.dispose()
    return rows_done / elapsed


# ---------------------------------------------------------------- durability after kill -9


def durability(db_url: str, workdir: Path, target: Target, kill_after_s: float) -> tuple[int, int, int]:
    """Stream batches of 10 to a master, SIGKILL it mid-stream; returns (rows acked, acked rows found, lost)."""
    port = free_port()
    proc = start_master(db_url, port, workdir)
    trial_id, token = target.trial_ids[-1], target.tokens[-1]
    conn = connect(port, 5)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    acked_steps: list[int] = []
    step = 0
    killed_at = time.monotonic() + kill_after_s
    killed = False
    while True:
        if not killed and time.monotonic() >= killed_at:
            os.kill(proc.pid, signal.SIGKILL)
            killed = True
        items = [metric_item(7, step + i) for i in range(10)]
        try:
            conn.request(
                "POST",
                f"/api/v1/trials/{trial_id}/metrics/batch",
                body=json.dumps({"metrics": items}),
                headers=headers,
            )
            resp = conn.getresponse()
            resp.read()
        except (OSError, http.client.HTTPException):
            break
        if resp.status == 200:
            acked_steps.extend(it["stepsCompleted"] for it in items)
        step += 10
    proc.wait()
    engine = create_engine(db_url)
    with engine.connect() as c:
        stored = set(
            c.execute(
                select(MetricModel.steps_completed).where(
                    MetricModel.trial_id == trial_id, MetricModel.trial_run_id == 7
                )
            ).scalars()
        )
    engine.dispose()
    found = sum(1 for s in acked_steps if s in stored)
    return len(acked_steps), found, len(acked_steps) - found


# ---------------------------------------------------------------- main


def fresh_pg_database(base_url: str) -> tuple[str, Any]:
    name = f"hpcdet_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(base_url).set(database=name).render_as_string(hide_password=False)

    def drop() -> None:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return url, drop


def bench_backend(
    name: str, db_url: str, workdir: Path, duration_s: float, clients: int
) -> list[dict[str, Any]]:
    target = prepare(db_url, trials=clients + 2)
    rows: list[dict[str, Any]] = []
    port = free_port()
    proc = start_master(db_url, port, workdir)
    try:
        for run, batch in enumerate(BATCH_SIZES, start=1):
            api = api_rate(port, proc.pid, target, batch, clients, duration_s, run)
            raw = raw_rate(db_url, target.trial_ids[clients], batch, duration_s, run)
            rows.append({"backend": name, "batch": batch, "api": api, "raw": raw})
            print(
                f"  {name} batch={batch}: api {api.rows_s:,.0f} rows/s (server {api.server_us_row:.1f} µs/row, "
                f"clients {api.client_us_row:.1f} µs/row), raw {raw:,.0f} rows/s, errors {api.errors}",
                flush=True,
            )
    finally:
        stop(proc)
    if name == "sqlite":  # the HTTP ceiling does not depend on the database: measured once
        port = free_port()
        proc = start_ceiling(port, workdir)
        try:
            for run, batch in enumerate(BATCH_SIZES, start=11):
                ceiling = api_rate(port, proc.pid, target, batch, clients, duration_s, run)
                rows.append({"backend": "HTTP ceiling (no DB)", "batch": batch, "ceiling": ceiling})
                print(
                    f"  HTTP ceiling batch={batch}: {ceiling.rows_s:,.0f} rows/s "
                    f"(server {ceiling.server_us_row:.1f} µs/row), errors {ceiling.errors}",
                    flush=True,
                )
        finally:
            stop(proc)
    acked, found, lost = durability(db_url, workdir, target, kill_after_s=1.0 if duration_s < 3 else 2.0)
    rows.append({"backend": name, "durability": (acked, found, lost)})
    with create_engine(db_url).connect() as c:
        total = c.execute(select(func.count()).select_from(MetricModel)).scalar_one()
    print(f"  {name}: {total:,} metric rows stored in total", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pg-url", default=os.environ.get("DET_TEST_PG_URL"), help="PostgreSQL server URL")
    parser.add_argument("--quick", action="store_true", help="2 s per measurement instead of 6 s")
    parser.add_argument("--clients", type=int, default=4, help="concurrent client processes")
    args = parser.parse_args()
    duration_s = 2.0 if args.quick else 6.0
    workdir = Path(tempfile.mkdtemp(prefix="hpc-det-bench-"))
    results: list[dict[str, Any]] = []
    try:
        print(
            f"# metrics ingest ({os.cpu_count()} CPUs, {args.clients} clients, {duration_s:.0f} s each)",
            flush=True,
        )
        results += bench_backend(
            "sqlite", f"sqlite:///{workdir / 'bench.db'}", workdir, duration_s, args.clients
        )
        if args.pg_url:
            url, drop = fresh_pg_database(args.pg_url)
            try:
                results += bench_backend("postgresql", url, workdir, duration_s, args.clients)
            finally:
                drop()
        else:
            print("  (PostgreSQL skipped: pass --pg-url or set DET_TEST_PG_URL)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    ceilings = {r["batch"]: r["ceiling"].rows_s for r in results if "ceiling" in r}
    print(
        "| backend | batch | API rows/s | raw insert rows/s | API / raw | API / HTTP ceiling "
        "| server CPU µs/row | client CPU µs/row | errors |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        if "ceiling" in r:
            c = r["ceiling"]
            print(
                f"| {r['backend']} | {r['batch']} | {c.rows_s:,.0f} | – | – | 1.00 | {c.server_us_row:.1f} "
                f"| {c.client_us_row:.1f} | {c.errors} |"
            )
        elif "batch" in r:
            a = r["api"]
            print(
                f"| {r['backend']} | {r['batch']} | {a.rows_s:,.0f} | {r['raw']:,.0f} | "
                f"{a.rows_s / r['raw']:.2f} | {a.rows_s / ceilings.get(r['batch'], float('nan')):.2f} | "
                f"{a.server_us_row:.1f} | {a.client_us_row:.1f} | {a.errors} |"
            )
    print()
    print("| backend | kill -9 mid-stream: rows acked (2xx) | acked rows in DB | lost |")
    print("|---|---:|---:|---:|")
    lost_any = False
    for r in results:
        if "durability" in r:
            acked, found, lost = r["durability"]
            lost_any |= lost > 0
            print(f"| {r['backend']} | {acked:,} | {found:,} | {lost} |")
    return 1 if lost_any else 0


if __name__ == "__main__":
    sys.exit(main())
