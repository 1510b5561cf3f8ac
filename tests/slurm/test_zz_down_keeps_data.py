"""`det deploy local down` removes exactly what `up` created: files others put in its directories, a researcher's
home with their files, and the quickstart's master state survive it, and a later `up` finds them again.

Named to run last among the Slurm tests. Each test takes the session's cluster down, brings up one of its own whose
state directory is `<top>/local-slurm` with `<top>` a fresh directory under /var/lib that `up` creates, just as it
creates /var/lib/hpc-det on a fresh machine, and at the end brings the session's cluster back up as it was.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import ssl
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from local_cluster import cleanup, system
from local_cluster.spec import LocalClusterSpec, get_state_dir
from tests.slurm.fixtures import REPO, Researcher, up_args

# exclusive: takes the cluster down and brings it back up
pytestmark = [pytest.mark.slurm, pytest.mark.exclusive]
DET = [sys.executable, "-m", "hpc_master.cli.main"]
SMALL = ["--no-install", "--nodes", "1", "--gpus-per-node", "1", "--cpus-per-node", "2"]


def ssl_context(cert: Path) -> ssl.SSLContext:
    """Trusting only the master's own generated certificate."""
    return ssl.create_default_context(cafile=str(cert))


def run(cmd: list[str], env: dict[str, str], timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        cwd="/",
        env={**os.environ, **env},
    )


@dataclass
class Scratch:
    """A cluster of the test's own: its state directory under a fresh `top`, and fresh account names."""

    top: Path
    env: dict[str, str]
    users: list[str]

    @property
    def state_dir(self) -> Path:
        return self.top / "local-slurm"

    def det(self, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
        return run([*DET, *args], self.env, timeout_s)

    def record(self) -> dict[str, Any]:
        return dict(json.loads((self.state_dir / "state.json").read_text()))

    def user(self) -> str:
        name = f"dt{uuid.uuid4().hex[:8]}"
        self.users.append(name)
        return name


def kept_lines(stdout: str) -> dict[str, str]:
    """`down`'s "Kept PATH: WHY" lines, by path."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("Kept "):
            what, why = line[len("Kept ") :].split(": ", 1)
            out[what] = why
    return out


def home_of(name: str) -> Path:
    return Path("/home") / name


@pytest.fixture()
def scratch(researcher: Researcher) -> Iterator[Scratch]:
    session_record = json.loads((get_state_dir() / "state.json").read_text())
    proc = run([*DET, "deploy", "local", "down"], {})
    assert proc.returncode == 0, proc.stderr
    top = Path(f"/var/lib/hpc-det-test-{uuid.uuid4().hex[:8]}")
    s = Scratch(top, {"DET_LOCAL_SLURM_DIR": str(top / "local-slurm")}, [])
    try:
        yield s
    finally:
        if (s.state_dir / "state.json").exists():
            s.det("deploy", "local", "down")
        shutil.rmtree(top, ignore_errors=True)
        for name in s.users:
            subprocess.run(["userdel", name], capture_output=True, check=False)
            shutil.rmtree(home_of(name), ignore_errors=True)
        again = run([*DET, *up_args(session_record)], {})
        assert again.returncode == 0, again.stderr


def test_down_keeps_what_others_put_where_up_created_and_a_researchers_home(scratch: Scratch) -> None:
    keeper, plain = scratch.user(), scratch.user()
    up = scratch.det("deploy", "local", "up", *SMALL, "--create-user", keeper, "--create-user", plain)
    assert up.returncode == 0, up.stderr
    record = scratch.record()
    assert record["created_dirs"][0] == str(
        scratch.top
    )  # `up` created it, as /var/lib/hpc-det on a fresh machine
    spec = LocalClusterSpec.from_json(record["spec"])

    # After `up`: a user's file and a master's state directory next to the cluster's, a file in the cluster's own
    # state directory, and a researcher's result in their home.
    notes = scratch.top / "notes.txt"
    notes.write_text("mine\n")
    master = scratch.top / "quickstart"
    (master / "data").mkdir(parents=True)
    (master / "data" / "master.db").write_bytes(b"SQLite format 3\x00" + os.urandom(64))
    (master / "admin.password").write_text("s3cret\n")
    (master / "checkpoints" / "0b5e").mkdir(parents=True)
    (master / "checkpoints" / "0b5e" / "state.pt").write_bytes(os.urandom(256))
    master_before = cleanup.manifest(master)
    mine_in_state_dir = scratch.state_dir / "mine.txt"
    mine_in_state_dir.write_text("also mine\n")
    pw = pwd.getpwnam(keeper)
    subprocess.run(
        ["runuser", "-u", keeper, "--", "sh", "-c", "echo 0.97 > ~/results.txt"], check=True, cwd="/"
    )
    keeper_home_before = cleanup.manifest(home_of(keeper))

    down = scratch.det("deploy", "local", "down")
    assert down.returncode == 0, down.stderr
    # Everything it created and nobody else touched is gone...
    assert not system.link_exists(spec.bridge)
    assert not (scratch.state_dir / "state.json").exists()
    for d in spec.daemon_dirs:
        assert not d.exists(), d
    for name in (keeper, plain):
        with pytest.raises(KeyError):
            pwd.getpwnam(name)
    assert not home_of(plain).exists()  # only the skeleton useradd copied: removed
    # ... and what others put there survives, each kept path named with its reason.
    assert notes.read_text() == "mine\n"
    assert cleanup.manifest(master) == master_before
    assert mine_in_state_dir.read_text() == "also mine\n"
    assert sorted(os.listdir(scratch.state_dir)) == ["mine.txt"]
    assert cleanup.manifest(home_of(keeper)) == keeper_home_before
    assert home_of(keeper).stat().st_uid == pw.pw_uid
    kept = kept_lines(down.stdout)
    assert set(kept) == {str(scratch.top), str(scratch.state_dir), str(home_of(keeper))}, down.stdout
    assert "notes.txt" in kept[str(scratch.top)] and "quickstart" in kept[str(scratch.top)]
    assert "mine.txt" in kept[str(scratch.state_dir)]
    assert keeper in kept[str(home_of(keeper))] and "results.txt" in kept[str(home_of(keeper))]


def test_up_again_gives_the_kept_home_back_to_its_researcher(scratch: Scratch) -> None:
    name = scratch.user()
    up = scratch.det("deploy", "local", "up", *SMALL, "--create-user", name)
    assert up.returncode == 0, up.stderr
    uid = pwd.getpwnam(name).pw_uid
    subprocess.run(["runuser", "-u", name, "--", "sh", "-c", "echo 1 > ~/run1.txt"], check=True, cwd="/")
    (scratch.top / "quickstart").mkdir()
    assert scratch.det("deploy", "local", "down").returncode == 0
    assert (home_of(name) / "run1.txt").exists() and (scratch.top / "quickstart").is_dir()

    # The top directory (with the master's state in it) and the home are there already: `up` copes, and the
    # account it creates again owns the home, so the researcher can write there.
    again = scratch.det("deploy", "local", "up", *SMALL, "--create-user", name)
    assert again.returncode == 0, again.stderr
    assert pwd.getpwnam(name).pw_uid == uid
    record = scratch.record()
    assert str(scratch.top) not in record["created_dirs"]
    assert record["created_homes"] == {}  # the home was there before this `up`
    subprocess.run(["runuser", "-u", name, "--", "sh", "-c", "echo 2 > ~/run2.txt"], check=True, cwd="/")

    down = scratch.det("deploy", "local", "down")
    assert down.returncode == 0, down.stderr
    kept = kept_lines(down.stdout)
    assert "existed before `up`" in kept[str(home_of(name))], down.stdout
    assert {p.name for p in home_of(name).iterdir()} >= {"run1.txt", "run2.txt", ".bashrc"}
    assert (scratch.top / "quickstart").is_dir()
    assert not scratch.state_dir.exists()  # this `up` created it, and it was empty once its files were gone


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def test_quickstart_finds_its_master_and_experiments_after_down_and_up(scratch: Scratch) -> None:
    """up (by the quickstart) → quickstart → down → up → quickstart: the first run's experiment is still listed."""
    name = scratch.user()
    state = scratch.top / "quickstart"
    scratch.env.update(
        DET_QUICKSTART_DIR=str(state), DET_QUICKSTART_USER=name, DET_QUICKSTART_PORT=str(_free_port()),
        DET_QUICKSTART_UI_PORT=str(_free_port()),
    )  # fmt: skip
    master_env = {**scratch.env, "DET_MASTER_STATE_DIR": str(state)}
    quickstart = [str(REPO / "scripts" / "quickstart.sh")]
    try:
        first = run(quickstart, scratch.env, timeout_s=400)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        # It ends by saying where the web UI is (over HTTPS, with the master's own certificate, whose
        # fingerprint it prints) and how to log in; that page answers, and the plain port sends browsers there.
        ip = LocalClusterSpec().controller_ip
        url = f"http://{ip}:{scratch.env['DET_QUICKSTART_PORT']}"
        ui = f"https://{ip}:{scratch.env['DET_QUICKSTART_UI_PORT']}"
        assert f"The web UI: {ui}/" in first.stdout, first.stdout[-2000:]
        assert f"log in as {name}, with the password in {state / f'{name}.password'}" in first.stdout
        cert = state / "tls" / "browser.crt"
        assert "<title>" in httpx.get(f"{ui}/login", timeout=10, verify=ssl_context(cert)).text
        fingerprint = run(["openssl", "x509", "-in", str(cert), "-noout", "-fingerprint", "-sha256"], {})
        assert fingerprint.stdout.strip().split("=")[1] in first.stdout
        sent = httpx.get(f"{url}/login", headers={"accept": "text/html"}, timeout=10)
        assert sent.status_code == 307 and sent.headers["location"] == f"{ui}/login"
        exp1 = _experiment_id(first.stdout)
        best1 = _best_checkpoint(first.stdout)

        # The quickstart's own last lines: remove the cluster; then the master stops too (as after a reboot).
        down = scratch.det("deploy", "local", "down")
        assert down.returncode == 0, down.stderr
        kept = kept_lines(down.stdout)
        assert "quickstart" in kept[str(scratch.top)], down.stdout
        assert str(home_of(name)) in kept, down.stdout  # the researcher's login token is there
        stop = run([str(REPO / ".venv" / "bin" / "det-master"), "--stop"], master_env)
        assert stop.returncode == 0, stop.stderr
        for kept_file in ("data/master.db", "admin.password", f"{name}.password", f"checkpoints/{best1}"):
            assert (state / kept_file).exists(), kept_file

        up = scratch.det("deploy", "local", "up", "--no-install", "--nodes", "2", "--gpus-per-node", "2",
                         "--create-user", name)  # fmt: skip
        assert up.returncode == 0, up.stderr
        # The second run needs no search: one trial (const.yaml) shows the restarted master at work.
        second = run(quickstart, {**scratch.env, "DET_QUICKSTART_CONFIG": "const.yaml"}, timeout_s=400)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        assert "starting it on its existing state" in second.stdout
        assert "already exists: reusing it" in second.stdout  # the master user, from the surviving database
        assert _experiment_id(second.stdout) > exp1

        as_researcher = {
            "DET_MASTER": url,
            "DET_USER": name,
            "DET_PASS": (state / f"{name}.password").read_text().strip(),
        }
        listed = run(["runuser", "-u", name, "--", "env", *[f"{k}={v}" for k, v in as_researcher.items()],
                      *DET, "e", "list", "--json"], {})  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        by_id = {e["id"]: e for e in json.loads(listed.stdout)["experiments"]}
        assert by_id[exp1]["state"] == "STATE_COMPLETED", by_id
        best = run(["runuser", "-u", name, "--", "env", *[f"{k}={v}" for k, v in as_researcher.items()],
                    *DET, "e", "list-checkpoints", "--best", "1", str(exp1), "--json"], {})  # fmt: skip
        assert best.returncode == 0, best.stderr
        assert json.loads(best.stdout)["checkpoints"][0]["uuid"] == best1
        assert (state / "checkpoints" / best1).is_dir()
    finally:
        run([str(REPO / ".venv" / "bin" / "det-master"), "--stop"], master_env)


def _experiment_id(stdout: str) -> int:
    for line in stdout.splitlines():
        if line.startswith("Created experiment "):
            return int(line.split()[-1])
    raise AssertionError(f"no experiment in the quickstart's output:\n{stdout[-2000:]}")


def _best_checkpoint(stdout: str) -> str:
    for line in stdout.splitlines():
        if line.startswith("Its checkpoint: "):
            return line.split(": ", 1)[1].strip()
    raise AssertionError(f"no checkpoint in the quickstart's output:\n{stdout[-2000:]}")
