"""The one seam for what the master does in a user's name: their run directories' files, their Slurm jobs and
their checkpoints.

A trial's or task's run directory is its owner's once the job runs there, a job is its owner's process, and a
checkpoint directory is written by its owner's job. Everything the master does to them goes through `AsUser`:

- `AsUser.files` (`RunFiles`): run directories made and written before a job is submitted (owned by the job's
  account), and the job's files read back (``exit.json``, ``service.json``, logs), all below the job storage
  root and never through a link (``userfiles``);
- `AsUser.slurm` (`SlurmJobs`): sbatch (as the job's account), scancel, the poll;
- `AsUser.checkpoints` (`CheckpointRemover`): checkpoint directories removed as their owner's account.

Today's implementation is the master's own process: as root it chowns what it creates to the job's account
and runs sbatch and the checkpoint remover through ``runuser``; as a user (a personal master) everything is
its own. The privilege separation of the master (a per-user helper doing this work as the user) replaces what
is behind this interface, and nothing that uses it. `tests/unit/test_layering.py` keeps the rest of the master
from reaching ``userfiles`` or the run-directory writers around it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import userfiles
from hpc_master import trialjob_files as _files
from hpc_master.lifecycle.job_host import job_account
from hpc_master.lifecycle.slurm_jobs import SlurmJobs
from hpc_master.services.checkpoint_remover import CheckpointRemover
from hpc_master.trialjob import TrialJobPlan

UnsafePathError = userfiles.UnsafePathError


@dataclass(frozen=True)
class JobOwner:
    """The account a user's jobs and files are made for: `unix` (None: the master's own account) and, for a
    root master, its ids (what the master creates is chowned to them)."""

    unix: str | None = None
    uid: int | None = None
    gid: int | None = None

    @classmethod
    def of(cls, owner_name: str, unix_user: str | None, *, running_as_root: bool) -> JobOwner:
        """A root master's jobs run as the user's Unix account (refused without one, or for root); a personal
        master's as itself."""
        if not running_as_root:
            return cls()
        uid, gid = job_account(owner_name, unix_user)
        return cls(unix_user, uid, gid)


class RunFiles:
    """Files below `root` (the job storage root), where users' jobs run: made, written and read beneath it
    without following a link, regular files only, bounded (``userfiles``)."""

    def __init__(self, root: str) -> None:
        self.root = root

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

    def exists(self, path: str) -> bool:
        return userfiles.exists(self.root, userfiles.relative_parts(self.root, path))

    def read_json(self, path: str, *, anchor: str | None = None) -> dict[str, Any] | None:
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

    @staticmethod
    def make_tensorboard_dir(checkpoint_root: str, experiment_id: int, owner: JobOwner) -> None:
        """The experiment's ``tensorboard/experiment/<id>``, the owner's (``trialjob_files``); UnsafePathError
        where the directories above it are not the master's."""
        assert owner.uid is not None, "only a root master makes directories for another account"
        _files.make_tensorboard_dir(checkpoint_root, experiment_id, owner.uid, owner.gid)


@dataclass
class AsUser:
    """What the master does in its users' names: one per master, shared by the trials' and the tasks' drivers
    and the checkpoint collector."""

    files: RunFiles
    slurm: SlurmJobs
    checkpoints: CheckpointRemover | None = None
