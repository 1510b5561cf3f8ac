"""Deleting checkpoint files as an account allowed to: the checkpoint owner's, when the master runs as root.

A root master never removes users' files with root's rights: it runs ``checkpoint_rmtree.py`` as the owner's
Unix account, as it submits their jobs (``runuser -u USER --``, an argv list, never a shell string), so a
storage root or a link that a user planted can only make the master remove what that user could remove
anyway. A master that runs as one user (a personal master) removes in-process, as that user. Directories
that do not exist are done without starting anything.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_master.services import checkpoint_rmtree

SCRIPT = Path(checkpoint_rmtree.__file__).resolve()
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class Owner:
    """The master user whose checkpoints are removed, and their Unix account."""

    name: str
    unix: str | None


@dataclass(frozen=True)
class Removal:
    ok: bool
    error: str | None = None
    touched: bool = False
    """Whether some of its files may be gone (a failed removal that got started)."""


def _gone(path: Path) -> bool:
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False  # cannot tell from here (a root-squashed NFS): the owner's process finds out
    return False


class CheckpointRemover:
    """`as_owner`: run the removal as each owner's Unix account (default: when the master runs as root)."""

    def __init__(
        self,
        *,
        as_owner: bool | None = None,
        python: str | None = None,
        timeout_s: float = 900.0,
        batch_size: int = 256,
    ) -> None:
        self.as_owner = os.geteuid() == 0 if as_owner is None else as_owner
        self.python = python or sys.executable
        self.timeout_s = timeout_s
        self.batch_size = batch_size

    def remove(self, owner: Owner, paths: Sequence[Path]) -> dict[Path, Removal]:
        out = {p: Removal(ok=True) for p in paths if _gone(p)}
        todo = [p for p in paths if p not in out]
        if not todo:
            return out
        if not self.as_owner:
            for path in todo:
                out[path] = _removal(checkpoint_rmtree.remove_dir(str(path)))
            return out
        account, refusal = owner_account(owner)
        if account is None:
            return {**out, **{p: Removal(ok=False, error=refusal) for p in todo}}
        for start in range(0, len(todo), self.batch_size):
            out.update(self._run_as(account, todo[start : start + self.batch_size]))
        return out

    def _run_as(self, account: str, paths: list[Path]) -> dict[Path, Removal]:
        search = os.environ.get("PATH") or DEFAULT_PATH
        for extra in ("/usr/sbin", "/sbin"):  # where runuser lives, missing from some services' PATH
            if extra not in search.split(":"):
                search += f":{extra}"
        argv = ["runuser", "-u", account, "--", self.python, "-I", str(SCRIPT)]
        env = {"PATH": search, "LANG": "C.UTF-8"}
        failure: str | None = None
        try:
            proc = subprocess.run(
                argv, input=json.dumps([str(p) for p in paths]), capture_output=True, text=True,
                timeout=self.timeout_s, cwd="/", env=env, check=False,
            )  # fmt: skip
            stdout, finished = proc.stdout, proc.returncode == 0
            if not finished:
                failure = (
                    f"removing as {account} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
                )
        except subprocess.TimeoutExpired as exc:
            raw = exc.stdout or ""
            stdout, finished = raw.decode() if isinstance(raw, bytes) else raw, False
            failure = f"removing as {account} took longer than {self.timeout_s:.0f} s"
        except OSError as exc:
            return {p: Removal(ok=False, error=f"cannot run runuser: {exc.strerror}") for p in paths}
        done: dict[str, Removal] = {}
        for line in stdout.splitlines():
            try:
                item: Any = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict) and isinstance(item.get("path"), str):
                done[item["path"]] = _removal(item)
        out: dict[Path, Removal] = {}
        started = False  # the first path with no answer was the one in progress when the run ended
        for path in paths:
            if str(path) in done:
                out[path] = done[str(path)]
                continue
            out[path] = Removal(ok=False, error=failure or "no answer", touched=not finished and not started)
            started = True
        return out


def _removal(item: dict[str, Any]) -> Removal:
    return Removal(ok=bool(item.get("ok")), error=item.get("error"), touched=bool(item.get("touched")))


def owner_account(owner: Owner) -> tuple[str | None, str]:
    """The Unix account to remove `owner`'s files as, or None and why not (as `JobDriver` refuses to submit:
    no account set, no such account here, or root)."""
    if not owner.unix:
        return None, (
            f"user {owner.name!r} has no Unix account to delete checkpoints as; an admin sets one with "
            f"`det user edit {owner.name} --unix-username NAME`"
        )
    try:
        pw = pwd.getpwnam(owner.unix)
    except KeyError:
        return None, f"Unix account {owner.unix!r} does not exist on the master's host"
    if pw.pw_uid == 0:
        return None, "checkpoints are never deleted as root; give the user a non-root Unix account"
    return owner.unix, ""
