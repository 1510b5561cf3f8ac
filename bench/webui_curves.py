"""Web UI learning curves at scale: the curves request and the experiment page against their baselines.

    .venv/bin/python bench/webui_curves.py [--quick] [--trials N] [--points P] [--out FILE]

An experiment of 1,000 trials × 10,000 training reports each (``loss``, every 10 batches; plus 10 validation
reports per trial) is written straight into a SQLite database (``executemany`` in batches of 200,000 rows),
next to a 1-trial experiment of the same length. Then, against the master's app under uvicorn (one process,
loopback, started fresh for each part):

(a) ``GET /api/v1/experiments/{id}/metrics-stream/trials-sample?metricName=loss&group=training&maxDatapoints=1000``
    (what the page asks): **cold** (the first request after the master starts) and **warm** (median of the
    next five), against reading the raw points of the same data (one SQL query of every row, ``fetchall``) and
    against the 1-trial experiment's request.
(b) The experiment page in real Chromium (Debian's, through Playwright): navigation start → the curves drawn
    and painted (the page's ``data-drawn-at`` marker, ``performance.now()`` in the frame after uPlot drew),
    cold (first page after the master starts) and warm, against the 1-trial experiment's page.

The issue's targets: the curves request ≤ 200 ms, the page interactive ≤ 2 s. ``--quick``: 100 trials × 1,000
points (seconds). Results are printed; ``--out`` (default ``bench/webui_curves_results.md`` for a full run,
none for ``--quick``) also writes them as Markdown.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import math
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpc_master.db.engine import make_engine, make_sessionmaker, transaction  # noqa: E402
from hpc_master.db.migrate import upgrade_to_head  # noqa: E402
from tests.webui.seed import seed_experiment, seed_user  # noqa: E402

PASSWORD = "bench-pw"
EVERY = 10
VALIDATIONS = 10
BATCH_ROWS = 200_000
WARM_REPEATS = 5
CHROMIUM = os.environ.get("DET_TEST_CHROMIUM", "/usr/bin/chromium")
TARGET_REQUEST_MS = 200.0
TARGET_PAGE_MS = 2000.0

SERVE = """
import sys, uvicorn
from hpc_master.api.app import create_app
from hpc_master.masterconf import parse_master_config
url, port = sys.argv[1], int(sys.argv[2])
config = parse_master_config({"db": {"url": url}, "listen": {"host": "127.0.0.1", "port": port},
    "security": {"require_passwords": True, "admin_password": "admin-pw"}}, env={})
uvicorn.run(create_app(config), host="127.0.0.1", port=port, log_level="warning")
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------- the database


def _loss(trial: int, steps: Any, lr: float) -> Any:
    import numpy as np

    rng = np.random.default_rng(trial)
    rate = 0.2 + 4 * min(lr, 0.5)
    return (
        0.08
        + 2.2 * np.exp(-rate * steps / (steps[-1] / 5)) * (1 + 0.25 * (trial % 7) / 7)
        + rng.normal(0, 0.03, len(steps))
    )


def _rows(trial_id: int, index: int, points: int, lr: float, now: str) -> Iterator[tuple[Any, ...]]:
    import numpy as np

    steps = np.arange(1, points + 1, dtype=np.int64) * EVERY
    values = _loss(index, steps, lr).tolist()
    for step, value in zip(steps.tolist(), values, strict=True):
        yield (trial_id, 1, "training", step, f'{{"avgMetrics": {{"loss": {value!r}}}}}', now)
    for v in range(VALIDATIONS):
        step = int(steps[-1]) * (v + 1) // VALIDATIONS
        loss = values[step // EVERY - 1] + 0.05
        yield (
            trial_id,
            1,
            "validation",
            step,
            f'{{"avgMetrics": {{"validation_loss": {loss!r}, "accuracy": {1 - loss / 2.5!r}}}}}',
            now,
        )


def build_database(path: Path, trials: int, points: int) -> dict[str, Any]:
    """The schema (migrations), a user, both experiments (trials, runs, checkpoints through the ORM), then
    the metric rows through sqlite3's executemany. Returns the ids and how long the rows took."""
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    upgrade_to_head(engine)
    sessions = make_sessionmaker(engine)
    with transaction(sessions) as s:
        user = seed_user(s, "bench", PASSWORD)
        big, big_trials = seed_experiment(
            s, user, name=f"curves-{trials}", trials=trials, points=points, write_metrics=False
        )
        one, one_trials = seed_experiment(
            s, user, name="curves-1", trials=1, points=points, write_metrics=False
        )
        lrs = {t: 10 ** (-4 + 3.5 * (i % 17) / 16) for i, t in enumerate([*big_trials, *one_trials])}
    engine.dispose()
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    started = time.perf_counter()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    sql = (
        'INSERT INTO metrics (trial_id, trial_run_id, "group", steps_completed, metrics, report_time) '
        "VALUES (?, ?, ?, ?, ?, ?)"
    )
    batch: list[tuple[Any, ...]] = []
    rows = 0
    for index, trial_id in enumerate([*big_trials, *one_trials]):
        batch.extend(_rows(trial_id, index, points, lrs[trial_id], now))
        if len(batch) >= BATCH_ROWS:
            conn.executemany(sql, batch)
            rows += len(batch)
            batch = []
    conn.executemany(sql, batch)
    rows += len(batch)
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    write_s = time.perf_counter() - started
    return {"url": url, "big": big, "one": one, "rows": rows, "write_s": write_s}


def raw_query_ms(path: Path, experiment: int) -> tuple[float, int]:
    """The raw points of the same data: one SQL query of every training row of the experiment."""
    conn = sqlite3.connect(path)
    started = time.perf_counter()
    rows = conn.execute(
        'SELECT trial_id, steps_completed, metrics FROM metrics WHERE "group" = ? AND trial_id IN '
        "(SELECT id FROM trials WHERE experiment_id = ?)",
        ("training", experiment),
    ).fetchall()
    elapsed = (time.perf_counter() - started) * 1000
    conn.close()
    return elapsed, len(rows)


# ---------------------------------------------------------------- the master


class Master:
    def __init__(self, url: str, workdir: Path) -> None:
        self.port = free_port()
        self.log = open(workdir / f"master-{self.port}.log", "wb")  # noqa: SIM115
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "HOME": str(workdir),
            "DET_MASTER_DATA_DIR": str(workdir),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, url, str(self.port)],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _ = self.get("/api/v1/master", auth=False)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"the master did not start; see {self.log.name}")
            time.sleep(0.1)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request(
            "POST",
            "/api/v1/auth/login",
            body=json.dumps({"username": "bench", "password": PASSWORD}),
            headers={"Content-Type": "application/json"},
        )
        self.token = json.loads(conn.getresponse().read())["token"]
        conn.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, *, auth: bool = True) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        headers = {"Authorization": f"Bearer {self.token}"} if auth else {}
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        return resp.status, body

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


POINT_BUDGET = 320_000
"""The page's budget (``pointsPerTrial`` in webui/js/pages/experiment.js, for a chart ≥ 1,000 px wide)."""


def page_points(trials: int) -> int:
    """The ``maxDatapoints`` the experiment page asks for an experiment of ``trials`` trials."""
    return max(32, min(1000, POINT_BUDGET // max(1, trials)))


def sample_path(experiment: int, max_points: int) -> str:
    return (
        f"/api/v1/experiments/{experiment}/metrics-stream/trials-sample"
        f"?metricName=loss&group=training&maxDatapoints={max_points}"
    )


def timed_request(master: Master, experiment: int, max_points: int) -> tuple[float, int, int]:
    """(ms, bytes, points) of one trials-sample request (the whole response read)."""
    started = time.perf_counter()
    status, body = master.get(sample_path(experiment, max_points))
    elapsed = (time.perf_counter() - started) * 1000
    assert status == 200, body[:300]
    message = json.loads(body.splitlines()[0])["result"]
    return elapsed, len(body), sum(len(t["data"]) for t in message["trials"])


def bench_requests(url: str, workdir: Path, db: dict[str, Any], trials: dict[str, int]) -> dict[str, Any]:
    """Each experiment's request as the page asks it (cold, then warm), and warm at Determined's
    ``maxDatapoints=1000``."""
    master = Master(url, workdir)
    try:
        out: dict[str, Any] = {}
        for name in ("big", "one"):
            asked = page_points(trials[name])
            cold, size, points = timed_request(master, db[name], asked)
            warm = [timed_request(master, db[name], asked)[0] for _ in range(WARM_REPEATS)]
            timed_request(master, db[name], 1000)
            full = [timed_request(master, db[name], 1000) for _ in range(WARM_REPEATS)]
            out[name] = {
                "asked": asked,
                "cold": cold,
                "warm": statistics.median(warm),
                "bytes": size,
                "points": points,
                "warm_1000": statistics.median(f[0] for f in full),
                "bytes_1000": full[0][1],
                "points_1000": full[0][2],
            }
        return out
    finally:
        master.stop()


def keeper_pass(url: str) -> tuple[float, int]:
    """What det-master's curve keeper does in the background once it sees the rows (here in one pass over
    every row, as after an upgrade): (seconds, curves saved)."""
    from sqlalchemy import func, select

    from hpc_master.db.models import MetricCurveModel
    from hpc_master.services.curves.experiment import CurveCache
    from hpc_master.services.curves.keeper import CurveKeeper

    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    started = time.perf_counter()
    CurveKeeper(CurveCache(), lambda: transaction(sessions)).run_once()
    elapsed = time.perf_counter() - started
    with transaction(sessions) as s:
        saved = int(s.scalar(select(func.count()).select_from(MetricCurveModel)) or 0)
    engine.dispose()
    return elapsed, saved


# ---------------------------------------------------------------- the page


def bench_pages(url: str, workdir: Path, db: dict[str, Any], repeats: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    master = Master(url, workdir)
    out: dict[str, Any] = {}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM,
                args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
            )
            context = browser.new_context(viewport={"width": 1400, "height": 900}, base_url=master.url)
            page = context.new_page()
            page.goto("/login")
            page.fill("input[name=username]", "bench")
            page.fill("input[name=password]", PASSWORD)
            page.click("button[type=submit]")
            page.wait_for_url("**/experiments*")

            def load(experiment: int) -> float:
                page.goto(f"/experiments/{experiment}?group=training&metric=loss")
                page.wait_for_selector("#learning-curves[data-drawn-at]", timeout=600_000)
                return float(page.get_attribute("#learning-curves", "data-drawn-at") or "nan")

            for name in ("big", "one"):
                cold = load(db[name])
                warm = [load(db[name]) for _ in range(repeats)]
                out[name] = {"cold": cold, "warm": statistics.median(warm)}
            out["series"] = page.get_attribute("#learning-curves", "data-series")
            browser.close()
        return out
    finally:
        master.stop()


# ---------------------------------------------------------------- report


def report(
    args: argparse.Namespace,
    db: dict[str, Any],
    unsaved: dict[str, Any],
    keeper: tuple[float, int],
    req: dict[str, Any],
    raw: tuple[float, int],
    pages: dict[str, Any],
) -> str:
    big, one = req["big"], req["one"]
    raw_ms, raw_rows = raw
    base = one["warm"]

    def ok(value: float, target: float) -> str:
        return "yes" if value <= target else "**no**"

    def row(label: str, asked: int, ms: float) -> str:
        return (
            f"| {label} | {asked:,} | {ms:,.1f} | {ms / raw_ms:.4f} | {ms / base:.1f}× | "
            f"{ok(ms, TARGET_REQUEST_MS)} |"
        )

    n = f"{args.trials:,} trials"
    lines = [
        f"## {datetime.date.today()}: {args.trials:,} trials × {args.points:,} points "
        f"({db['rows']:,} metric rows), {os.cpu_count()} CPUs{' (--quick)' if args.quick else ''}",
        "",
        f"Writing the rows: {db['write_s']:.1f} s ({db['rows'] / db['write_s']:,.0f} rows/s, sqlite3 executemany "
        f"in batches of {BATCH_ROWS:,}), behind the master's back. The curve keeper's pass over all of them "
        f"(what det-master's background thread does once it sees rows it has not read; here every row at "
        f"once, as after an upgrade): {keeper[0]:.1f} s, {keeper[1]:,} curves saved.",
        "",
        "| learning-curve request (trials-sample) | maxDatapoints | ms | vs raw query | vs 1-trial warm "
        "| target 200 ms |",
        "|---|---:|---:|---:|---:|---|",
        row(f"{n}, first request after start, nothing saved (reads every row)", big["asked"], unsaved["big"]),
        row(f"{n}, first request after a restart (from the saved curves)", big["asked"], big["cold"]),
        row(f"{n}, warm (median of {WARM_REPEATS})", big["asked"], big["warm"]),
        row(f"{n}, warm, Determined's default maxDatapoints", 1000, big["warm_1000"]),
        f"| raw points: one SQL query of all {raw_rows:,} training rows (fetchall) | – | {raw_ms:,.0f} | 1.00 | "
        f"{raw_ms / base:.0f}× | – |",
        row("1 trial, first request after start, nothing saved", one["asked"], unsaved["one"]),
        row("1 trial, first request after a restart", one["asked"], one["cold"]),
        row("1 trial, warm", one["asked"], one["warm"]),
        "",
        f"The {n}' response as the page asks it: {big['points']:,} points, {big['bytes'] / 1e6:.1f} MB; at "
        f"maxDatapoints=1000: {big['points_1000']:,} points, {big['bytes_1000'] / 1e6:.1f} MB (the 1-trial one: "
        f"{one['points']:,} points, {one['bytes'] / 1e3:.0f} KB).",
        "",
        "| experiment page, navigation start → curves drawn (Chromium; curves saved) | ms | vs 1-trial warm "
        "| target 2 s |",
        "|---|---:|---:|---|",
    ]
    for name, label in (("big", n), ("one", "1 trial")):
        p = pages[name]
        for kind in ("cold", "warm"):
            label_kind = "first page after a restart" if kind == "cold" else "warm (median)"
            lines.append(
                f"| {label}, {label_kind} | {p[kind]:,.0f} | {p[kind] / pages['one']['warm']:.1f}× | "
                f"{ok(p[kind], TARGET_PAGE_MS)} |"
            )
    return "\n".join(lines) + "\n"


def first_requests(url: str, workdir: Path, db: dict[str, Any], trials: dict[str, int]) -> dict[str, float]:
    """The first request for each experiment after a start with nothing saved (each in a master of its own)."""
    out = {}
    for name in ("big", "one"):
        master = Master(url, workdir)
        try:
            out[name] = timed_request(master, db[name], page_points(trials[name]))[0]
        finally:
            master.stop()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="100 trials × 1,000 points")
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--points", type=int, default=None)
    parser.add_argument("--page-repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="append the results (Markdown) to this file")
    args = parser.parse_args()
    args.trials = args.trials or (100 if args.quick else 1000)
    args.points = args.points or (1000 if args.quick else 10_000)
    out = (
        args.out
        if args.out is not None
        else (None if args.quick else str(ROOT / "bench/webui_curves_results.md"))
    )
    workdir = Path(tempfile.mkdtemp(prefix="hpc-det-bench-curves-"))
    trials = {"big": args.trials, "one": 1}
    try:
        path = workdir / "master.db"
        print(f"# writing {args.trials:,} trials × {args.points:,} points into {path}", flush=True)
        db = build_database(path, args.trials, args.points)
        print(f"  {db['rows']:,} rows in {db['write_s']:.1f} s", flush=True)
        raw = raw_query_ms(path, db["big"])
        print(f"  raw query: {raw[0]:,.0f} ms for {raw[1]:,} rows", flush=True)
        unsaved = first_requests(db["url"], workdir, db, trials)
        print(f"  first requests, nothing saved: {unsaved}", flush=True)
        keeper = keeper_pass(db["url"])
        print(f"  keeper pass: {keeper[0]:.1f} s, {keeper[1]} curves", flush=True)
        req = bench_requests(db["url"], workdir, db, trials)
        print(f"  requests: {req}", flush=True)
        pages = bench_pages(db["url"], workdir, db, args.page_repeats)
        print(f"  pages: {pages}", flush=True)
        text = report(args, db, unsaved, keeper, req, raw, pages)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(text)
    if out:
        with open(out, "a") as f:
            f.write("\n" + text)
    return 0 if not math.isnan(pages["big"]["cold"]) else 1


if __name__ == "__main__":
    sys.exit(main())
