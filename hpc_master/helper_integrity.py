"""Whether the service account could change the helper it runs as every user (issue 34, item 3).

The sudoers rule lets the service account run one command line as any member of the users' group. Whoever can
change what that command line runs — the interpreter, the venv's ``pyvenv.cfg`` (it names the standard library),
the helper's code (``userhelper``, ``userfiles``) or its byte-code caches, the directory its script puts first on
``sys.path``, the standard library — can run anything as every user. So each of those files and directories, and
every directory above them, must be root's and not writable by the service account (a sticky directory such as
``/var/tmp`` may be: nobody can rename root's entries in it). A master that would serve as its service account
checks this once it is that account, and refuses to start otherwise, naming what to fix.

Writability is read from the mode bits for the account's uid and groups (POSIX ACLs are not read).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from hpc_master.helper_client import SCRIPT

PACKAGES = ("userhelper", "userfiles")
"""What the helper imports besides the standard library (``userhelper/run.py``)."""


def helper_paths(python: str = sys.executable, script: str = SCRIPT) -> list[Path]:
    """Every file and directory the helper's command line runs or imports from, and every directory above."""
    install = Path(script).parent.parent
    found: list[Path] = [Path(python), Path(os.path.realpath(python)), Path(script)]
    venv_cfg = Path(python).parent.parent / "pyvenv.cfg"
    if venv_cfg.exists():
        found.append(venv_cfg)
    for package in PACKAGES:
        found.append(install / package)
        found.extend(sorted((install / package).rglob("*")))
    found.extend(_stdlib_path(python))
    out: dict[Path, None] = {}
    for path in found:
        out[path] = None
        for parent in path.parents:
            out[parent] = None
    return list(out)


def _stdlib_path(python: str) -> list[Path]:
    """The interpreter's own ``sys.path`` as the helper runs it (``-I -S``: its standard library only)."""
    out = subprocess.run([python, "-I", "-S", "-c", "import sys; print(*sys.path, sep=chr(10))"],
                         capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
    return [Path(line) for line in out.splitlines() if line]


def problems(paths: Iterable[Path], uid: int, gids: Iterable[int]) -> list[str]:
    """What of `paths` is not root's, or is writable by `uid` (with groups `gids`) where that matters."""
    groups = set(gids)
    out = []
    for path in paths:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if st.st_uid != 0:
            out.append(f"{path} is owned by uid {st.st_uid}, not by root")
            continue
        sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if not stat.S_ISLNK(st.st_mode) and _writable(st, uid, groups) and not sticky_dir:
            out.append(f"{path} may be written by uid {uid} (mode {stat.S_IMODE(st.st_mode):o})")
    return out


def _writable(st: os.stat_result, uid: int, groups: set[int]) -> bool:
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IWUSR)
    if st.st_gid in groups:
        return bool(st.st_mode & stat.S_IWGRP)
    return bool(st.st_mode & stat.S_IWOTH)


def check(account: str, uid: int, gids: Iterable[int], python: str = sys.executable) -> list[str]:
    """The problems of this installation's helper for the service account `account`, each a line."""
    return [f"{p} (the service account {account} could run anything as every user)"
            for p in problems(helper_paths(python), uid, gids)]  # fmt: skip
