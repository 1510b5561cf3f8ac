"""Deleting checkpoint files as an account allowed to: the checkpoint owner's, when the master runs as root.

A master that acts for its users never removes their files with its own rights: its per-user helper
(``userhelper``) removes them as the owner's Unix account, as it submits their jobs (an argv list and JSON,
never a shell string), so a
storage root or a link that a user planted can only make the master remove what that user could remove
anyway. A master that runs as one user (a personal master) removes in-process, as that user. Directories
that do not exist are done without starting anything.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_master.helper_client import UserHelper
from userhelper import rmtree


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
    """`as_owner`: remove as each owner's Unix account, through `helper` (default: when the master runs as
    root; the master gives it its own helper)."""

    def __init__(
        self,
        *,
        as_owner: bool | None = None,
        helper: UserHelper | None = None,
        timeout_s: float = 900.0,
        batch_size: int = 256,
    ) -> None:
        self.as_owner = os.geteuid() == 0 if as_owner is None else as_owner
        self.helper = helper or UserHelper([], timeout_s=timeout_s)  # rmtree needs no root of the helper's
        self.batch_size = batch_size

    def remove(self, owner: Owner, paths: Sequence[Path]) -> dict[Path, Removal]:
        out = {p: Removal(ok=True) for p in paths if _gone(p)}
        todo = [p for p in paths if p not in out]
        if not todo:
            return out
        if not self.as_owner:
            for path in todo:
                out[path] = _removal(rmtree.remove_dir(str(path)))
            return out
        return {**out, **self._remove_as_owner(owner, todo)}

    def _remove_as_owner(self, owner: Owner, paths: list[Path]) -> dict[Path, Removal]:
        """Remove as the owner's Unix account, `batch_size` paths a helper process; all refused without one."""
        account, refusal = owner_account(owner)
        if account is None:
            return {p: Removal(ok=False, error=refusal) for p in paths}
        out: dict[Path, Removal] = {}
        for start in range(0, len(paths), self.batch_size):
            out.update(self._run_as(account, paths[start : start + self.batch_size]))
        return out

    def _run_as(self, account: str, paths: list[Path]) -> dict[Path, Removal]:
        """One helper process for the batch; a path whose removal was under way when it failed may be
        partly gone (``touched``), the ones after it were not started."""
        out: dict[Path, Removal] = {}
        try:
            with self.helper.session(account) as helper:
                for i, path in enumerate(paths):
                    try:
                        out[path] = _removal(helper.call("rmtree", path=str(path))["removal"])
                    except OSError as e:
                        out[path] = Removal(ok=False, error=f"removing as {account} failed: {e.strerror}",
                                            touched=True)  # fmt: skip
                        for rest in paths[i + 1 :]:
                            out[rest] = Removal(ok=False, error=f"removing as {account} failed: {e.strerror}")
                        break
        except OSError as e:  # the helper could not be started
            return {p: Removal(ok=False, error=f"cannot remove as {account}: {e.strerror}") for p in paths}
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
