"""The reads of ``bench/pg_scale_reads.py``, and a real ``det-master`` to time them against.

The master is ``python -m hpc_master.server`` (lifecycle loop and curve keeper included) on a loopback port,
with Slurm's commands shadowed on its PATH by stubs that answer "Unable to contact slurm controller": the
database holds running trials with job ids, and the master must neither submit to nor reconcile with any
real cluster on this machine. The stubs log every call, and the report says how many there were.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SLURM_COMMANDS = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo", "sprio", "sshare", "srun")
_STUB = """#!/bin/sh
echo "$(basename "$0") $*" >> {log}
echo "$(basename "$0"): error: Unable to contact slurm controller (connect failure)" >&2
exit 1
"""


@dataclass(frozen=True)
class Read:
    name: str
    path: str
    count: Callable[[bytes], int]
    """How many items (rows) the answer holds."""


def _items(key: str) -> Callable[[bytes], int]:
    return lambda body: len(json.loads(body)[key])


def _stream_items(key: str) -> Callable[[bytes], int]:
    return lambda body: sum(
        len(json.loads(line)["result"][key]) for line in body.splitlines() if line.strip()
    )


def _series_points(body: bytes) -> int:
    return sum(len(m["data"]) for t in json.loads(body)["trials"] for m in t["metrics"])


def reads(ids: dict[str, Any]) -> list[Read]:
    """The main reads: what `det e list`, the web UI's pages and Determined's client ask most."""
    big, typical, long_trial, trial = ids["big"], ids["typical"], ids["long_trial"], ids["trial"]
    sample = (
        "/api/v1/experiments/{}/metrics-stream/trials-sample?metricName=loss&group=training&maxDatapoints={}"
    )
    out = [
        Read("experiments list (det e list: GET /experiments)", "/api/v1/experiments", _items("experiments")),
        Read(
            "experiments list (web UI: /webui/experiments, limit 200)",
            "/api/v1/webui/experiments?archived=false&sortBy=id&orderBy=ORDER_BY_DESC&limit=200",
            _items("experiments"),
        ),
    ]
    for label, exp in (("largest", big), ("typical", typical)):
        n = f"{label} experiment ({ids['trials_of'][exp]:,} trials)"
        out += [
            Read(f"{n}: detail", f"/api/v1/experiments/{exp}", lambda b: 1),
            Read(
                f"{n}: trials (GET /experiments/{{id}}/trials)",
                f"/api/v1/experiments/{exp}/trials",
                _items("trials"),
            ),
            Read(f"{n}: trials (web UI table)", f"/api/v1/webui/experiments/{exp}/trials", _items("trials")),
            Read(f"{n}: checkpoints", f"/api/v1/experiments/{exp}/checkpoints", _items("checkpoints")),
            Read(
                f"{n}: learning curves (web UI, maxDatapoints {ids['points_of'][exp]})",
                sample.format(exp, ids["points_of"][exp]),
                _stream_items("trials"),
            ),
        ]
    for label, t in (("longest", long_trial), ("typical", trial)):
        n = f"{label} trial ({ids['rows_of'][t]:,} metric rows)"
        out += [
            Read(f"{n}: detail", f"/api/v1/trials/{t}", lambda b: 1),
            Read(
                f"{n}: metrics (GET /trials/{{id}}/metrics)", f"/api/v1/trials/{t}/metrics", _items("metrics")
            ),
            Read(
                f"{n}: training metrics (Determined client stream)",
                f"/api/v1/trials/metrics/trial_metrics?trialIds={t}&group=training",
                _stream_items("metrics"),
            ),
            Read(
                f"{n}: validation metrics (Determined client stream)",
                f"/api/v1/trials/metrics/trial_metrics?trialIds={t}&group=validation",
                _stream_items("metrics"),
            ),
            Read(f"{n}: checkpoints", f"/api/v1/trials/{t}/checkpoints", _items("checkpoints")),
            Read(
                f"{n}: time series (web UI trial page)",
                f"/api/v1/trials/time-series?trialIds={t}&maxDatapoints=1000",
                _series_points,
            ),
        ]
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def slurm_stubs(workdir: Path) -> tuple[Path, Path]:
    """A directory of Slurm command stubs (put first on PATH) and the file they log their calls to."""
    bin_dir, log = workdir / "slurm-stubs", workdir / "slurm-calls.log"
    bin_dir.mkdir(parents=True, exist_ok=True)
    log.touch()
    for name in SLURM_COMMANDS:
        path = bin_dir / name
        path.write_text(_STUB.format(log=log))
        path.chmod(0o755)
    return bin_dir, log


class Master:
    """det-master on a loopback port, logged in as ``username``."""

    def __init__(self, db_url: str, workdir: Path, username: str, password: str) -> None:
        self.port = free_port()
        stubs, self.slurm_log = slurm_stubs(workdir)
        env = {
            **os.environ,
            "PATH": f"{stubs}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "DET_DB_URL": db_url,
            "DET_MASTER_DATA_DIR": str(workdir),
            "DET_CHECKPOINT_ROOT": str(workdir / "ckpt"),
            "DET_JOB_STORAGE_ROOT": str(workdir / "jobs"),
            "HOME": str(workdir),
            "PYTHONPATH": str(ROOT),
        }
        self.log = open(workdir / f"master-{self.port}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hpc_master.server", "--port", str(self.port), "--log-level", "warning"],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.conn: http.client.HTTPConnection | None = None
        self.token = ""
        deadline = time.monotonic() + 120
        while True:
            try:
                if self.request("GET", "/api/v1/master")[0] == 200:
                    break
            except OSError:
                self.conn = None
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"det-master did not start; see {self.log.name}")
            time.sleep(0.2)
        body = json.dumps({"username": username, "password": password})
        status, answer = self.request("POST", "/api/v1/auth/login", body)
        if status != 200:
            raise RuntimeError(f"login failed: {status} {answer[:200]!r}")
        self.token = json.loads(answer)["token"]

    def request(self, method: str, path: str, body: str | None = None) -> tuple[int, bytes]:
        """One request on a keep-alive connection (reconnecting after an error)."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            self.conn.request(method, path, body=body, headers=headers)
            resp = self.conn.getresponse()
            return resp.status, resp.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = None
            raise

    def slurm_calls(self) -> int:
        return len(self.slurm_log.read_text().splitlines())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@dataclass
class Timing:
    samples_ms: list[float]
    items: int
    bytes: int

    def pct(self, q: float) -> float:
        s = sorted(self.samples_ms)  # nearest rank
        return s[min(len(s), max(1, math.ceil(q * len(s)))) - 1]

    @property
    def p50(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def p99(self) -> float:
        return self.pct(0.99)

    @property
    def max(self) -> float:
        return max(self.samples_ms)


def time_read(master: Master, read: Read, *, repeats: int, budget_s: float, at_least: int) -> Timing:
    """Sequential requests, one in flight, after two unmeasured ones: `repeats` of them, or fewer once
    `budget_s` is spent (never fewer than `at_least`)."""
    for _ in range(2):
        status, body = master.request("GET", read.path)
        if status != 200:
            raise RuntimeError(f"{read.path}: {status} {body[:300]!r}")
    samples: list[float] = []
    spent = time.monotonic()
    while len(samples) < repeats and (len(samples) < at_least or time.monotonic() - spent < budget_s):
        t = time.perf_counter()
        status, body = master.request("GET", read.path)
        samples.append((time.perf_counter() - t) * 1000)
        assert status == 200, body[:300]
    return Timing(samples, read.count(body), len(body))
