"""``userfiles``: what a user can put in a run directory (links, FIFOs, other accounts' files) is never followed,
read, blocked on, chowned or written through."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import userfiles


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "root" / "exp-1" / "trial-1" / "run-1").mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "canary").write_text("CANARY\n")
    return tmp_path / "root"


RUN = ("exp-1", "trial-1", "run-1")


def test_relative_parts_stay_below_the_anchor() -> None:
    assert userfiles.relative_parts("/a/b/", "/a/b/c/./d") == ("c", "d")
    for outside in ("/a/bc/d", "/a", "/a/b", "/a/b/../c", "/x/b/c"):
        with pytest.raises(userfiles.UnsafePathError):
            userfiles.relative_parts("/a/b", outside)
    with pytest.raises(userfiles.UnsafePathError):
        userfiles.relative_parts("a/b", "a/b/c")


def test_a_regular_file_is_read_from_an_offset_and_bounded(root: Path) -> None:
    (root.joinpath(*RUN) / "output.log").write_text("hello world\n")
    data, st = userfiles.read_bytes(root, (*RUN, "output.log"), offset=6, max_bytes=5)
    assert (data, st.st_size) == (b"world", 12)


def test_a_link_in_place_of_the_file_is_not_followed(root: Path) -> None:
    (root.joinpath(*RUN) / "output.log").symlink_to(root.parent / "secret" / "canary")
    with pytest.raises(userfiles.UnsafePathError):
        userfiles.read_bytes(root, (*RUN, "output.log"), max_bytes=100)
    assert not userfiles.exists(root, (*RUN, "nothing"))
    assert userfiles.exists(root, (*RUN, "output.log"))  # the link itself is there


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_a_link_in_place_of_a_directory_is_not_followed(root: Path, depth: int) -> None:
    """``exp-1``, ``trial-1`` or ``run-1`` replaced by a link to a directory holding an ``output.log``."""
    target = root.parent / "secret"
    (target.joinpath(*RUN[depth + 1 :])).mkdir(parents=True, exist_ok=True)
    target.joinpath(*RUN[depth + 1 :], "output.log").write_text("CANARY\n")
    replaced = root.joinpath(*RUN[: depth + 1])
    os.rename(replaced, root.parent / f"moved-{depth}")
    replaced.symlink_to(target)
    with pytest.raises(userfiles.UnsafePathError):
        userfiles.read_bytes(root, (*RUN, "output.log"), max_bytes=100)
    with pytest.raises(userfiles.UnsafePathError):
        userfiles.make_dirs(root, (*RUN, "more"))
    with pytest.raises(userfiles.UnsafePathError):
        userfiles.write_file(root, (*RUN, "plan.json"), b"{}")
    assert sorted(p.name for p in target.rglob("*")) == sorted(
        [*RUN[depth + 1 :], "canary", "output.log"]
    )  # nothing was made or written in the link's target


def _in_thread(fn: object, timeout: float = 5.0) -> BaseException | None:
    caught: list[BaseException] = []

    def run() -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as e:
            caught.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the read blocked"
    return caught[0] if caught else None


def test_a_fifo_is_refused_without_blocking(root: Path) -> None:
    os.mkfifo(root.joinpath(*RUN) / "exit.json")
    error = _in_thread(lambda: userfiles.read_json(root, (*RUN, "exit.json")))
    assert isinstance(error, userfiles.NotRegularError)


def test_a_directory_in_place_of_a_file_is_refused(root: Path) -> None:
    (root.joinpath(*RUN) / "exit.json").mkdir()
    with pytest.raises(userfiles.NotRegularError):
        userfiles.read_json(root, (*RUN, "exit.json"))


def test_json_larger_than_its_bound_is_refused(root: Path) -> None:
    (root.joinpath(*RUN) / "exit.json").write_text('{"a": "' + "x" * 100 + '"}')
    with pytest.raises(userfiles.FileTooLargeError):
        userfiles.read_json(root, (*RUN, "exit.json"), max_bytes=50)
    assert userfiles.read_json(root, (*RUN, "exit.json"))["a"] == "x" * 100


def test_writing_replaces_a_link_and_never_writes_through_it(root: Path) -> None:
    canary = root.parent / "secret" / "canary"
    (root.joinpath(*RUN) / "plan.json").symlink_to(canary)
    userfiles.write_file(root, (*RUN, "plan.json"), b"{}\n", mode=0o600)
    written = root.joinpath(*RUN) / "plan.json"
    assert not written.is_symlink() and written.read_text() == "{}\n"
    assert written.stat().st_mode & 0o777 == 0o600
    assert canary.read_text() == "CANARY\n"
    assert [p.name for p in root.joinpath(*RUN).iterdir()] == ["plan.json"]  # no temporary file left


def test_make_dirs_creates_what_is_missing(root: Path) -> None:
    userfiles.make_dirs(root, ("exp-2", "trial-3", "run-1"))
    assert (root / "exp-2" / "trial-3" / "run-1").is_dir()
    userfiles.make_dirs(root, ("exp-2", "trial-3", "run-1"))  # idempotent
    (root / "exp-2" / "file").write_text("")
    with pytest.raises(userfiles.UnsafePathError):
        userfiles.make_dirs(root, ("exp-2", "file", "x"))


@pytest.mark.root
def test_as_root_only_the_directory_owners_files_are_read_and_chown_goes_through_the_descriptor(
    root: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    user = 65534  # nobody
    userfiles.make_dirs(root, RUN, uid=user, gid=user)
    assert {root.joinpath(*RUN[:i]).stat().st_uid for i in (1, 2, 3)} == {user}
    hard = root.joinpath(*RUN) / "output.log"
    hard.write_text("root's\n")  # stands for a hard link to root's file (fs.protected_hardlinks forbids one)
    with pytest.raises(userfiles.UnsafePathError):
        userfiles.read_bytes(root, (*RUN, "output.log"), max_bytes=10)
    os.chown(hard, 4242, 4242)  # another account's file in the user's directory
    with pytest.raises(userfiles.UnsafePathError):
        userfiles.read_bytes(root, (*RUN, "output.log"), max_bytes=10)
    os.chown(hard, user, user)
    assert userfiles.read_bytes(root, (*RUN, "output.log"), max_bytes=10)[0] == b"root's\n"
    userfiles.write_file(root, (*RUN, "token"), b"t", mode=0o600, uid=user, gid=user)
    assert (root.joinpath(*RUN) / "token").stat().st_uid == user
    other = root / "exp-9"
    other.mkdir()
    os.chown(other, 12345, 12345)  # another account's directory is never handed to this user
    with pytest.raises(userfiles.UnsafePathError):
        userfiles.make_dirs(root, ("exp-9", "trial-1"), uid=user, gid=user)
    assert other.stat().st_uid == 12345


@pytest.mark.root
def test_as_root_tensorboard_parents_stay_the_masters_and_each_experiment_is_its_users(
    tmp_path: Path,
) -> None:
    """Issue 32 item 7: the first trial no longer creates ``tensorboard/experiment`` as its user."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    from hpc_master.trialjob_files import make_tensorboard_dir

    root = tmp_path / "checkpoints"
    make_tensorboard_dir(str(root), 1, 65534, 65534)
    make_tensorboard_dir(str(root), 2, 4242, 4242)
    shared = root / "tensorboard" / "experiment"
    assert [(p.stat().st_uid, p.stat().st_mode & 0o777) for p in (shared.parent, shared)] == [(0, 0o755)] * 2
    assert [(shared / n).stat().st_uid for n in ("1", "2")] == [65534, 4242]
    os.chown(shared, 4242, 4242)  # a user got hold of it (an older master let the first trial create it)
    with pytest.raises(userfiles.UnsafePathError, match="must be uid 0"):
        make_tensorboard_dir(str(root), 3, 65534, 65534)
    assert not (shared / "3").exists()


@pytest.mark.root
def test_as_root_a_users_tensorboard_parent_is_warned_about_once_and_submissions_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Where an older master let the first trial make ``tensorboard/experiment``, submissions still work (the
    trials make their own directories, as before) and the admin is told once."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    from types import SimpleNamespace

    from hpc_master.asuser import JobOwner, RunFiles
    from hpc_master.lifecycle.jobs import JobDriver

    root = tmp_path / "checkpoints"
    (root / "tensorboard" / "experiment").mkdir(parents=True)
    os.chown(root / "tensorboard", 4242, 4242)
    driver = SimpleNamespace(_tensorboard_warned=set(), files=RunFiles(str(tmp_path / "jobs")))
    for exp in (1, 2):
        owner = JobOwner(None, 65534, 65534)
        JobDriver._make_tensorboard_dir(driver, str(root), exp, owner)  # type: ignore[arg-type]
    warned = [r for r in caplog.records if "are not the master's" in r.getMessage()]
    assert len(warned) == 1 and f"chown {root}/tensorboard" in warned[0].getMessage()
    assert not (root / "tensorboard" / "experiment" / "1").exists()
