"""The one seam for what the master does in a user's name: their run directories' files, their Slurm jobs and
their checkpoints.

A trial's or task's run directory is its owner's once the job runs there, a job is its owner's process, and a
checkpoint directory is written by its owner's job. Everything the master does to them goes through `AsUser`:

- `AsUser.files` (`RunFiles`): run directories made and written before a job is submitted (owned by the job's
  account), and the job's files read back (``exit.json``, ``service.json``, logs), all below the job storage
  root and never through a link (``userfiles``);
- `AsUser.slurm` (`SlurmJobs`): sbatch (as the job's account), scancel, the poll;
- `AsUser.checkpoints` (`CheckpointRemover`): checkpoint directories removed as their owner's account.

A master that acts for its users (root, or its service account) does all of it through the per-user helper
(``userhelper``, run as the user by `helper_client.UserHelper`): `HelperRunFiles`, the Slurm commands of
`SlurmCli`'s ``user_runner`` and the checkpoint remover; a personal master does it all itself (`RunFiles`). `tests/unit/test_layering.py` keeps the rest of the master
from reaching ``userfiles`` or the run-directory writers around it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import userfiles
from hpc_master import trialjob_files as _files
from hpc_master.helper_client import HelperPool, UserHelper, encode
from hpc_master.lifecycle.job_host import job_account
from hpc_master.lifecycle.slurm_jobs import SlurmJobs
from hpc_master.services.checkpoints.remover import CheckpointRemover
from hpc_master.trialjob import USER_TEMPLATE, TrialJobPlan, user_job_root

UnsafePathError = userfiles.UnsafePathError


@dataclass(frozen=True)
class JobOwner:
    """The account a user's jobs and files are made for: `unix` (None: the master's own account) and, for a
    root master, its ids (what the master creates is chowned to them)."""

    unix: str | None = None
    uid: int | None = None
    gid: int | None = None

    @classmethod
    def of(cls, owner_name: str, unix_user: str | None, *, acts_for_users: bool) -> JobOwner:
        """The jobs of a master that acts for its users run as the user's Unix account (refused without one,
        or for root); a personal master's as itself."""
        if not acts_for_users:
            return cls()
        uid, gid = job_account(owner_name, unix_user)
        return cls(unix_user, uid, gid)


class RunFiles:
    """Files below `root` (the job storage root), where users' jobs run: made, written and read beneath it
    without following a link, regular files only, bounded (``userfiles``)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def user_root(self, owner: JobOwner) -> str:
        """The owner's directory below the root (``trialjob.user_job_root``)."""
        return user_job_root(self.root, owner.unix)

    def ensure_user_root(self, owner: JobOwner) -> str:
        """The owner's directory, made (a root master chowns it to the owner) or found; returns it."""
        path = self.user_root(owner)
        if owner.uid is None:
            os.makedirs(path, exist_ok=True)  # the master's own
            return path
        if USER_TEMPLATE in self.root:
            raise UnsafePathError(f"a per-user job storage root ({self.root}) needs the per-user helper")
        os.makedirs(self.root, exist_ok=True)  # the master's own (its configuration): followed as it is
        userfiles.make_dirs(self.root, (os.path.basename(path),), mode=0o750, uid=owner.uid, gid=owner.gid)
        return path

    def make_dir(self, path: str, owner: JobOwner, *, anchor: str | None = None) -> None:
        """`path` and every directory between the anchor (default: the root) and it, the owner's."""
        _files.make_dir(anchor or self.root, path, owner.uid, owner.gid)

    def make_masters_dir(self, *names: str, mode: int) -> None:
        """A directory of the master's own below the root (others may pass through it, not change it)."""
        os.makedirs(self.root, exist_ok=True)  # the master's own (its configuration): followed as it is
        userfiles.make_dirs(self.root, names, mode=mode)

    def write(
        self, path: str, data: bytes, owner: JobOwner, *, mode: int = 0o640, anchor: str | None = None
    ) -> None:
        """`data` at `path`, exactly `mode`, the owner's; under a new name and renamed (all of it or none)."""
        _files.write_bytes(anchor or self.root, path, data, owner.uid, owner.gid, mode=mode)

    def write_files(
        self,
        directory: str,
        files: Mapping[str, tuple[str, int]],
        owner: JobOwner,
        *,
        anchor: str | None = None,
    ) -> None:
        """Name → (text, mode) in `directory` (made first, the owner's)."""
        self.make_dir(directory, owner, anchor=anchor)
        for name, (text, mode) in files.items():
            _files.write_text(
                anchor or self.root, os.path.join(directory, name), text, mode, owner.uid, owner.gid
            )

    def write_run_dir(self, plan: TrialJobPlan, owner: JobOwner) -> None:
        """A trial run's directory and its plan's files (the token 0600)."""
        _files.write_run_dir(plan, self.root, uid=owner.uid, gid=owner.gid)

    def exists(self, path: str, owner: JobOwner | None = None) -> bool:
        return userfiles.exists(self.root, userfiles.relative_parts(self.root, path))

    def read_json(
        self, path: str, *, anchor: str | None = None, owner: JobOwner | None = None, often: bool = False
    ) -> dict[str, Any] | None:
        """A JSON object the job wrote (``exit.json``, ``service.json``); None when there is none or it cannot be
        read: a link, a FIFO or anything but a small regular file included."""
        base = anchor or self.root
        try:
            data = userfiles.read_json(base, userfiles.relative_parts(base, path))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    @staticmethod
    def read_bytes(
        anchor: str | os.PathLike[str], path: str | os.PathLike[str], *, offset: int, max_bytes: int
    ) -> tuple[bytes, os.stat_result]:
        """Up to `max_bytes` of a job's file (a log) from `offset`; OSError when it is not a regular file there."""
        return userfiles.read_bytes(
            anchor, userfiles.relative_parts(anchor, path), offset=offset, max_bytes=max_bytes
        )

    def make_tensorboard_dir(self, checkpoint_root: str, experiment_id: int, owner: JobOwner) -> None:
        """The experiment's ``tensorboard/experiment/<id>``, the owner's (``trialjob_files``); UnsafePathError
        where the directories above it are not the master's."""
        assert owner.uid is not None, "only a root master makes directories for another account"
        _files.make_tensorboard_dir(checkpoint_root, experiment_id, owner.uid, owner.gid)


class HelperRunFiles(RunFiles):
    """The run files of a master that acts for its users: what belongs to a user (an owner with a Unix
    account) is made, written and read by the per-user helper as that user; the master's own as before."""

    def __init__(self, root: str, helper: UserHelper, pool: HelperPool | None = None) -> None:
        super().__init__(root)
        self.helper = helper
        self.pool = pool
        """Long-lived helpers for the reads that repeat (a task's ``service.json`` while it starts)."""

    def ensure_user_root(self, owner: JobOwner) -> str:
        """The owner's directory: made by the user's helper, or checked by it (the user's, a real directory,
        not writable by others); one its account does not own is refused, naming it for the admin. A root
        master makes ``<root>/<account>`` for the user first (its root need not be writable by users)."""
        if owner.unix is None:
            return super().ensure_user_root(owner)
        path = self.user_root(owner)
        if os.geteuid() == 0 and USER_TEMPLATE not in self.root and owner.uid is not None:
            super().ensure_user_root(owner)
        # Checked at every submission (one request line to the submission's helper): a directory the user
        # removed or replaced since is made again or refused, never trusted from memory.
        self.helper.call(owner.unix, "user_dir", root=path if USER_TEMPLATE in self.root else self.root)
        return path

    def make_dir(self, path: str, owner: JobOwner, *, anchor: str | None = None) -> None:
        if owner.unix is None:
            return super().make_dir(path, owner, anchor=anchor)
        self.helper.call(owner.unix, "make_dirs", anchor=anchor or self.user_root(owner), path=path)
        return None

    def write(
        self, path: str, data: bytes, owner: JobOwner, *, mode: int = 0o640, anchor: str | None = None
    ) -> None:
        if owner.unix is None:
            return super().write(path, data, owner, mode=mode, anchor=anchor)
        self.helper.call(
            owner.unix,
            "write",
            anchor=anchor or self.user_root(owner),
            path=path,
            data=encode(data),
            mode=mode,
        )
        return None

    def write_files(
        self,
        directory: str,
        files: Mapping[str, tuple[str, int]],
        owner: JobOwner,
        *,
        anchor: str | None = None,
    ) -> None:
        if owner.unix is None:
            return super().write_files(directory, files, owner, anchor=anchor)
        listed = {name: [text, mode] for name, (text, mode) in files.items()}
        self.helper.call(
            owner.unix, "write_files", anchor=anchor or self.user_root(owner), path=directory, files=listed
        )
        return None

    def write_run_dir(self, plan: TrialJobPlan, owner: JobOwner) -> None:
        if owner.unix is None:
            return super().write_run_dir(plan, owner)
        self.write_files(
            plan.run_dir, plan.files(), owner, anchor=self.user_root(owner)
        )  # ensured by the caller
        return None

    def exists(self, path: str, owner: JobOwner | None = None) -> bool:
        if owner is None or owner.unix is None:
            return super().exists(path)
        return bool(self.helper.call(owner.unix, "exists", anchor=self.user_root(owner), path=path)["exists"])

    def read_json(
        self, path: str, *, anchor: str | None = None, owner: JobOwner | None = None, often: bool = False
    ) -> dict[str, Any] | None:
        if owner is None or owner.unix is None:
            return super().read_json(path, anchor=anchor)
        try:
            # A file read again and again (a task's service.json while it starts) goes to the owner's
            # long-lived helper; a one-off (exit.json) to a helper that ends with the read.
            call = self.pool.call if often and self.pool is not None else self.helper.call
            value = call(owner.unix, "read_json", anchor=anchor or self.user_root(owner), path=path)["value"]
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def make_tensorboard_dir(self, checkpoint_root: str, experiment_id: int, owner: JobOwner) -> None:
        """A root master makes it as `RunFiles` does (in its own ``tensorboard/experiment``, chowned through
        the descriptor it opened); a service account asks the user's helper, which needs that directory to
        admit the user (where it does not, the trials make their own, as `JobDriver` says)."""
        if owner.unix is None or (os.geteuid() == 0 and owner.uid is not None):
            return super().make_tensorboard_dir(checkpoint_root, experiment_id, owner)
        shared = ("tensorboard", "experiment")  # the master's, where it may make them (admins make it 1733)
        with contextlib.suppress(OSError):
            userfiles.make_dirs(checkpoint_root, shared, mode=0o755, uid=os.geteuid(), keep=len(shared))
        anchor = os.path.join(checkpoint_root, *shared)
        self.helper.call(
            owner.unix, "make_dirs", anchor=anchor, path=os.path.join(anchor, str(experiment_id))
        )
        return None


@dataclass
class AsUser:
    """What the master does in its users' names: one per master, shared by the trials' and the tasks' drivers
    and the checkpoint collector. `acts_for_users`: jobs run as their owners' accounts (a shared master);
    otherwise as the master's own (a personal one)."""

    files: RunFiles
    slurm: SlurmJobs
    checkpoints: CheckpointRemover | None = None
    acts_for_users: bool = field(default_factory=lambda: os.geteuid() == 0)
    helper: UserHelper | None = None

    def batch(self, unix: str | None) -> contextlib.AbstractContextManager[None]:
        """What the block does as `unix` (a submission: its files and its sbatch) in one helper process."""
        if self.helper is None or unix is None or not self.acts_for_users:
            return contextlib.nullcontext()
        return self.helper.batch(unix)
