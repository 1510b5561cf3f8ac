"""What `det deploy local down` may remove: only what `up` created, and what it keeps, it names.

`up` records each thing it creates; `down` then removes
- the daemons' own directories (configuration, devices, logs, slurmctld state, node spool, accounting database),
  with all their contents: every file in them is the daemons';
- every other directory `up` created (the state directory, its missing ancestors such as /var/lib/hpc-det,
  /etc/slurm, /var/tmp/pmix) only when it is empty once the daemons' files are gone: anything else in it was put
  there by someone else (the quickstart's master state, a user's files) and stays;
- the home of an account `up` created only when it holds nothing but what `useradd` put there (see
  `extra_entries`).
Everything it leaves is returned as a `Kept`, which the CLI prints.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Kept:
    """Something `down` left in place, and why."""

    what: str
    why: str

    def __str__(self) -> str:
        return f"Kept {self.what}: {self.why}"


def make_dirs(path: Path) -> list[Path]:
    """`mkdir -p path`; returns the directories it created, parents first (none when `path` existed)."""
    missing = []
    p = path
    while not (p.exists() or p.is_symlink()):
        missing.append(p)
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    return list(reversed(missing))


def remove_own_dir(path: Path) -> None:
    """Remove one of the daemons' own directories with everything in it (a symlink in its place is unlinked)."""
    if path.is_symlink():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def remove_if_empty(path: Path, why_created: str) -> Kept | None:
    """Remove a directory `up` created if nothing is left in it; otherwise keep it and say what it holds."""
    if path.is_symlink() or not path.is_dir():
        return None
    names = sorted(os.listdir(path))
    if not names:
        path.rmdir()
        return None
    return Kept(str(path), f"{why_created}, but it holds what `up` did not put there: {_some(names)}")


def fingerprint(path: Path) -> str:
    """What one entry is, for comparing: 'dir', 'file:<sha256 of the content>', 'link:<target>' or 'other'."""
    if path.is_symlink():
        return "link:" + os.readlink(path)
    if path.is_dir():
        return "dir"
    if path.is_file():
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        return "file:" + digest.hexdigest()
    return "other"


def manifest(root: Path) -> dict[str, str]:
    """Every entry under `root` (relative path → `fingerprint`); symlinked directories are not followed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            out[str(path.relative_to(root))] = fingerprint(path)
    return out


def extra_entries(root: Path, expected: Mapping[str, str], *, limit: int = 5) -> list[str]:
    """Entries under `root` that are not in `expected` with the same name and fingerprint (at most `limit`).

    This is the rule for "a home holds nothing but what `up` put there": every entry's relative path must be one
    `useradd` created (recorded by `manifest` right after it copied /etc/skel), with the same kind and, for a file,
    the same bytes (a symlink: the same target). Entries removed since are fine (nothing is lost); owners, modes and
    times are not compared. An unexpected directory is reported once, without walking into it.
    """
    extra: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath, name)
            rel = str(path.relative_to(root))
            want = expected.get(rel)
            if want is None or fingerprint(path) != want:
                extra.append(rel)
                if name in dirnames:
                    dirnames.remove(name)
                if len(extra) >= limit:
                    return extra
    return extra


def _some(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"
