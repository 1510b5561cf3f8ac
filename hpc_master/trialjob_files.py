"""Writes a job's run directory before the job is submitted (the only I/O of the trial-job and task-job
modules). Everything below the job storage root may be the user's to change (their jobs run there), so every
directory and file goes through ``userfiles``: no link is followed, nothing is chowned or written through one."""

from __future__ import annotations

import os

import userfiles
from hpc_master.trialjob import TrialJobPlan


def write_text(anchor: str, path: str, text: str, mode: int, uid: int | None, gid: int | None) -> None:
    """`text` at `path` (below `anchor`), exactly `mode`, owned by `uid` when given; written under a new name
    and renamed, so a reader sees all of it or none, and a link that stood there is replaced, not followed."""
    write_bytes(anchor, path, text.encode(), uid, gid, mode=mode)


def make_dir(anchor: str, path: str, uid: int | None, gid: int | None) -> None:
    """`path` and every directory between `anchor` and it, owned by `uid`/`gid` when given."""
    userfiles.make_dirs(anchor, userfiles.relative_parts(anchor, path), mode=0o750, uid=uid, gid=gid)


def write_run_dir(
    plan: TrialJobPlan, job_storage_root: str, *, uid: int | None = None, gid: int | None = None
) -> None:
    """Create the trial and run directories (owned by `uid`/`gid` when given: a root master submitting for a
    user) and write the plan's files; the token file is 0600. Idempotent for a resubmission of the same run.

    Each file is written under a temporary name and renamed, so a reader sees all of it or none. Nothing is
    fsynced: the job reads the files after they were closed, which close-to-open consistency covers on a
    shared filesystem, and the master outliving its own crash does not need them on disk (only an OS crash of
    the master's host could lose them, and a run whose files are gone fails its setup and is restarted).
    Five fsyncs per submission were a third of the lifecycle loop's time per submitted trial."""
    os.makedirs(job_storage_root, exist_ok=True)  # the master's own (its configuration): followed as it is
    make_dir(job_storage_root, plan.run_dir, uid, gid)
    run_parts = userfiles.relative_parts(job_storage_root, plan.run_dir)
    for name, (text, mode) in plan.files().items():
        userfiles.write_file(job_storage_root, (*run_parts, name), text.encode(), mode=mode, uid=uid, gid=gid)


def write_bytes(
    anchor: str, path: str, data: bytes, uid: int | None, gid: int | None, *, mode: int = 0o640
) -> None:
    """`data` at `path` (below `anchor`; 0640 unless `mode`, owned by `uid` when given), written under a new
    name and renamed. Not fsynced: see write_run_dir."""
    parts = userfiles.relative_parts(anchor, path)
    userfiles.write_file(anchor, parts, data, mode=mode, uid=uid, gid=gid)


def make_tensorboard_dir(checkpoint_root: str, experiment_id: int, uid: int, gid: int | None) -> None:
    """``tensorboard/experiment/<id>`` under the master's checkpoint root, the experiment's user's, before its
    first trial writes there; the two directories above it stay the master's (0755), so that no user creates,
    renames or fills another's (Determined's layout: ``harness.exec.job_plan.tensorboard_path``)."""
    os.makedirs(checkpoint_root, exist_ok=True)  # the master's own (its configuration)
    shared = ("tensorboard", "experiment")
    userfiles.make_dirs(checkpoint_root, shared, mode=0o755, uid=os.geteuid(), keep=len(shared))
    userfiles.make_dirs(
        checkpoint_root, (*shared, str(experiment_id)), mode=0o750, uid=uid, gid=gid, keep=len(shared)
    )
