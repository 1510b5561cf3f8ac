"""``docs/admin.md`` stays true: its shell blocks are run, in order, from a scratch installation to a
researcher's experiment on the local Slurm cluster, backed up, upgraded (restarted) and read in the logs.

The convention (``docs/admin.md`` explains it to readers): a fenced block ``bash test`` is run as root, one
``bash test researcher`` as the cluster's researcher account (the page's ``alice``), one
``bash test researcher bob`` as a second account this test creates (``bob``), and ``bash manual`` is not run (it installs
packages or system accounts); every shell block must be one of these, and the manual ones are listed here, so a
new untested command fails the fast test. The blocks run in one bash session (``set -euo pipefail``), with:

- the page's paths mapped to a scratch directory on the "shared filesystem" (``SUBSTITUTIONS`` below), its
  ``det.example.org:8443`` to the test master's address on the cluster's network, ``alice`` to the
  researcher, the database ``detmaster`` to one of this test's on ``DET_TEST_PG_URL``'s server, and the
  ``docker://`` image to the test image served over HTTP (no registry here);
- ``systemctl``/``journalctl`` replaced by ``tests/admin/_unit_runner.py`` when PID 1 is not systemd.

What the page does to the machine beyond its scratch directory is undone afterwards: the CA certificate it
trusts (``update-ca-certificates``), its PostgreSQL role and databases, its service.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from hpc_master.db.engine import make_engine
from hpc_master.db.migrate import upgrade_to_head
from tests.conftest import require

from ._master_process import REPO, free_port
from .conftest import pg_server_url

GUIDE = REPO / "docs" / "admin.md"
SHELLS = {"bash", "sh", "shell", "console"}
MARKS = {("test",), ("test", "researcher"), ("test", "researcher", "bob"), ("manual",)}
MANUAL = {
    "python3 -m venv /opt/hpc-det/.venv": "installs the software (the test runs the checkout it is in)",
    "git -C /opt/hpc-det pull": "updates the software",
}
"""The first line of each ``bash manual`` block, and why a test does not run it."""
IMAGE = "docker://pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime"
CA_FILE = "/usr/local/share/ca-certificates/hpc-det.crt"
SHARED_TEST_ROOT = Path(os.environ.get("DET_TEST_SHARED_DIR", "/var/tmp/hpc-det-tests"))
BOB = "detguidebob"
"""The page's second researcher: a Unix account made for the test (the page adds its Slurm association)."""
SERVICE, USERS = "detguidesvc", "detguideusers"
"""The page's service account ``hpc-det`` and group ``hpc-det-users``, made by the page under these names."""


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    marks: tuple[str, ...]
    text: str


def shell_blocks(markdown: str) -> list[Block]:
    blocks, lines, i = [], markdown.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*(.*)$", lines[i])
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if m.group(1) in SHELLS:
            blocks.append(Block(i + 1, tuple(m.group(2).split()), "\n".join(lines[i + 1 : end]) + "\n"))
        i = end + 1
    return blocks


def test_every_shell_block_is_run_or_known_manual() -> None:
    blocks = shell_blocks(GUIDE.read_text())
    unmarked = [b.line for b in blocks if b.marks not in MARKS]
    assert not unmarked, f"docs/admin.md: mark the shell blocks at lines {unmarked} `bash test` (or manual)"
    manual = {b.text.splitlines()[0] for b in blocks if b.marks == ("manual",)}
    assert manual == set(MANUAL), "a `bash manual` block is not run by any test: run it, or list it in MANUAL"
    assert sum(b.marks[0] == "test" for b in blocks) >= 15


# ---------------------------------------------------------------- the whole page, on the real parts


@dataclass
class Scratch:
    id: str
    root: Path
    researcher: pwd.struct_passwd
    bob: pwd.struct_passwd
    host: str
    port: int
    pg_url: str  # the server's (SQLAlchemy)
    image_url: str

    @property
    def db_name(self) -> str:
        return f"detmaster_{self.id}"

    @property
    def ca_file(self) -> str:
        return CA_FILE.replace("hpc-det.crt", f"hpc-det-admin-guide-{self.id}.crt")

    @property
    def unit_root(self) -> Path:
        return self.root / "systemd-root"  # the stand-in's %S is its var/lib

    def substitutions(self) -> list[tuple[str, str]]:
        pg = make_url(self.pg_url)
        return [
            ("/opt/hpc-det", str(REPO)),
            ("/etc/hpc-det", str(self.root / "etc" / "hpc-det")),
            ("/etc/profile.d", str(self.root / "etc" / "profile.d")),
            ("/etc/systemd/system", str(self.root / "etc" / "systemd" / "system")),
            ("/shared/hpc-det", str(self.root / "shared")),
            ("/var/lib/hpc-det/master", str(self.unit_root / "var" / "lib" / "hpc-det" / "master")),
            ("/var/backups/hpc-det", str(self.root / "backups")),
            ("/etc/sudoers.d/hpc-det", self.sudoers),
            (CA_FILE, self.ca_file),
            ("DNS:det.example.org", f"IP:{self.host}"),
            ("det.example.org:8443", f"{self.host}:{self.port}"),
            ("det.example.org", self.host),
            ("port: 8443", f"port: {self.port}"),
            ("localhost:5432", f"{pg.host}:{pg.port}"),
            ("detmaster", self.db_name),
            (IMAGE, self.image_url),
        ]

    @property
    def sudoers(self) -> str:
        return f"/etc/sudoers.d/hpc-det-admin-guide-{self.id}"

    def apply(self, block: str) -> str:
        for old, new in self.substitutions():
            block = block.replace(old, new)
        # The account and the group, not the paths that carry the same words.
        block = re.sub(r"(?<![\w/.-])hpc-det-users(?![\w/.-])", USERS, block)
        block = re.sub(r"(?<![\w/.-])hpc-det(?![\w/.-])", SERVICE, block)
        block = re.sub(r"\balice\b", self.researcher.pw_name, block)
        return re.sub(r"\bbob\b", self.bob.pw_name, block)

    def home(self, account: pwd.struct_passwd) -> Path:
        return self.root / f"home-{account.pw_name}"


def cluster_address() -> str:
    from local_cluster.spec import LocalClusterSpec, get_state_dir

    record = json.loads((get_state_dir() / "state.json").read_text())
    return str(LocalClusterSpec.from_json(record["spec"]).controller_ip)


@functools.cache
def built_test_image() -> Path:
    proc = subprocess.run(
        [str(REPO / "scripts" / "build_test_image.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def image_server() -> Iterator[str]:
    """The test image over HTTP, standing in for a registry (``apptainer pull`` fetches ``http://`` SIFs)."""
    image = built_test_image()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(image.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{image.name}"
    finally:
        server.shutdown()


@pytest.fixture
def bob() -> Iterator[pwd.struct_passwd]:
    """The second researcher's Unix account, removed afterwards with the Slurm association the page gave it."""
    created = False
    try:
        pwd.getpwnam(BOB)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/bash", BOB], check=True, timeout=60)
        created = True
    try:
        yield pwd.getpwnam(BOB)
    finally:
        subprocess.run(
            ["sacctmgr", "-i", "delete", "user", f"name={BOB}"], capture_output=True, check=False, timeout=60
        )
        if created:
            subprocess.run(["userdel", BOB], capture_output=True, check=False, timeout=60)


def shim(bin_dir: Path, name: str) -> None:
    python = REPO / ".venv" / "bin" / "python"
    path = bin_dir / name
    path.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {python} -m tests.admin._unit_runner {name} "$@"\n')
    path.chmod(0o755)


def script(scratch: Scratch, blocks: list[Block]) -> str:
    """The page as one bash script: root's blocks inline, the researchers' through runuser."""
    parts = [
        "set -euo pipefail",
        "trap 'echo \"docs/admin.md: the block at line $BLOCK failed\" >&2' ERR",
    ]
    for block in blocks:
        body = scratch.apply(block.text)
        parts.append(f"BLOCK={block.line}; echo '::: docs/admin.md:{block.line}'")
        if block.marks[:2] == ("test", "researcher"):
            account, password = (
                (scratch.bob, "$BOB_PASSWORD")
                if block.marks[2:] == ("bob",)
                else (scratch.researcher, "$ALICE_PASSWORD")
            )
            home = scratch.home(account)
            path = scratch.root / f"researcher-{block.line}.sh"
            path.write_text(body)
            path.chmod(0o644)
            parts.append(
                f"(cd {home} && runuser -u {account.pw_name} -- env -i HOME={home} "
                f'PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 DET_PASS="{password}" '
                f"bash -euo pipefail {path})"
            )
        else:
            parts.append(body)
    return "\n".join(parts) + "\n"


def cleanup(scratch: Scratch, env: dict[str, str]) -> None:
    subprocess.run(["systemctl", "stop", "det-master"], env=env, check=False, timeout=120)
    admin = create_engine(scratch.pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        for name in (scratch.db_name, f"{scratch.db_name}_restored"):
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'DROP ROLE IF EXISTS "{scratch.db_name}"'))
    admin.dispose()
    Path(scratch.sudoers).unlink(missing_ok=True)
    subprocess.run(["userdel", SERVICE], capture_output=True, check=False, timeout=60)
    subprocess.run(["groupdel", USERS], capture_output=True, check=False, timeout=60)
    if os.path.exists(scratch.ca_file):
        os.unlink(scratch.ca_file)
        subprocess.run(["update-ca-certificates"], capture_output=True, check=False, timeout=120)
    shutil.rmtree(scratch.root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.postgres
@pytest.mark.apptainer
def test_the_admin_guide_runs_from_scratch_to_two_researchers_experiments(
    image_server: str, bob: pwd.struct_passwd
) -> None:
    from local_cluster.cluster import is_healthy

    require(
        os.geteuid() == 0 and is_healthy() and shutil.which("sbatch") is not None, "the local Slurm cluster"
    )
    require(shutil.which("apptainer") is not None, "Apptainer (sudo scripts/install_apptainer.sh)")
    require(shutil.which("update-ca-certificates") is not None, "update-ca-certificates")
    pg_url = pg_server_url()
    researcher = pwd.getpwnam(os.environ.get("DET_TEST_USER", "researcher"))
    subprocess.run(["userdel", SERVICE], capture_output=True, check=False, timeout=60)  # an earlier run's,
    subprocess.run(["groupdel", USERS], capture_output=True, check=False, timeout=60)  # killed before cleanup
    scratch_id = uuid.uuid4().hex[:8]
    SHARED_TEST_ROOT.mkdir(parents=True, exist_ok=True)
    root = SHARED_TEST_ROOT / f"admin-guide-{scratch_id}"
    root.mkdir(mode=0o755)
    scratch = Scratch(scratch_id, root, researcher, bob, cluster_address(), free_port(), pg_url, image_server)
    for directory in ("etc/profile.d", "etc/systemd/system", "root-home", "bin"):
        (root / directory).mkdir(parents=True)
    for account in (researcher, bob):
        scratch.home(account).mkdir()
        os.chown(scratch.home(account), account.pw_uid, account.pw_gid)
    # A master on SQLite keeps master.db in the unit's state directory: the page backs one up.
    sqlite_dir = scratch.unit_root / "var" / "lib" / "hpc-det" / "master"
    sqlite_dir.mkdir(parents=True)
    engine = make_engine(f"sqlite:///{sqlite_dir / 'master.db'}")
    upgrade_to_head(engine)
    engine.dispose()
    for name in ("systemctl", "journalctl"):
        if not Path("/run/systemd/system").is_dir():  # PID 1 is not systemd: the stand-in
            shim(root / "bin", name)
    pg = make_url(pg_url)
    env = {
        "PATH": f"{root / 'bin'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(root / "root-home"),
        "LANG": "C.UTF-8",
        "PGHOST": str(pg.host),  # psql and pg_dump as the postgres account reach the test's server
        "PGPORT": str(pg.port),
        "UNIT_RUNNER_UNITS": str(root / "etc" / "systemd" / "system"),
        "UNIT_RUNNER_ROOT": str(scratch.unit_root),
    }
    blocks = [b for b in shell_blocks(GUIDE.read_text()) if b.marks[0] == "test"]
    sources = [old for old, _ in scratch.substitutions()]
    page = "".join(b.text for b in blocks)
    assert all(old in page for old in sources), [old for old in sources if old not in page]
    (root / "guide.sh").write_text(script(scratch, blocks))
    started = time.monotonic()
    try:
        proc = subprocess.run(
            ["bash", str(root / "guide.sh")], env=env, cwd=root / "root-home", capture_output=True, text=True,
            timeout=900,
        )  # fmt: skip
        journal = scratch.unit_root / "run" / "det-master.service.journal"
        output = proc.stdout + proc.stderr
        log = journal.read_text(errors="replace")[-3000:] if journal.exists() else ""
        assert proc.returncode == 0, f"{output[-6000:]}\n--- the master's journal:\n{log}"
        print(f"{output}\ndocs/admin.md ran in {time.monotonic() - started:.0f} s")
        # The master that ran the last experiment serves as the service account: every uid of it, none root.
        pid = int((scratch.unit_root / "run" / "det-master.service.pid").read_text())
        uids = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("Uid:"))
        assert uids.split()[1:] == [str(pwd.getpwnam(SERVICE).pw_uid)] * 4, uids
        # Each researcher's trials ran as their own account: the run directories are theirs, not the other's;
        # alice's second one through her helper, from the service account.
        jobs = root / "shared" / "jobs"
        # The job storage is root's and not the service account's to write, as a root-squashed export is.
        assert (jobs.stat().st_uid, stat.S_IMODE(jobs.stat().st_mode)) == (0, 0o755)
        may_write = subprocess.run(["runuser", "-u", SERVICE, "--", "test", "-w", str(jobs)], timeout=60)
        assert may_write.returncode == 1
        alice_exps = sorted((jobs / researcher.pw_name).glob("exp-*"), key=lambda p: int(p.name[4:]))
        (bob_dir,) = (jobs / bob.pw_name).glob("exp-*")
        assert len(alice_exps) == 2, alice_exps
        alice_dir = alice_exps[0]
        for exp_dir, account in ((alice_exps[0], researcher), (alice_exps[1], researcher), (bob_dir, bob)):
            assert exp_dir.stat().st_uid == account.pw_uid
            logs = list(exp_dir.glob("trial-*/run-*/output.log"))
            assert logs and all(p.stat().st_uid == account.pw_uid for p in logs)
            assert all(p.lstat().st_uid == account.pw_uid for p in exp_dir.rglob("*")), exp_dir
        peek = subprocess.run(
            ["runuser", "-u", bob.pw_name, "--", "ls", str(alice_dir)], capture_output=True, timeout=60
        )
        assert peek.returncode != 0 and b"Permission denied" in peek.stderr
        # Bob's own view: his experiment only, and Slurm ran his job as him.
        sections = dict(re.findall(r"^::: docs/admin\.md:(\d+)\n(.*?)(?=^::: |\Z)", output, re.M | re.S))
        (bob_line,) = [b.line for b in blocks if b.marks == ("test", "researcher", "bob")]
        bob_says = sections[str(bob_line)]
        assert f"| {bob.pw_name} " in bob_says and f"| {researcher.pw_name} " not in bob_says, bob_says
        assert re.search(rf"^\s*{bob.pw_name}\s+det-e2-t2\s+COMPLETED", bob_says, re.M), bob_says
        # Their metrics came back to the master over HTTPS.
        db = create_engine(make_url(pg_url).set(database=scratch.db_name))
        with db.connect() as conn:
            # alice's and bob's first, and alice's from the service account
            assert conn.scalar(text("SELECT count(DISTINCT trial_id) FROM metrics")) == 3
            assert conn.execute(text("SELECT state FROM experiments")).scalars().all() == ["COMPLETED"] * 3
        db.dispose()
        assert "ok\n" in output and "********" in output and 'Status: "serving on 0.0.0.0:' in output
        (upgrade_line,) = [b.line for b in blocks if "det experiment list --all" in b.text]
        after_restart = sections[str(upgrade_line)]  # `det experiment list --all` after the restart
        assert f"| {researcher.pw_name} " in after_restart and f"| {bob.pw_name} " in after_restart
    finally:
        cleanup(scratch, env)
