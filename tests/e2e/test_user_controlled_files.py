"""What a researcher controls is never trusted by the master (issue 32, items 1–7), on the real cluster with
two Unix accounts, against a root master and against one serving as its service account (issue 34): the run directories are the researcher's to change, so each test changes them the way an
attacker would (as the researcher, from the login node or from the job) and checks that the master neither
shows, chowns nor reaches what the researcher could not: root-only canary files and directories stand in for
secrets."""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.server
import json
import pwd
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

from tests.e2e.conftest import Master, new_master, started
from tests.e2e.service import SERVICE, ServiceMaster, service_master
from tests.slurm.fixtures import SHARED_TEST_ROOT, Researcher, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
CANARY = f"CANARY-{uuid.uuid4().hex}"
MODES = ["root", "service_account"]


@pytest.fixture(scope="module", params=MODES)
def shared_master(request: pytest.FixtureRequest, researcher: Researcher) -> Iterator[Master]:
    """The module's master: every attack runs against a root master and against a service-account one."""
    with _master_as(request.param, researcher) as m:
        yield m


@pytest.fixture(params=MODES)
def own_master(request: pytest.FixtureRequest, researcher: Researcher) -> Iterator[Master]:
    with _master_as(request.param, researcher) as m:
        yield m


@contextlib.contextmanager
def _master_as(mode: str, researcher: Researcher) -> Iterator[Master]:
    if mode == "root":
        with started(new_master(researcher)) as m:
            yield m
    else:
        with service_master(researcher) as sm:
            yield sm


@pytest.fixture(scope="module")
def canary() -> Iterator[Path]:
    """A root-only file (0600) of two lines: a secret the researcher cannot read."""
    path = SHARED_TEST_ROOT / f"canary-{uuid.uuid4().hex[:8]}"
    path.write_text(f"{CANARY}\nsecond line {CANARY}\n")
    path.chmod(0o600)
    yield path
    path.unlink(missing_ok=True)


def start_task(master: Master, headers: dict[str, str], kind: str, config: dict[str, Any]) -> str:
    r = master.api("POST", f"/{kind}", headers, json={"config": config})
    return str(next(v for k, v in r.items() if k not in ("config", "warnings"))["id"])


def task(master: Master, headers: dict[str, str], task_id: str, kind: str = "commands") -> dict[str, Any]:
    return dict(master.api("GET", f"/{kind}/{task_id}", headers)[kind[:-1]])


def running(
    master: Master, headers: dict[str, str], task_id: str, kind: str = "commands", timeout_s: float = 120
) -> dict[str, Any]:
    return dict(wait_for(
        lambda: (t := task(master, headers, task_id, kind))["state"] == "STATE_RUNNING" and t,
        timeout_s=timeout_s, what=f"task {task_id} to run", interval_s=0.2,
    ))  # fmt: skip


def run_dir(master: Master, task_id: str) -> Path:
    return master.user_jobs / "tasks" / task_id


def test_a_log_replaced_by_a_link_shows_nothing_of_its_target(
    master: Master, alice: dict[str, str], canary: Path
) -> None:
    """Item 1: ``det cmd logs`` of a command whose ``output.log`` is now a link to a root-only file."""
    task_id = start_task(master, alice, "commands", {"entrypoint": "sleep 120", "resources": {"slots": 0}})
    running(master, alice, task_id)
    out = run_dir(master, task_id) / "output.log"
    master.researcher.run(["sh", "-c", 'rm -f "$1" && ln -s "$2" "$1"', "sh", str(out), str(canary)])
    assert out.is_symlink()
    logs = master._http().get(f"{master.url}/api/v1/tasks/{task_id}/logs", headers=alice, timeout=30)
    assert logs.status_code == 200 and CANARY not in logs.text, logs.text[:500]
    master.api("POST", f"/commands/{task_id}/kill", alice)


def test_fifos_in_a_run_directory_freeze_nothing(own_master: Master, canary: Path) -> None:
    """Item 5: FIFOs in place of ``output.log`` and ``exit.json``: 45 log requests all answer, others' logins
    and ``/me`` answer, the lifecycle still ends the task, and the master stops on SIGTERM."""
    master = own_master
    from tests.e2e.conftest import make_alice

    alice = make_alice(master)
    admin = master.login("admin", "admin-pw")
    task_id = start_task(master, alice, "commands", {"entrypoint": "sleep 300", "resources": {"slots": 0}})
    running(master, alice, task_id)
    rd = run_dir(master, task_id)
    master.researcher.run(["sh", "-c", 'cd "$1" && rm -f output.log exit.json && mkfifo output.log exit.json',
                           "sh", str(rd)])  # fmt: skip

    def logs(_: int) -> int:
        return httpx.get(f"{master.url}/api/v1/tasks/{task_id}/logs", headers=alice, timeout=20).status_code

    with concurrent.futures.ThreadPoolExecutor(45) as pool:
        answers = list(pool.map(logs, range(45)))
    assert answers == [200] * 45
    started = time.monotonic()
    assert httpx.get(f"{master.url}/api/v1/me", headers=admin, timeout=10).status_code == 200
    assert master.login("admin", "admin-pw") and time.monotonic() - started < 10
    master.api("POST", f"/commands/{task_id}/kill", alice)
    ended = wait_for(lambda: (t := task(master, alice, task_id))["state"] == "STATE_TERMINATED" and t,
                     timeout_s=120, what="the killed command to end", interval_s=1)  # fmt: skip
    assert ended["state"] == "STATE_TERMINATED"
    assert httpx.get(f"{master.url}/api/v1/me", headers=admin, timeout=10).status_code == 200
    assert master.proc is not None
    master.proc.terminate()
    master.proc.wait(30)  # a master stuck on a FIFO ignored SIGTERM


ATTACK = """
import os, sys
trial = os.environ["DET_JOB_STORAGE"]
os.rename(trial, trial + ".moved")  # the trial's directory is the researcher's to move...
os.symlink(os.environ["ATTACK_TARGET"], trial)  # ...and to replace with a link to root's directory
print("replaced", trial, flush=True)
sys.exit(1)  # the run fails: the master submits the next run into the trial's directory
"""


def test_a_trial_directory_replaced_by_a_link_gets_nothing_chowned_or_written(
    master: Master, alice: dict[str, str], tmp_path: Path
) -> None:
    """Item 2: the next run of a trial whose directory became a link to a root-owned directory."""
    target = SHARED_TEST_ROOT / f"root-dir-{uuid.uuid4().hex[:8]}"
    target.mkdir(mode=0o755)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "attack.py").write_text(ATTACK)
    config = f"""
name: e2e-link-attack
entrypoint: python3 attack.py
searcher: {{name: single, metric: loss, max_length: {{batches: 1}}}}
resources: {{slots_per_trial: 0}}
environment: {{environment_variables: ["ATTACK_TARGET={target}"]}}
max_restarts: 1
"""
    try:
        exp = master.create_experiment(alice, config, context=ctx)
        state = master.wait_state(alice, exp, {"STATE_COMPLETED", "STATE_ERROR"}, 240)
        assert state == "STATE_ERROR", master.diagnose(exp)
        st = target.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, 0, 0o755)
        assert list(target.iterdir()) == []  # no run directory, plan or token written through the link
        (trial,) = master.trials(alice, exp)
        refused = f"submitting trial {trial['id']} failed"
        assert any(
            refused in line and "never followed" in line for line in master.log.read_text().splitlines()
        )
    finally:
        subprocess.run(["rm", "-rf", str(target)], check=False)


class _Canary(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = CANARY.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_notebooks_address_and_token_come_from_the_masters_records(
    master: Master, alice: dict[str, str], canary: Path
) -> None:
    """Items 3 and 4: ``service.json`` pointing at a service on the master's loopback, and ``service_token``
    replaced by a link to a root-only file: the proxy reaches the notebook's own server, and nothing else."""
    internal = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Canary)  # reachable from the master only
    threading.Thread(target=internal.serve_forever, daemon=True).start()
    try:
        task_id = start_task(master, alice, "notebooks", {"resources": {"slots": 0}})
        running(master, alice, task_id, "notebooks")
        rd = run_dir(master, task_id)
        fake = json.dumps({"host": "127.0.0.1", "port": internal.server_address[1], "pid": 1})
        master.researcher.run(["sh", "-c", 'printf %s "$2" > "$1/service.json.x" && mv "$1/service.json.x" '
                               '"$1/service.json"', "sh", str(rd), fake])  # fmt: skip
        nb = wait_for(lambda: (t := task(master, alice, task_id, "notebooks")).get("isReady") and t, timeout_s=180,
                      what="the notebook to be ready", interval_s=1)  # fmt: skip
        assert nb["isReady"]
        url = f"{master.url}/proxy/{task_id}/api/status"
        status = httpx.get(url, headers=alice, timeout=30)
        assert status.status_code == 200 and CANARY not in status.text and "started" in status.json(), (
            status.text
        )
        token = rd / "service_token"
        master.researcher.run(["sh", "-c", 'rm -f "$1" && ln -s "$2" "$1"', "sh", str(token), str(canary)])
        time.sleep(2.5)  # past the proxy's cache of where the task is (2 s)
        again = httpx.get(url, headers=alice, timeout=30)
        assert again.status_code == 200 and CANARY not in again.text, again.text
        master.api("POST", f"/notebooks/{task_id}/kill", alice)
    finally:
        internal.shutdown()


SCAN = r"""
import json, sys, urllib.request
task = sys.argv[1]
ports = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A":
            ports.add(int(f[1].rsplit(":", 1)[1], 16))
found = {}
for port in sorted(ports):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/proxy/{task}/data/environment", timeout=3) as r:
            found[port] = r.status
    except Exception as e:
        found[port] = getattr(e, "code", None) or type(e).__name__
print(json.dumps(found))
"""
TB_CONTEXT = Path(__file__).parent / "tensorboard_context"
TB_CONFIG = """
name: e2e-tensorboard-dirs
entrypoint: python3 train.py
searcher: {name: single, metric: validation_loss, max_length: {batches: 4}}
resources: {slots_per_trial: 0}
max_restarts: 0
"""


def test_another_users_job_on_the_node_cannot_read_a_tensorboard(
    master: Master, alice: dict[str, str], other_researcher: Researcher
) -> None:
    """Items 6 and 7: TensorBoard's directories are made by the master (its own parents, the experiment's user's
    own directory), and another user's job on the TensorBoard's node finds no port that serves it without
    the token (TensorBoard used to listen on the node's loopback with none)."""
    exp = master.create_experiment(alice, TB_CONFIG, context=TB_CONTEXT)
    assert master.wait_state(alice, exp, {"STATE_COMPLETED", "STATE_ERROR"}, 180) == "STATE_COMPLETED", \
        master.diagnose(exp)  # fmt: skip
    shared = master.root / "checkpoints" / "tensorboard" / "experiment"
    owners = [(p.stat().st_uid, p.stat().st_mode & 0o7777) for p in (shared.parent, shared)]
    if isinstance(master, ServiceMaster):  # made by the admin (docs/admin.md): the service account's
        svc = pwd.getpwnam(SERVICE).pw_uid
        assert owners == [(svc, 0o755), (svc, 0o1733)]
    else:
        assert owners == [(0, 0o755), (0, 0o755)]
    assert (shared / str(exp)).stat().st_uid == master.researcher.uid
    r = master.api("POST", "/tensorboards", alice, json={"experimentIds": [exp]})
    task_id = str(r["tensorboard"]["id"])
    tb = wait_for(lambda: (t := task(master, alice, task_id, "tensorboards")).get("isReady") and t, timeout_s=180,
                  what="TensorBoard to be ready", interval_s=1)  # fmt: skip
    node = tb["nodeList"]
    script = SHARED_TEST_ROOT / f"scan-{uuid.uuid4().hex[:8]}.py"
    script.write_text(SCAN)
    script.chmod(0o644)
    try:
        scan = other_researcher.run(
            ["srun", "-w", node, "-p", "batch", "-t", "2", sys.executable, str(script), task_id],
            timeout_s=120,
        )
        found = json.loads(scan.stdout.strip().splitlines()[-1])
        assert found and 200 not in found.values(), found  # the door answers 403 without the token
        proxied = httpx.get(f"{master.url}/proxy/{task_id}/data/environment", headers=alice, timeout=30)
        assert proxied.status_code == 200, proxied.text
    finally:
        script.unlink(missing_ok=True)
        master.api("POST", f"/tensorboards/{task_id}/kill", alice)
