"""Pack a context directory into Determined's ``modelDefinition`` list (``[{path, type, content, mode, mtime}]``).

As Determined: ``.detignore`` at the context root (gitignore syntax, via ``pathspec``) on top of
:data:`DEFAULT_IGNORES`; ``.detignore`` itself is not sent. Sizes are summed from ``stat`` before any file is
read, so a context over :data:`MAX_CONTEXT_BYTES` is refused at once, naming its largest files. Symbolic links
are never followed out of the directory: a link to a file inside the context is sent as that file's content, a
link that leaves the context (or any link to a directory) is skipped with a warning.
"""

from __future__ import annotations

import base64
import os
import stat
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pathspec

from hpc_master.errors import ClientError, PayloadTooLargeError

MAX_CONTEXT_BYTES = 95 * 1024 * 1024
DEFAULT_IGNORES = ("__pycache__/", "*.pyc", ".git/", ".ipynb_checkpoints/")
DETIGNORE = ".detignore"
REGTYPE = ord(tarfile.REGTYPE)
DIRTYPE = ord(tarfile.DIRTYPE)


def human_size(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError


@dataclass
class ContextEntry:
    rel: str
    source: Path
    is_dir: bool
    size: int
    mode: int
    mtime: int


@dataclass
class ContextPlan:
    root: Path
    entries: list[ContextEntry] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)


def ignore_spec(root: Path) -> pathspec.GitIgnoreSpec:
    lines = list(DEFAULT_IGNORES)
    detignore = root / DETIGNORE
    if detignore.is_file():
        lines += detignore.read_text(errors="replace").splitlines()
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _inside(target: Path, root: Path) -> bool:
    return target == root or root in target.parents


def plan_context(root: Path) -> ContextPlan:
    """Walk `root` (not following links) and list what would be sent, without reading file contents."""
    if not root.is_dir():
        raise ClientError(f"the context {str(root)!r} is not a directory")
    root = root.resolve()
    spec = ignore_spec(root)
    plan = ContextPlan(root)
    for parent, dirs, files in os.walk(root, followlinks=False):
        base = Path(parent)
        dirs[:] = [name for name in sorted(dirs) if _plan_dir(plan, spec, base / name)]
        for name in sorted(files):
            _plan_file(plan, spec, base / name)
    return plan


def _plan_dir(plan: ContextPlan, spec: pathspec.GitIgnoreSpec, path: Path) -> bool:
    """Add directory `path` to `plan`; whether the walk should descend into it."""
    rel = path.relative_to(plan.root).as_posix()
    if spec.match_file(rel + "/"):
        return False
    if path.is_symlink():
        plan.skipped.append(f"{rel} (link to a directory)")
        return False
    st = path.stat()
    plan.entries.append(ContextEntry(rel, path, True, 0, stat.S_IMODE(st.st_mode), int(st.st_mtime)))
    return True


def _plan_file(plan: ContextPlan, spec: pathspec.GitIgnoreSpec, path: Path) -> None:
    """Add file `path` to `plan` (a link inside the context as its target), or note why it is skipped."""
    rel = path.relative_to(plan.root).as_posix()
    if rel == DETIGNORE or spec.match_file(rel):
        return
    source = path
    if path.is_symlink():
        target = path.resolve()
        if not _inside(target, plan.root):
            plan.skipped.append(f"{rel} (link out of the context to {target})")
            return
        source = target
    try:
        st = source.stat()
    except OSError:
        plan.skipped.append(f"{rel} (cannot be read)")
        return
    if not stat.S_ISREG(st.st_mode):
        if not stat.S_ISDIR(st.st_mode):
            plan.skipped.append(f"{rel} (not a regular file)")
        else:
            plan.skipped.append(f"{rel} (link to a directory)")
        return
    plan.entries.append(
        ContextEntry(rel, source, False, st.st_size, stat.S_IMODE(st.st_mode), int(st.st_mtime))
    )


def check_size(plan: ContextPlan, limit_bytes: int = MAX_CONTEXT_BYTES) -> None:
    total = plan.total_bytes
    if total <= limit_bytes:
        return
    largest = sorted((e for e in plan.entries if not e.is_dir), key=lambda e: e.size, reverse=True)[:5]
    listing = "; ".join(f"{e.rel} ({human_size(e.size)})" for e in largest)
    raise PayloadTooLargeError(
        f"the context directory {plan.root} is {human_size(total)}, over the {human_size(limit_bytes)} "
        f"limit. Largest files: {listing}. Add them to {DETIGNORE} or move them out of the context."
    )


def read_context(plan: ContextPlan, progress: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """The ``modelDefinition`` list: base64 file contents, modes and mtimes."""
    items: list[dict[str, Any]] = []
    done = 0
    for entry in plan.entries:
        item: dict[str, Any] = {
            "path": entry.rel,
            "mode": entry.mode,
            "mtime": entry.mtime,
            "uid": 0,
            "gid": 0,
        }
        if entry.is_dir:
            item.update(type=DIRTYPE, content="")
        else:
            try:
                data = entry.source.read_bytes()
            except OSError as err:
                raise ClientError(f"cannot read {entry.rel} in the context: {err.strerror}") from None
            item.update(type=REGTYPE, content=base64.b64encode(data).decode("ascii"))
            done += len(data)
            if progress is not None:
                progress(done)
        items.append(item)
    return items


def warn_skipped(plan: ContextPlan) -> None:
    for what in plan.skipped:
        print(f"Warning: not sending {what}", file=sys.stderr)
