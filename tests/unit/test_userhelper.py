"""The per-user helper (``userhelper``), run for real as a non-root account (``nobody`` when the tests run as root):
what it does beneath its roots, what it refuses, and how the master's client turns its answers into results."""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import userfiles
from hpc_master.helper_client import (
    SCRIPT,
    HelperError,
    HelperPool,
    HelperSession,
    UserHelper,
    decode,
    encode,
    helper_command,
    slurm_runner,
)
from slurm_backend.cli import SlurmCli
from tests.conftest import require
from userhelper.ops import RefusedError, check_slurm_argv

NOBODY = pwd.getpwnam("nobody")


def _as_helper_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "nobody", "--", *argv] if os.geteuid() == 0 else argv


def _uid() -> int:
    return NOBODY.pw_uid if os.geteuid() == 0 else os.geteuid()


@pytest.fixture()
def tmp_path() -> Iterator[Path]:
    """A directory the helper's account can reach (pytest's own is root's 0700 when the tests run as root)."""
    path = Path(tempfile.mkdtemp(prefix="userhelper-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    """A job-storage-like root the helper's account may write (as a shared root with the sticky bit is)."""
    r = tmp_path / "jobs"
    r.mkdir()
    r.chmod(0o1777)
    return r


@pytest.fixture()
def helper(root: Path) -> Iterator[HelperSession]:
    with helper_for(helper_command([str(root)])) as session:
        yield session


def test_files_are_made_written_and_read_beneath_the_root_as_the_user(
    helper: HelperSession, root: Path
) -> None:
    run = root / "exp-1" / "trial-2" / "run-1"
    helper.call("write_files", anchor=str(root), path=str(run), files={"plan.json": ["{}", 0o640],
                                                                        "token": ["s3cret", 0o600]})  # fmt: skip
    for d in (root / "exp-1", run):
        st = d.stat()
        assert stat.S_IMODE(st.st_mode) == 0o750 and st.st_uid == _uid(), d
    assert (run / "token").stat().st_uid == _uid() and stat.S_IMODE((run / "token").stat().st_mode) == 0o600
    helper.call(
        "write", anchor=str(root), path=str(run / "ctx.tgz"), data=encode(b"\x00\x01" * 10), mode=0o640
    )
    got = helper.call("read", anchor=str(root), path=str(run / "ctx.tgz"), offset=2, max_bytes=4)
    assert got["size"] == 20 and decode(str(got["data"])) == b"\x00\x01\x00\x01"
    assert helper.call("exists", anchor=str(root), path=str(run / "plan.json"))["exists"] is True
    assert helper.call("exists", anchor=str(root), path=str(run / "nope"))["exists"] is False
    assert helper.call("read_json", anchor=str(root), path=str(run / "plan.json"))["value"] == {}


def test_nothing_outside_its_roots_and_no_link_is_followed(helper: HelperSession, root: Path) -> None:
    with pytest.raises(HelperError, match="not beneath the helper's roots"):
        helper.call("read", anchor="/etc", path="/etc/passwd")
    with pytest.raises(userfiles.UnsafePathError, match="not below"):
        helper.call("read", anchor=str(root), path=f"{root}/../../etc/passwd")
    with pytest.raises(HelperError, match="not beneath"):
        helper.call("write", anchor=f"{root}/../x", path=f"{root}/../x/y", data=encode(b"x"))
    (root / "link").symlink_to("/etc")
    with pytest.raises(userfiles.UnsafePathError, match="link"):
        helper.call("read", anchor=str(root), path=str(root / "link" / "passwd"))
    os.mkfifo(root / "fifo")
    with pytest.raises(userfiles.NotRegularError):  # refused at once: a FIFO never blocks the helper
        helper.call("read", anchor=str(root), path=str(root / "fifo"))
    with pytest.raises(FileNotFoundError):
        helper.call("read_json", anchor=str(root), path=str(root / "missing.json"))
    with pytest.raises(HelperError, match="not writable by others"):
        helper.call("write", anchor=str(root), path=str(root / "w"), data=encode(b"x"), mode=0o666)
    with pytest.raises(HelperError, match="unknown operation 'shell'"):
        helper.call("shell", command="id")
    assert helper.call("ping")["uid"] == _uid()  # every refusal was an answer: the helper still serves


def test_a_users_directory_is_made_or_checked_and_one_of_another_is_refused(
    root: Path, tmp_path: Path
) -> None:
    per_user = tmp_path / "scratch"
    per_user.mkdir()
    per_user.chmod(0o1777)
    argv = helper_command([str(root), f"{per_user}/{{unix_user}}/hpc-det"])
    with helper_for(argv) as helper:
        made = Path(helper.call("user_dir", root=str(root))["path"])
        assert made == root / "nobody" and made.stat().st_uid == _uid()
        assert stat.S_IMODE(made.stat().st_mode) == 0o750
        own = Path(helper.call("user_dir", root=f"{per_user}/nobody/hpc-det")["path"])
        assert own == per_user / "nobody" / "hpc-det" and own.is_dir()
        made.chmod(0o777)
        with pytest.raises(HelperError, match="may be written by others"):
            helper.call("user_dir", root=str(root))
        made.rmdir()
        made.symlink_to(tmp_path)
        with pytest.raises(HelperError, match="not a directory"):
            helper.call("user_dir", root=str(root))
        with pytest.raises(HelperError, match="not one of the helper's roots"):
            helper.call("user_dir", root=str(root / "nobody"))
    locked = tmp_path / "kept-by-the-admin"  # as on a root-squashed export: the user may not make it
    locked.mkdir(mode=0o555)
    if os.geteuid() != 0:
        with (
            helper_for(helper_command([str(locked)])) as helper,
            pytest.raises(
                HelperError,
                match=re.escape(f"an admin makes it once (install -d -o nobody -m 0700 {locked}/"),
            ),
        ):
            helper.call("user_dir", root=str(locked))


def helper_for(argv: list[str]) -> contextlib.closing[HelperSession]:
    return contextlib.closing(HelperSession(_as_helper_user(argv), "nobody", timeout_s=30))


def test_checkpoints_are_removed_without_following_links(helper: HelperSession, root: Path) -> None:
    ckpt = root / str(uuid.uuid4())
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "sub" / "model.pt").write_text("w")
    keep = root / "keep"
    keep.mkdir()
    (keep / "precious").write_text("p")
    (ckpt / "sub" / "link").symlink_to(keep)
    if os.geteuid() == 0:  # the helper's account's checkpoint
        for p in (ckpt, ckpt / "sub", ckpt / "sub" / "model.pt"):
            os.chown(p, _uid(), -1)
    removal = helper.call("rmtree", path=str(ckpt))["removal"]
    assert removal["ok"] and not ckpt.exists() and (keep / "precious").read_text() == "p"
    named = helper.call("rmtree", path=str(root / "not-a-uuid"))["removal"]
    assert not named["ok"] and "not a checkpoint directory" in named["error"]


def test_only_the_slurm_commands_the_master_needs() -> None:
    check_slurm_argv(["sbatch", "--parsable"], "#!/bin/sh\n")
    check_slurm_argv(["scancel", "123"], None)
    check_slurm_argv(["scancel", "--signal=USR1", "--batch", "123"], None)
    check_slurm_argv(["scontrol", "update", "JobId=12", "Nice=40"], None)
    for argv, stdin in [
        (["sbatch", "--parsable", "--wrap=id"], "x"),
        (["sbatch", "--parsable"], None),
        (["sbatch", "--parsable"], "x" * (5 << 20)),
        (["scancel", "-u", "alice"], None),
        (["scancel", "--signal=KILL;id", "1"], None),
        (["scontrol", "update", "JobId=12", "UserId=0"], None),
        (["srun", "id"], None),
        (["/bin/sh", "-c", "id"], None),
    ]:
        with pytest.raises(RefusedError):
            check_slurm_argv(argv, stdin)


def test_slurm_commands_run_as_the_user_through_the_helper(root: Path) -> None:
    """`SlurmCli`'s user runner: sbatch's answer comes back as a command result (here: no Slurm on PATH is a
    result too, not a crash), and a refused command line never runs."""

    class Local:
        def call(self, user: str, op: str, **fields: object) -> dict[str, object]:
            with helper_for(helper_command([str(root)])) as s:
                return s.call(op, **fields)

    run = slurm_runner(Local())  # type: ignore[arg-type]
    result = run("nobody", ["scontrol", "update", "JobId=1", "Nice=1"], None, 10)
    assert result.returncode != 0 and result.stderr
    cli = SlurmCli(user_runner=run, retries=0)
    with pytest.raises(Exception, match="not a command the helper runs"):
        cli.run(["squeue", "--me"], as_user="another-account")  # not the test's own: through the helper


def test_a_helper_that_does_not_answer_is_killed_at_its_deadline() -> None:
    session = HelperSession(["sleep", "30"], "nobody", timeout_s=0.5)
    with pytest.raises(HelperError) as caught:
        session.call("ping")
    assert caught.value.errno == errno.ETIMEDOUT
    session.close()
    gone = HelperSession(["false"], "nobody", timeout_s=5)
    with pytest.raises(HelperError, match="exited 1"):
        gone.call("ping")
    gone.close()


@pytest.mark.root
def test_the_helper_never_runs_as_root() -> None:
    require(os.geteuid() == 0, "root")
    proc = subprocess.run([sys.executable, "-I", SCRIPT, "--root", "/tmp"], input="", capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    assert proc.returncode == 2 and "never runs as root" in proc.stderr


class _OwnHelper(UserHelper):
    """The helper as the test's helper account, whatever user is named (no runuser or sudo needed)."""

    def argv(self, user: str) -> list[str]:
        return _as_helper_user(self.command)


def test_a_pools_helper_ends_once_idle_without_another_call_and_starts_again_when_needed(root: Path) -> None:
    """A user who stopped following logs keeps no process: the pool's reaper ends the idle helper by itself."""
    pool = HelperPool(_OwnHelper([str(root)]), idle_s=0.4)
    try:
        assert pool.call("nobody", "ping")["uid"] == _uid()
        assert pool.running() == 1
        deadline = time.monotonic() + 10
        while pool.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.running() == 0  # no call came: the reaper ended it
        assert pool.call("nobody", "ping")["uid"] == _uid() and pool.started == 2
        while pool.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.running() == 0  # and the reaper came back for the second one
    finally:
        pool.close()
