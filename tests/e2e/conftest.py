"""A real master (as root, on the local cluster's bridge) driving real Slurm jobs run by a researcher.

The `master` fixture starts `det-master` in a subprocess with its own database, job storage and checkpoint
directories; `Master.kill9()` and `Master.start()` let tests kill it and bring it back on the same database.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from local_cluster.spec import LocalClusterSpec, get_state_dir
from tests.leakgate import die_with_parent, note_master
from tests.slurm.fixtures import SHARED_TEST_ROOT, Researcher

CONTEXT = Path(__file__).parent / "context"
TERMINAL = {"STATE_COMPLETED", "STATE_CANCELED", "STATE_ERROR", "STATE_DELETED"}
# squeue's states of a job that has not ended (`-t all` adds the ended ones Slurm keeps for MinJobAge).
LIVE = "PENDING,CONFIGURING,RUNNING,COMPLETING,SUSPENDED,REQUEUED,RESIZING,SIGNALING,STAGE_OUT,STOPPED"
TASK_ROUTES = {
    "COMMAND": "commands",
    "NOTEBOOK": "notebooks",
    "TENSORBOARD": "tensorboards",
    "SHELL": "shells",
}


def _bridge_ip() -> str:
    record = json.loads((get_state_dir() / "state.json").read_text())
    return LocalClusterSpec.from_json(record["spec"]).controller_ip


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Master:
    def __init__(self, root: Path, researcher: Researcher, db_url: str | None = None) -> None:
        self.root = root
        self.db_url = db_url or f"sqlite:///{root}/master.db"
        self.host = _bridge_ip()
        self.port = _free_port(self.host)
        self.url = f"http://{self.host}:{self.port}"
        # Browsers get the web UI over HTTPS on a port of its own (a master beyond loopback: issue 35).
        self.browser_port = _free_port(self.host)
        self.browser_url = f"https://{self.host}:{self.browser_port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.cluster_id = ""
        self.researcher = researcher
        self._http_local = threading.local()
        self._http_generation = 0
        for d in ("jobs", "data", "state"):
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "checkpoints").mkdir(exist_ok=True)
        (root / "checkpoints").chmod(0o1777)
        (root / "master.yaml").write_text(
            f"""
listen: {{host: {self.host}, port: {self.port}}}
external_url: {self.url}
tls: {{browser_port: {self.browser_port}}}
db: {{url: "{self.db_url}"}}
job_storage_root: {root}/jobs
checkpoint_storage: {{host_path: {root}/checkpoints}}
resource_pools:
  default: {{partition: batch, slots_per_node: 2, gpu_request_style: gres}}
preemption: {{signal: SIGUSR1, lead_time_s: 30}}
poll_interval_s: 1
"""
        )
        self.log = root / "master.log"

    @property
    def user_jobs(self) -> Path:
        """The researcher's directory below the job storage root, where their runs and tasks are."""
        return self.root / "jobs" / self.researcher.name

    def start(self) -> None:
        self._forget_connections()
        env = dict(
            os.environ,
            DET_ADMIN_PASSWORD="admin-pw",
            DET_MASTER_DATA_DIR=str(self.root / "data"),
            DET_MASTER_STATE_DIR=str(self.root / "state"),
        )
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hpc_master.server", "--config", str(self.root / "master.yaml")],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root, preexec_fn=die_with_parent,
            )  # fmt: skip
        # A start takes 2-5 s; CI's cluster lane starts six masters at once beside jobs on 2 CPUs, where one
        # took 17 s to import before its first log line.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                answer = httpx.get(f"{self.url}/api/v1/master", timeout=1)
                if answer.status_code == 200:
                    self.cluster_id = str(answer.json()["clusterId"])
                    note_master(self.cluster_id)
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError(f"the master did not start:\n{self.log.read_text()[-3000:]}")

    def kill9(self) -> None:
        assert self.proc is not None
        self._forget_connections()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def live_job_ids(self) -> list[str]:
        return self.job_ids(live_only=True)

    def slurm_jobs(self, *, states: str = LIVE) -> list[str]:
        """The jobs of this master (trials' and tasks' alike, by the comment) that have not ended."""
        prefix = f"hpc-det:{self.cluster_id.replace('-', '')[:12]}:"
        out = subprocess.run(
            ["squeue", "-h", "-a", "-t", states, "-o", "%i|%k"], capture_output=True, text=True
        ).stdout
        return [
            line.split("|", 1)[0] for line in out.splitlines() if line.partition("|")[2].startswith(prefix)
        ]

    def jobs_of(self, exp: int, trial: int | None = None, *, states: str = LIVE) -> list[str]:
        """This master's jobs of experiment `exp` (of one trial) that have not ended: by comment, since job
        names repeat across the masters that tests run at the same time."""
        mark = f":exp={exp},trial={trial}," if trial is not None else f":exp={exp},"
        prefix = f"hpc-det:{self.cluster_id.replace('-', '')[:12]}"
        out = subprocess.run(
            ["squeue", "-h", "-a", "-t", states, "-o", "%i|%k"], capture_output=True, text=True
        ).stdout
        return [
            job for job, _, comment in (line.partition("|") for line in out.splitlines())
            if comment.startswith(prefix + mark)
        ]  # fmt: skip

    def end_everything(self, timeout_s: float = 120) -> None:
        """Kill every experiment and task that has not ended, and wait for their jobs to leave Slurm."""
        admin = self.login("admin", "admin-pw")
        for exp in self.api("GET", "/experiments", admin, params={"limit": 1000})["experiments"]:
            if exp["state"] not in TERMINAL:
                self._http().post(f"{self.url}/api/v1/experiments/{exp['id']}/kill", headers=admin)
        for summary in self.api("GET", "/tasks", admin)["allocationIdToSummary"].values():
            plural = TASK_ROUTES.get(summary["taskType"])
            if plural:
                self._http().post(f"{self.url}/api/v1/{plural}/{summary['taskId']}/kill", headers=admin)
        deadline = time.monotonic() + timeout_s
        while self.slurm_jobs() and time.monotonic() < deadline:
            time.sleep(0.5)
        left = self.slurm_jobs()
        if left:
            states = subprocess.run(["squeue", "-h", "-j", ",".join(left), "-o", "%i %T %R"],
                                    capture_output=True, text=True).stdout  # fmt: skip
            subprocess.run(["scancel", "--quiet", *left], check=False)
            raise AssertionError(
                f"still in Slurm {timeout_s:.0f} s after their experiments were killed:\n{states}"
            )

    def job_ids(self, *, live_only: bool = False) -> list[str]:
        """The Slurm job ids of this master's trial runs (job names repeat across masters)."""
        from sqlalchemy import create_engine, text

        where = "state IN ('PENDING', 'RUNNING') AND " if live_only else ""
        engine = create_engine(self.db_url)
        try:
            with engine.connect() as db:
                rows = db.execute(
                    text(f"SELECT slurm_job_id FROM trial_runs WHERE {where}slurm_job_id IS NOT NULL")
                ).fetchall()
        finally:
            engine.dispose()
        return [str(r[0]) for r in rows]

    # ---- API helpers ---------------------------------------------------------------------------------
    def login(self, username: str, password: str) -> dict[str, str]:
        r = self._http().post(
            f"{self.url}/api/v1/auth/login", json={"username": username, "password": password}
        )
        assert r.status_code == 200, r.text
        return {"Authorization": f"Bearer {r.json()['token']}"}

    def _http(self) -> httpx.Client:
        """A kept-alive client per thread and master process: ``httpx.request`` builds a client (and its TLS
        context) per call, about 25 ms of CPU that benchmarks would count as the master's."""
        local = self._http_local
        if getattr(local, "generation", None) != self._http_generation:
            if getattr(local, "client", None) is not None:
                local.client.close()  # its pooled connections were to the previous master process
            local.client, local.generation = httpx.Client(timeout=30), self._http_generation
        client: httpx.Client = local.client
        return client

    def _forget_connections(self) -> None:  # the master process changed: pooled connections are dead
        self._http_generation += 1

    def api(self, method: str, path: str, headers: dict[str, str], **kw: Any) -> Any:
        r = self._http().request(method, f"{self.url}/api/v1{path}", headers=headers, **kw)
        assert r.status_code < 300, f"{method} {path}: {r.status_code} {r.text}"
        return r.json()

    def create_experiment(self, headers: dict[str, str], config: str, context: Path = CONTEXT) -> int:
        files = [
            {"path": p.name, "type": 48, "content": base64.b64encode(p.read_bytes()).decode(), "mode": 0o644}
            for p in sorted(context.iterdir())
            if p.is_file()
        ]
        body = {"config": config, "modelDefinition": files, "activate": True}
        return int(self.api("POST", "/experiments", headers, json=body)["experiment"]["id"])

    def experiment(self, headers: dict[str, str], exp_id: int) -> dict[str, Any]:
        return dict(self.api("GET", f"/experiments/{exp_id}", headers)["experiment"])

    def trials(self, headers: dict[str, str], exp_id: int) -> list[dict[str, Any]]:
        return list(self.api("GET", f"/experiments/{exp_id}/trials", headers)["trials"])

    def wait_state(self, headers: dict[str, str], exp_id: int, states: set[str], timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            state = self.experiment(headers, exp_id)["state"]
            if state in states:
                return state
            time.sleep(0.5)
        raise AssertionError(
            f"experiment {exp_id} still {state} after {timeout_s:.0f} s\n{self.diagnose(exp_id)}"
        )

    def diagnose(self, exp_id: int) -> str:
        logs = sorted((self.user_jobs / f"exp-{exp_id}").glob("trial-*/run-*/output.log"))
        parts = [f"--- master.log ---\n{self.log.read_text()[-4000:]}"]
        parts += [f"--- {p} ---\n{p.read_text()[-1500:]}" for p in logs[-4:]]
        return "\n".join(parts)


@contextlib.contextmanager
def started(m: Master, *, settle_s: float = 0.0) -> Iterator[Master]:
    """Run the master for the block; after it, stop it and cancel its jobs (only its own: the cluster is
    shared with other tests and people). Its own are those it recorded and any job running in its job
    storage: an `sbatch` the master had started when it stopped still creates a job, whose harness then
    retries its reports to a master that is gone and holds its GPUs; `settle_s` waits for such a submission
    to finish first."""
    m.start()
    try:
        yield m
    finally:
        m.stop()
        time.sleep(settle_s)
        queue = subprocess.run(["squeue", "-h", "-o", "%i|%Z"], capture_output=True, text=True).stdout
        mine = [line.split("|", 1)[0] for line in queue.splitlines() if f"|{m.root}/" in line + "/"]
        jobs = sorted(set(m.live_job_ids()) | set(mine))
        if jobs:
            subprocess.run(["scancel", "--quiet", *jobs], check=False)


def new_master(researcher: Researcher, db_url: str | None = None) -> Master:
    """A master (not started) with its own directory under the shared test root."""
    root = SHARED_TEST_ROOT / f"master-{uuid.uuid4().hex[:10]}"
    root.mkdir(parents=True)
    root.chmod(0o755)
    return Master(root, researcher, db_url)


@pytest.fixture(scope="module")
def shared_master(researcher: Researcher) -> Iterator[Master]:
    """One master for a module's tests: starting one per test cost each test its start and its first user."""
    with started(new_master(researcher)) as m:
        yield m


@pytest.fixture()
def master(shared_master: Master) -> Iterator[Master]:
    """The module's master. What a test started on it ends with the test (its experiments and tasks killed,
    their jobs gone), so the next test finds it idle; a test that kills the master or needs an empty database
    asks for `own_master` instead."""
    yield shared_master
    shared_master.end_everything()


@pytest.fixture()
def own_master(researcher: Researcher) -> Iterator[Master]:
    """A master of the test's own: for tests that kill and restart it, or read all of its records."""
    with started(new_master(researcher)) as m:
        yield m


@contextlib.contextmanager
def fresh_pg_database() -> Iterator[str]:
    """A new, empty database on the PostgreSQL server at DET_TEST_PG_URL (skips without one, fails under
    DET_TEST_REQUIRE_ALL=1); dropped afterwards."""
    from tests.pg import new_database

    base = os.environ.get("DET_TEST_PG_URL")
    if not base:
        if os.environ.get("DET_TEST_REQUIRE_ALL") == "1":
            pytest.fail("DET_TEST_PG_URL is unset and DET_TEST_REQUIRE_ALL=1")
        pytest.skip("DET_TEST_PG_URL is unset (scripts/postgres.sh start)")
    with new_database(base, "hpcdet_e2e") as url:
        yield url


def make_alice(master: Master) -> dict[str, str]:
    """The master user alice, whose jobs run as the researcher's Unix account (created on first use)."""
    r = master._http().post(
        f"{master.url}/api/v1/auth/login", json={"username": "alice", "password": "alice-pw"}
    )
    if r.status_code == 200:
        return {"Authorization": f"Bearer {r.json()['token']}"}
    admin = master.login("admin", "admin-pw")
    user = {"username": "alice", "admin": False, "active": True, "unixUsername": master.researcher.name}
    master.api("POST", "/users", admin, json={"user": user, "password": "alice-pw"})
    return master.login("alice", "alice-pw")


@pytest.fixture()
def alice(master: Master) -> dict[str, str]:
    return make_alice(master)
