"""Shared helpers for the benchmarks that run on the real local Slurm cluster (run them as root).

A private `det-master` (the e2e suite's `Master`: its own SQLite DB, job storage and checkpoints, listening on
the cluster's bridge) with a user `alice` whose jobs run as the researcher's Unix account; bare `sbatch` as
the same researcher for the baselines; `squeue` and the master's own DB for who-saw-what-when.
"""

from __future__ import annotations

import os
import pwd
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import Master  # noqa: E402
from tests.slurm.fixtures import SHARED_TEST_ROOT, Researcher  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def require_cluster() -> Researcher:
    from local_cluster.cluster import is_up

    if os.geteuid() != 0 or not is_up() or shutil.which("sbatch") is None:
        raise SystemExit(
            "run as root with the local Slurm cluster up (det deploy local up --create-user ...)"
        )
    name = os.environ.get("DET_TEST_USER", "researcher")
    pw = pwd.getpwnam(name)
    if pw.pw_uid == 0:
        raise SystemExit("jobs must be submitted by a non-root account")
    return Researcher(name, pw.pw_uid, pw.pw_gid)


def bench_root(name: str) -> Path:
    """A fresh directory on the 'shared filesystem' that every user can write to."""
    SHARED_TEST_ROOT.mkdir(parents=True, exist_ok=True)
    root = SHARED_TEST_ROOT / f"bench-{name}-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    root.chmod(0o1777)
    return root


def shared_dir(parent: Path, name: str) -> Path:
    d = parent / name
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o1777)
    return d


class BenchMaster(Master):
    """The e2e `Master` with the poll interval under our control (the shipped default is 5 s)."""

    def __init__(self, root: Path, researcher: Researcher, poll_interval_s: float) -> None:
        super().__init__(root, researcher)
        cfg = root / "master.yaml"
        text = cfg.read_text().replace("poll_interval_s: 1\n", f"poll_interval_s: {poll_interval_s}\n")
        cfg.write_text(text)
        self.poll_interval_s = poll_interval_s

    def alice(self) -> dict[str, str]:
        admin = self.login("admin", "admin-pw")
        user = {"username": "alice", "admin": False, "active": True, "unixUsername": self.researcher.name}
        self.api("POST", "/users", admin, json={"user": user, "password": "alice-pw"})
        return self.login("alice", "alice-pw")

    def runs(self) -> list[dict[str, Any]]:
        """Every trial run the master recorded (its own view: state, Slurm job id, times)."""
        with sqlite3.connect(self.root / "master.db", timeout=5) as db:
            db.row_factory = sqlite3.Row
            rows = db.execute(
                "SELECT r.id, r.trial_id, r.run_number, r.slurm_job_id, r.state, r.exit_reason, "
                "t.experiment_id FROM trial_runs r JOIN trials t ON t.id = r.trial_id"
            ).fetchall()
        return [dict(r) for r in rows]

    def shutdown(self) -> None:
        self.stop()
        jobs = self.live_job_ids()
        if jobs:
            subprocess.run(["scancel", "--quiet", *jobs], check=False)


def start_master(
    name: str, researcher: Researcher, poll_interval_s: float
) -> tuple[BenchMaster, dict[str, str]]:
    root = SHARED_TEST_ROOT / f"bench-{name}-master-{uuid.uuid4().hex[:8]}"
    root.mkdir(parents=True)
    root.chmod(0o755)
    m = BenchMaster(root, researcher, poll_interval_s)
    m.start()
    return m, m.alice()


def sbatch(researcher: Researcher, script: Path, *args: str) -> str:
    out = researcher.run(["sbatch", "--parsable", *args, str(script)]).stdout
    return out.strip().split(";")[0]


def squeue_states(job_ids: Iterable[str]) -> dict[str, str]:
    """Job id → Slurm state for the jobs squeue still knows (finished jobs drop out after a while)."""
    ids = list(job_ids)
    if not ids:
        return {}
    out = subprocess.run(
        ["squeue", "-h", "-j", ",".join(ids), "-o", "%i %T"], capture_output=True, text=True, check=False
    ).stdout
    states: dict[str, str] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def others_on_cluster(exclude: Iterable[str] = ()) -> str:
    """A one-line description of the jobs of other people sharing the cluster (they take slots)."""
    skip = set(exclude)
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i %T %b %D"], capture_output=True, text=True, check=False
    ).stdout
    jobs = [line.split() for line in out.splitlines() if line.split() and line.split()[0] not in skip]
    running = [j for j in jobs if len(j) > 1 and j[1] == "RUNNING"]
    return f"{len(running)} running / {len(jobs) - len(running)} pending"


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def pct(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (nearest rank), fine for the small samples here."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(0, min(len(s) - 1, round(q / 100 * (len(s) - 1))))
    return s[k]


def spread(xs: Sequence[float]) -> str:
    if not xs:
        return "–"
    return f"{min(xs):.2f}–{max(xs):.2f}"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(lines)


def write_result(name: str, text: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.md"
    path.write_text(text)
    return path


def wait_for(pred: Any, timeout_s: float, what: str, interval_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
