"""Many researchers on one shared master and cluster: API latency and the lifecycle loop's tick time at 1, 5, 20.

    flock /tmp/hpc-cluster.lock .venv/bin/python bench/many_users.py [--levels 1,5,20] [--duration-s 75] [--quick]

Run as root with the local cluster up. Up to 20 Unix accounts ``detbench01``..``detbench20`` are created (as
``det deploy local up --create-user`` does: ``local_cluster.accounts.ensure`` and a Slurm association in the
``research`` account) and kept for re-runs. ONE ``det-master`` (PostgreSQL database ``hpcdet_users_bench``,
dropped and created afresh; never ``hpcdet``) listens on the cluster's bridge, with the shipped poll interval
(5 s: the loop ticks every 2 s) unless told otherwise; master user ``benchNN`` has ``unixUsername: detbenchNN``,
so its jobs run as that account. The master runs under ``bench/_many_users_master.py``, which times every
lifecycle tick (and its steps) and every HTTP request from inside the process, without changing hpc_master.

Per level N: N researcher threads (``bench/_many_users_traffic.py``), each with its own token, for
``--duration-s``: tiny CPU-only experiments (``single`` and 2-trial ``random`` searches, trials reporting
training metrics every 0.25 s for 5 s, as that user's Unix account) and, between think times, list own /
all experiments, describe, list trials, read metrics, follow logs. Then every experiment still live is killed
through the API and the bench waits for its jobs to leave Slurm (not counted). An idle window before the first
level gives the loop's tick time with nothing to do. Afterwards: who ran each job (``sacct`` user and the owner of
the job's output file) and what each user sees of the others' experiments.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._cluster import others_on_cluster, write_result
from bench._many_users_report import Level, report
from bench._many_users_traffic import TERMINAL, Calls, Researcher, UserLoop, trial_log_owner
from tests.e2e.conftest import Master
from tests.slurm.fixtures import SHARED_TEST_ROOT
from tests.slurm.fixtures import Researcher as UnixAccount

PROBED_MASTER = Path(__file__).with_name("_many_users_master.py")
PG_SERVER = "postgresql+psycopg://postgres@127.0.0.1:25432/postgres"
ACCOUNT = "detbench{:02d}"
USER = "bench{:02d}"
LONG_POLLS = re.compile(r"/searcher/operation$|/signals/preemption$|/changes$")
JOB_METRICS = re.compile(r"^/api/v1/trials/\d+/metrics(/batch)?$")
HARNESS = re.compile(
    r"^/api/v1/(trials/\d+/(progress|runner/metadata|early_exit|searcher/completed_operation)"
    r"|checkpoints|allocations/[^/]+/signals/ack_preemption)$"
)


# ---- accounts, database, master ------------------------------------------------------------------------


def ensure_accounts(n: int) -> tuple[list[str], list[str]]:
    """``detbench01``..``detbenchNN`` as Unix accounts with a Slurm association; (all, created now)."""
    from local_cluster import accounting, accounts
    from local_cluster.spec import LocalClusterSpec, get_state_dir

    names = [ACCOUNT.format(i) for i in range(1, n + 1)]
    created = [name for name in names if accounts.ensure(name) is not None]
    spec = LocalClusterSpec.from_json(json.loads((get_state_dir() / "state.json").read_text())["spec"])
    if spec.accounting:
        out = subprocess.run(
            ["sacctmgr", "-n", "-P", "list", "assoc", "format=user"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        missing = tuple(sorted(set(names) - set(out.split())))
        accounting.add_users(spec, missing, dict(os.environ, SLURM_CONF=str(spec.slurm_conf)))
    return names, created


def fresh_database(server: str, name: str) -> str:
    if name == "hpcdet":
        raise SystemExit("refusing to use the hpcdet database")
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        c.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(server).set(database=name).render_as_string(hide_password=False)


class ProbedMaster(Master):
    """The e2e ``Master`` on PostgreSQL, run by ``_many_users_master.py`` (tick and request probes)."""

    def __init__(self, root: Path, account: UnixAccount, db_url: str, poll_interval_s: float) -> None:
        super().__init__(root, account, db_url)
        cfg = root / "master.yaml"
        cfg.write_text(
            cfg.read_text().replace("poll_interval_s: 1\n", f"poll_interval_s: {poll_interval_s}\n")
        )
        self.tick_log, self.req_log = root / "ticks.jsonl", root / "requests.log"
        self.sql = create_engine(db_url)

    def start(self) -> None:
        self._forget_connections()
        env = dict(
            os.environ,
            DET_ADMIN_PASSWORD="admin-pw",
            DET_MASTER_DATA_DIR=str(self.root / "data"),
            DET_MASTER_STATE_DIR=str(self.root / "state"),
            DET_BENCH_TICK_LOG=str(self.tick_log),
            DET_BENCH_REQ_LOG=str(self.req_log),
        )
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(PROBED_MASTER), "--config", str(self.root / "master.yaml")],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/api/v1/master", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError(f"the master did not start:\n{self.log.read_text()[-3000:]}")

    def query(self, sql: str, **params: Any) -> list[Any]:
        with self.sql.connect() as c:
            return list(c.execute(text(sql), params).fetchall())

    def cpu_s(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_users(m: ProbedMaster, accounts: list[str]) -> list[Researcher]:
    admin = m.login("admin", "admin-pw")
    users = []
    for i, unix in enumerate(accounts, start=1):
        name = USER.format(i)
        body = {
            "user": {"username": name, "admin": False, "active": True, "unixUsername": unix},
            "password": "pw",
        }
        m.api("POST", "/users", admin, json=body)
        token = m.login(name, "pw")["Authorization"].split(" ", 1)[1]
        users.append(Researcher(i, name, unix, token))
    return users


# ---- one level -------------------------------------------------------------------------------------------


def live_jobs(accounts: list[str]) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-u", ",".join(accounts), "-o", "%i"], capture_output=True, text=True, check=False
    ).stdout
    return out.split()


def drain(
    m: ProbedMaster, users: list[Researcher], created: dict[str, list[int]], accounts: list[str]
) -> float:
    """Kill every experiment of the level still live (as its owner), wait for their jobs to leave Slurm."""
    t0 = time.monotonic()
    with httpx.Client(timeout=30) as client:
        for u in users:
            for exp in created.get(u.username, []):
                h = {"Authorization": f"Bearer {u.token}"}
                r = client.get(f"{m.url}/api/v1/experiments/{exp}", headers=h)
                if r.status_code == 200 and r.json()["experiment"]["state"] not in TERMINAL:
                    client.post(f"{m.url}/api/v1/experiments/{exp}/kill", headers=h)
            u.live = None
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        live = m.query("SELECT count(*) FROM trial_runs WHERE state IN ('PENDING', 'RUNNING')")[0][0]
        if not live and not live_jobs(accounts):
            break
        time.sleep(1)
    left = live_jobs(accounts)
    if left:
        print(f"  drain: scancel {len(left)} job(s) still in Slurm", flush=True)
        subprocess.run(["scancel", "--quiet", *left], check=False)
    return time.monotonic() - t0


def run_level(m: ProbedMaster, users: list[Researcher], n: int, args: argparse.Namespace) -> Level:
    stop = threading.Event()
    loops = [
        UserLoop(m.url, u, stop, steps=args.steps, sleep_s=args.sleep_s, create_every_s=args.create_every_s,
                 follow_s=args.follow_s, think_s=args.think_s, seed=1000 * n + u.index)
        for u in users[:n]
    ]  # fmt: skip
    cpu0, t0 = m.cpu_s(), time.time()
    for loop in loops:
        loop.start()
    time.sleep(args.duration_s)
    stop.set()
    for loop in loops:
        loop.join(args.follow_s * 2 + 70)
    t1, cpu1 = time.time(), m.cpu_s()
    calls = Calls()
    for loop in loops:
        calls.merge(loop.calls)
    created = {loop.user.username: loop.created for loop in loops}
    level = Level(n, t0, t1, calls, cpu1 - cpu0, [e for c in created.values() for e in c])
    level.drain_s = drain(m, users[:n], created, [u.unix for u in users[:n]])
    return level


def collect(m: ProbedMaster, level: Level) -> None:
    """The master's own view of the level's window: its ticks, its request times, its jobs' metric rows."""
    for line in m.tick_log.read_text().splitlines():
        rec = json.loads(line)
        if level.t0 <= rec["t"] <= level.t1:
            level.ticks.append(rec)
    server: dict[str, list[float]] = defaultdict(list)
    for line in m.req_log.read_text().splitlines():
        wall, method, path, _status, head, total = line.split()
        if not level.t0 <= float(wall) <= level.t1:
            continue
        if LONG_POLLS.search(path):
            server["jobs: long polls (count only)"].append(float(head))
        elif method == "POST" and JOB_METRICS.match(path):
            server["jobs: POST metrics"].append(float(total))
        elif method == "POST" and HARNESS.match(path):
            server["jobs: other harness calls"].append(float(total))
        elif path.endswith("/logs"):
            server["users: follow logs (headers)"].append(float(head))
        elif path.startswith("/api/v1/") and not path.startswith(("/api/v1/auth", "/api/v1/master")):
            server["users: other routes"].append(float(total))
    level.server = dict(server)
    if level.created:
        ids = {"ids": level.created}
        level.jobs = m.query(
            "SELECT count(*) FROM trial_runs r JOIN trials t ON t.id = r.trial_id "
            "WHERE r.slurm_job_id IS NOT NULL AND t.experiment_id = ANY(:ids)", **ids
        )[0][0]  # fmt: skip
        for _exp, queued, running in m.query(
            "SELECT e.id, EXTRACT(EPOCH FROM min(r.submit_time) - e.start_time), "
            "EXTRACT(EPOCH FROM min(r.start_time) - e.start_time) FROM experiments e "
            "JOIN trials t ON t.experiment_id = e.id JOIN trial_runs r ON r.trial_id = t.id "
            "WHERE e.id = ANY(:ids) GROUP BY e.id, e.start_time",
            **ids,
        ):
            if queued is not None:
                level.to_queued.append(float(queued))
            if running is not None:
                level.to_running.append(float(running))
        level.metric_rows = m.query(
            "SELECT count(*) FROM metrics x JOIN trials t ON t.id = x.trial_id WHERE t.experiment_id = ANY(:ids)",
            **ids,
        )[0][0]


def idle_ticks(m: ProbedMaster, seconds: float) -> Level:
    t0 = time.time()
    time.sleep(seconds)
    level = Level(0, t0, time.time(), Calls(), 0.0, [])
    collect(m, level)
    return level


# ---- checks after the levels ------------------------------------------------------------------------------


def who_ran_jobs(m: ProbedMaster) -> dict[str, Any]:
    """Each bench job's Slurm user (sacct) and its output file's owner, against the owner's unixUsername."""
    rows = m.query(
        "SELECT r.slurm_job_id, u.unix_username, t.experiment_id FROM trial_runs r "
        "JOIN trials t ON t.id = r.trial_id JOIN experiments e ON e.id = t.experiment_id "
        "JOIN users u ON u.id = e.owner_id WHERE r.slurm_job_id IS NOT NULL"
    )
    expected = {str(job): unix for job, unix, _ in rows}
    slurm_user: dict[str, str] = {}
    ids = sorted(expected)
    for i in range(0, len(ids), 200):
        out = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", ",".join(ids[i : i + 200]), "--format=JobID,User"],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        for line in out.splitlines():
            job, _, user = line.partition("|")
            slurm_user[job] = user
    by_exp: dict[int, str] = {int(exp): unix for _, unix, exp in rows}
    file_ok = file_bad = 0
    for exp, unix in by_exp.items():
        uid = pwd.getpwnam(unix).pw_uid
        for owner in trial_log_owner(m.root / "jobs", exp):
            file_ok, file_bad = (file_ok + 1, file_bad) if owner == uid else (file_ok, file_bad + 1)
    return {
        "jobs": len(expected),
        "sacct_match": sum(slurm_user.get(j) == u for j, u in expected.items()),
        "sacct_mismatch": sorted(
            f"{j}: {slurm_user[j]} ≠ {u}"
            for j, u in expected.items()
            if j in slurm_user and slurm_user[j] != u
        )[:5],
        "sacct_unknown": sum(j not in slurm_user for j in expected),
        "accounts": len(set(expected.values())),
        "files_ok": file_ok,
        "files_bad": file_bad,
    }


def isolation(m: ProbedMaster, users: list[Researcher]) -> dict[str, Any]:
    """What each (non-admin) user sees of the others': the list, the configs' secrets, logs, metrics."""
    res: dict[str, Any] = defaultdict(int)
    with httpx.Client(timeout=30) as client:
        for u in users:
            h = {"Authorization": f"Bearer {u.token}"}
            own = client.get(
                f"{m.url}/api/v1/experiments", headers=h, params={"users": u.username, "limit": 0}
            )
            res["own_list_foreign"] += sum(e["username"] != u.username for e in own.json()["experiments"])
            every = client.get(f"{m.url}/api/v1/experiments", headers=h, params={"limit": 0}).json()[
                "experiments"
            ]
            foreign = [e for e in every if e["username"] != u.username]
            res["unfiltered_lists"] += 1
            res["unfiltered_lists_with_foreign"] += bool(foreign)
            res["foreign_seen"] += len(foreign)
            res["foreign_secret_leaks"] += sum("secret-of-" in json.dumps(e) for e in foreign)
            res["own_secret_shown"] += sum(
                "secret-of-" in json.dumps(e) for e in every if e["username"] == u.username
            )
            other = next((e for e in foreign if e.get("trialIds")), None)
            if other is not None:
                trial = other["trialIds"][0]
                logs = client.get(f"{m.url}/api/v1/trials/{trial}/logs", headers=h)
                res[f"foreign_logs_{logs.status_code}"] += 1
                metrics = client.get(f"{m.url}/api/v1/trials/{trial}/metrics", headers=h)
                res[f"foreign_metrics_{metrics.status_code}"] += 1
    return dict(res)


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ---- main ----------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,5,20", help="concurrent researchers per level")
    parser.add_argument("--duration-s", type=float, default=75.0)
    parser.add_argument("--idle-s", type=float, default=15.0, help="the loop with nothing to do, first")
    parser.add_argument("--quick", action="store_true", help="level 1 only, 20 s (development)")
    parser.add_argument("--poll-interval-s", type=float, default=5.0, help="master poll_interval_s")
    parser.add_argument("--think-s", default="0.2,0.8", help="think time range between a user's calls")
    parser.add_argument("--follow-s", type=float, default=3.0)
    parser.add_argument("--create-every-s", type=float, default=15.0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sleep-s", type=float, default=0.25)
    parser.add_argument("--pg-server", default=PG_SERVER)
    parser.add_argument("--db-name", default="hpcdet_users_bench")
    parser.add_argument("--keep", action="store_true", help="keep the master's directory (jobs, logs)")
    parser.add_argument("--no-write", action="store_true", help="print, do not write bench/results")
    args = parser.parse_args()
    if args.quick:
        args.levels, args.duration_s, args.idle_s = "1", 20.0, 6.0
    sizes = [int(x) for x in args.levels.split(",")]
    args.think_s = tuple(float(x) for x in args.think_s.split(","))

    from local_cluster.cluster import is_up

    if os.geteuid() != 0 or not is_up() or shutil.which("sbatch") is None:
        raise SystemExit("run as root with the local Slurm cluster up (det deploy local up)")
    accounts, created = ensure_accounts(max(sizes))
    print(f"accounts: {len(accounts)} ({len(created)} created now)", flush=True)
    db_url = fresh_database(args.pg_server, args.db_name)
    SHARED_TEST_ROOT.mkdir(parents=True, exist_ok=True)
    root = SHARED_TEST_ROOT / f"bench-many-users-{uuid.uuid4().hex[:8]}"
    root.mkdir(mode=0o755)
    first = pwd.getpwnam(accounts[0])
    m = ProbedMaster(
        root, UnixAccount(first.pw_name, first.pw_uid, first.pw_gid), db_url, args.poll_interval_s
    )
    env = {"date": time.strftime("%Y-%m-%d"), "cluster": others_on_cluster(), "load_before": loadavg()}
    m.start()
    levels: list[Level] = []
    try:
        users = make_users(m, accounts)
        idle = idle_ticks(m, args.idle_s)
        print(f"idle: {len(idle.ticks)} ticks", flush=True)
        for n in sizes:
            print(f"level {n}: {args.duration_s:g} s ...", flush=True)
            level = run_level(m, users, n, args)
            collect(m, level)
            levels.append(level)
            done = sum(len(v) for v in level.calls.latency.values())
            print(f"level {n}: {done} requests, {len(level.created)} experiments, {level.jobs} jobs, "
                  f"{len(level.ticks)} ticks, drained in {level.drain_s:.0f} s", flush=True)  # fmt: skip
        iso = isolation(m, users[: max(sizes)])
        ran = who_ran_jobs(m)
        env["load_after"] = loadavg()
    finally:
        m.stop()
        left = live_jobs(accounts)
        if left:
            subprocess.run(["scancel", "--quiet", *left], check=False)
        m.sql.dispose()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    text_ = report(levels, idle, ran, iso, args, env)
    print(text_)
    if not args.no_write:
        print(f"written to {write_result('many_users', text_)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
