"""100 followers of one researcher's live trial log on a master that serves as its service account (every read
through the researcher's helper, under sudo) against the same on a root master that reads the file itself:
``GET /api/v1/me`` latency of another user meanwhile, next to the idle master (issue 34's goal: p99 ≤ 100 ms).

    sudo .venv/bin/python bench/helper_log_follow.py [--followers 100] [--seconds 20] [--out FILE]

As root: it makes a service account, a researcher account and the group of users, installs the sudoers rule
`det-master --print-sudoers` writes (into ``/etc/sudoers.d``) and removes all of them at the end. A SQLite
database holds the researcher's ACTIVE trial whose ``output.log`` (0640, in their 0700 directory: the service
account cannot open it) gets a line every 50 ms during the run. For each part a fresh master (the real app
under uvicorn, one process, loopback) serves the database: the baseline root part's reads are its own
(``userfiles``, as a root master reads logs), the other root part's (an option measured, not shipped) and the
service account's go through ``HelperPool`` (one long-lived helper for the researcher, by runuser or sudo). Followers are
``GET /api/v1/trials/1/logs?follow=true`` streams held open by one asyncio thread; user B asks ``/me`` every
50 ms. No cluster needed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from streams import PASSWORD, Streams, cpu_s, free_port, pct  # noqa: E402

SERVICE, RESEARCHER, GROUP = "detbenchsvc", "detbenchalice", "detbenchusers"
PROBE_EVERY_S = 0.05
SETTLE_S = 3.0

SERVE = """
import sys, uvicorn
from hpc_master.api.app import create_app
from hpc_master.helper_client import HelperPool, UserHelper
from hpc_master.masterconf import parse_master_config
from hpc_master.service_account import become, identity_for
from hpc_master.services.logs import helper_reader
url, port, jobs, ckpt, account = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
raw = {"db": {"url": url}, "listen": {"host": "127.0.0.1", "port": port}, "job_storage_root": jobs,
       "checkpoint_storage": {"host_path": ckpt},
       "security": {"require_passwords": True, "admin_password": "admin-pw", "max_streams_per_user": 1000}}
if account not in ("-", "root"):
    raw["service_account"] = account
config = parse_master_config(raw, env={})
identity = identity_for(config)
become(identity, [])
app = create_app(config)
state = app.state.det
state.acts_for_users, state.helper_via = identity.acts_for_users, identity.via
pool = None
if account != "-":  # as hpc_master.server.make_lifecycle_loop wires it; "-": a root master reading itself
    pool = HelperPool(UserHelper([jobs, ckpt], via=identity.via))
    state.log_reader = helper_reader(pool, jobs)
print("serving as uid", __import__("os").geteuid(), flush=True)
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""


@dataclass
class Part:
    name: str
    followers: int
    account: str  # "-": a root master reading the log itself (as it does); "root": through runuser


@dataclass
class Result:
    part: Part
    opened: int
    me_ms: list[float]
    cpu_pct: float
    helpers: int  # helper processes alive under the master at the end


@contextlib.contextmanager
def accounts() -> Iterator[tuple[pwd.struct_passwd, pwd.struct_passwd]]:
    made = []
    if subprocess.run(["getent", "group", GROUP], capture_output=True).returncode != 0:
        subprocess.run(["groupadd", GROUP], check=True)
        made.append(("groupdel", GROUP))
    for name, extra in ((SERVICE, ["--system"]), (RESEARCHER, [])):
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", *extra, "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                           check=True)  # fmt: skip
            made.insert(0, ("userdel", name))
    subprocess.run(["gpasswd", "-a", RESEARCHER, GROUP], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(SERVICE), pwd.getpwnam(RESEARCHER)
    finally:
        for command, name in made:
            subprocess.run([command, name], capture_output=True, check=False)


def build(tmp: Path, svc: pwd.struct_passwd, alice: pwd.struct_passwd) -> tuple[Path, Path, Path, Path]:
    """The database (the service account's), the researcher's live log, the job and checkpoint roots."""
    from sqlalchemy import select

    from hpc_master.db.engine import make_engine, make_sessionmaker, transaction
    from hpc_master.db.migrate import upgrade_to_head
    from hpc_master.db.models import LogFileModel, TrialRunModel, UserModel
    from hpc_master.services.lifecycle import allocate_trial_run
    from tests.webui.seed import seed_experiment, seed_user

    jobs, ckpt, data = tmp / "jobs", tmp / "checkpoints", tmp / "data"
    run_dir = jobs / RESEARCHER / "exp-1" / "trial-1" / "run-1"
    run_dir.mkdir(parents=True)
    ckpt.mkdir(mode=0o1777)
    data.mkdir()
    log = run_dir / "output.log"
    log.write_text("".join(f"step {i}: loss {1 / (i + 1):.4f}\n" for i in range(2000)))
    for p in (jobs / RESEARCHER, *list((jobs / RESEARCHER).rglob("*"))):
        os.chown(p, alice.pw_uid, alice.pw_gid)
        p.chmod(0o700 if p.is_dir() else 0o640)
    db = data / "master.db"
    engine = make_engine(f"sqlite:///{db}")
    upgrade_to_head(engine)
    with transaction(make_sessionmaker(engine)) as s:
        owner = seed_user(s, "alice", PASSWORD)
        s.get(UserModel, owner).unix_username = RESEARCHER  # type: ignore[union-attr]
        seed_user(s, "bob", PASSWORD)
        seed_experiment(s, owner, name="follow", trials=1, points=10, state="ACTIVE")
        run = s.scalars(select(TrialRunModel).where(TrialRunModel.trial_id == 1)).first()
        if run is None:
            run = allocate_trial_run(s, 1)
        s.add(LogFileModel(trial_run_id=run.id, path=str(log)))
    engine.dispose()
    for p in (data, *data.iterdir()):
        os.chown(p, svc.pw_uid, svc.pw_gid)
    return db, log, jobs, ckpt


def install_sudoers(jobs: Path, ckpt: Path) -> Path:
    from hpc_master.masterconf import parse_master_config
    from hpc_master.service_account import sudoers

    config = parse_master_config({"job_storage_root": str(jobs), "checkpoint_storage": {"host_path": str(ckpt)}},
                                 env={})  # fmt: skip
    rule = Path(f"/etc/sudoers.d/hpc-det-bench-{os.getpid()}")
    draft = jobs.parent / "sudoers"
    draft.write_text(sudoers(config, account=SERVICE, users_group=GROUP))
    subprocess.run(["visudo", "-cf", str(draft)], check=True, capture_output=True)
    shutil.copyfile(draft, rule)
    rule.chmod(0o440)
    return rule


def keep_writing(log: Path, stop: threading.Event) -> None:
    i = 0
    with log.open("a") as f:
        while not stop.wait(0.05):
            f.write(f"live {i}: loss {1 / (i + 2):.4f}\n")
            f.flush()
            i += 1


def helpers_under(pid: int) -> int:
    out = subprocess.run(["ps", "-e", "-o", "ppid=,args="], capture_output=True, text=True).stdout
    return sum(
        1
        for line in out.splitlines()
        if "userhelper/run.py" in line and ("sudo" in line or "runuser" in line)
    )


def run_part(part: Part, db: Path, jobs: Path, ckpt: Path, args: argparse.Namespace, log: Path) -> Result:
    port = free_port()
    argv = [sys.executable, "-c", SERVE, f"sqlite:///{db}", str(port), str(jobs), str(ckpt), part.account]
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/api/v1/master", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.1)
        tokens = {}
        for user in ("alice", "bob"):
            r = httpx.post(f"{url}/api/v1/auth/login", json={"username": user, "password": PASSWORD})
            tokens[user] = r.json()["token"]
        first = httpx.get(f"{url}/api/v1/trials/1/logs", headers={"Authorization": f"Bearer {tokens['alice']}"},
                          timeout=60)  # fmt: skip
        assert first.status_code == 200 and "step 1999" in first.text, first.text[-500:]
        path = "/api/v1/trials/1/logs?follow=true"
        holder = Streams(port, path, tokens["alice"], part.followers) if part.followers else None
        if holder is not None:
            holder.opened.wait(120)
        time.sleep(SETTLE_S)
        times: list[float] = []
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {tokens['bob']}"}, timeout=60
        ) as c:
            c.get("/api/v1/me")
            cpu0, started = cpu_s(proc.pid), time.monotonic()
            while time.monotonic() < started + args.seconds:
                t0 = time.perf_counter()
                assert c.get("/api/v1/me").status_code == 200
                times.append((time.perf_counter() - t0) * 1000)
                time.sleep(max(0.0, PROBE_EVERY_S - (time.perf_counter() - t0)))
            cpu = 100 * (cpu_s(proc.pid) - cpu0) / (time.monotonic() - started)
        helpers = helpers_under(proc.pid)
        opened = holder.statuses.count(200) if holder is not None else 0
        if holder is not None:
            holder.close()
        return Result(part, opened, times, cpu, helpers)
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--followers", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0 or shutil.which("sudo") is None:
        print("run as root, with sudo installed (it makes accounts and a sudoers rule)", file=sys.stderr)
        return 2
    parts = [
        Part("idle (service account)", 0, SERVICE),
        Part("root master, reads its own (the baseline)", args.followers, "-"),
        Part("root master, reads through the helper (runuser)", args.followers, "root"),
        Part("service account, reads through the helper", args.followers, SERVICE),
    ]
    results: list[Result] = []
    with accounts() as (svc, alice), tempfile.TemporaryDirectory(prefix="bench-helper-", dir="/var/tmp") as t:
        tmp = Path(t)
        tmp.chmod(0o755)
        os.environ.update(DET_MASTER_DATA_DIR=str(tmp / "data"), DET_MASTER_STATE_DIR=str(tmp / "data"))
        db, live, jobs, ckpt = build(tmp, svc, alice)
        rule = install_sudoers(jobs, ckpt)
        stop = threading.Event()
        writer = threading.Thread(target=keep_writing, args=(live, stop), daemon=True)
        writer.start()
        try:
            for part in parts:
                results.append(run_part(part, db, jobs, ckpt, args, tmp / "master.log"))
                r = results[-1]
                print(f"{part.name}: {r.opened} followers, /me p50 {statistics.median(r.me_ms):.1f} p99 "
                      f"{pct(r.me_ms, 0.99):.1f} ms, helpers {r.helpers}", flush=True)  # fmt: skip
        finally:
            stop.set()
            rule.unlink(missing_ok=True)
    idle = pct(results[0].me_ms, 0.99)
    lines = [
        "| part | followers open | B's `/me` p50 / p99 / max (ms) | p99 ÷ idle p99 | requests | master CPU (% of a "
        "core) | helper processes at the end |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        me = r.me_ms
        lines.append(
            f"| {r.part.name} | {r.opened} | {statistics.median(me):.1f} / {pct(me, 0.99):.1f} / {max(me):.1f} | "
            f"{pct(me, 0.99) / idle:.1f} | {len(me)} | {r.cpu_pct:.0f} | {r.helpers} |"
        )
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
