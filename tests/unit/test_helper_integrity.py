"""The helper's integrity check (hpc_master/helper_integrity.py): what a service account could change of the
helper it runs as every user is found and named; a root-owned installation passes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hpc_master.helper_client import SCRIPT
from hpc_master.helper_integrity import helper_paths, problems

SERVICE_UID, SERVICE_GID = 4242, 4243  # an account that owns nothing here


def _install(tmp_path: Path) -> tuple[Path, Path]:
    """An installation of the helper's two packages and a venv python link, made by the test's user."""
    install = tmp_path / "opt" / "hpc-det"
    for package in ("userhelper", "userfiles"):
        (install / package / "__pycache__").mkdir(parents=True)
        (install / package / "__init__.py").write_text("")
    (install / "userhelper" / "run.py").write_text("")
    (install / ".venv" / "bin").mkdir(parents=True)
    (install / ".venv" / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\n")
    python = install / ".venv" / "bin" / "python3"
    python.symlink_to(os.path.realpath(sys.executable))
    return python, install / "userhelper" / "run.py"


def test_every_file_the_helper_runs_or_imports_and_every_directory_above_is_checked(tmp_path: Path) -> None:
    python, script = _install(tmp_path)
    paths = set(helper_paths(str(python), str(script)))
    install = script.parent.parent
    wanted = {
        python, Path(os.path.realpath(python)), script, install / ".venv" / "pyvenv.cfg",
        install / "userfiles" / "__init__.py", install / "userhelper" / "__pycache__", install, tmp_path, Path("/"),
    }  # fmt: skip
    assert wanted <= paths, wanted - paths
    assert any(p.name == "lib-dynload" for p in paths) or not any("lib-dynload" in str(p) for p in sys.path)


def test_what_is_not_roots_or_may_be_written_is_named(tmp_path: Path) -> None:
    python, script = _install(tmp_path)
    script.chmod(0o666)
    found = problems(helper_paths(str(python), str(script)), SERVICE_UID, [SERVICE_GID])
    if os.geteuid() != 0:  # the test's user made them: each is someone's other than root
        assert f"{script} is owned by uid {os.geteuid()}, not by root" in found
        assert (
            f"{script.parent.parent / '.venv' / 'pyvenv.cfg'} is owned by uid {os.geteuid()}, not by root"
            in found
        )
    else:  # root's, but anyone may change the helper's script
        assert f"{script} may be written by uid {SERVICE_UID} (mode 666)" in found


def test_root_s_files_writable_by_the_account_or_its_group_are_named_and_sticky_directories_are_not(
    tmp_path: Path,
) -> None:
    """Mode bits against the account's uid and groups, on files the check sees as root's (os.lstat is real, so
    this uses the root-owned files every machine has, and reads writability with the account as their group)."""
    etc = os.lstat("/etc")
    assert etc.st_uid == 0
    # /etc is 0755: the account writes it only as its owner; the group bits do not give it.
    assert problems([Path("/etc")], SERVICE_UID, [etc.st_gid]) == []
    assert problems([Path("/etc")], 0, []) == ["/etc may be written by uid 0 (mode 755)"]
    tmp = Path("/tmp")
    if os.lstat(tmp).st_uid == 0 and os.lstat(tmp).st_mode & 0o1000:
        assert problems([tmp], SERVICE_UID, [SERVICE_GID]) == []  # sticky: root's entries stay root's


def test_this_installation_passes_where_it_is_roots() -> None:
    if Path(SCRIPT).stat().st_uid != 0:
        return  # a developer's own checkout: not an installation a service account may use
    assert problems(helper_paths(), SERVICE_UID, [SERVICE_GID]) == []
