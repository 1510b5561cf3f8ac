"""Writes a job's run directory before the job is submitted (the only I/O of the trial-job and task-job
modules)."""

from __future__ import annotations

import os
from pathlib import Path

from hpc_master.trialjob import TrialJobPlan


def write_text(path: str, text: str, mode: int, uid: int | None, gid: int | None) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)  # not widened by the umask, not narrowed either
        if uid is not None:
            os.fchown(fd, uid, -1 if gid is None else gid)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except BaseException:
        os.unlink(tmp)
        raise
    os.replace(tmp, path)


def make_dir(path: str, uid: int | None, gid: int | None) -> None:
    os.makedirs(path, mode=0o750, exist_ok=True)
    if uid is not None:
        os.chown(path, uid, -1 if gid is None else gid)


def write_run_dir(plan: TrialJobPlan, *, uid: int | None = None, gid: int | None = None) -> None:
    """Create the trial and run directories (owned by `uid`/`gid` when given: a root master submitting for a
    user) and write the plan's files; the token file is 0600. Idempotent for a resubmission of the same run.

    Each file is written under a temporary name and renamed, so a reader sees all of it or none. Nothing is
    fsynced: the job reads the files after they were closed, which close-to-open consistency covers on a
    shared filesystem, and the master outliving its own crash does not need them on disk (only an OS crash of
    the master's host could lose them, and a run whose files are gone fails its setup and is restarted).
    Five fsyncs per submission were a third of the lifecycle loop's time per submitted trial."""
    trial_parent = os.path.dirname(plan.trial_dir)
    for path in (trial_parent, plan.trial_dir, plan.run_dir):
        make_dir(path, uid, gid)
    for name, (text, mode) in plan.files().items():
        write_text(os.path.join(plan.run_dir, name), text, mode, uid, gid)


def write_bytes(path: Path, data: bytes, uid: int | None, gid: int | None) -> None:
    """`data` at `path` (0640, owned by `uid` when given), written under a temporary name and renamed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
    with os.fdopen(fd, "wb") as f:
        if uid is not None:
            os.fchown(f.fileno(), uid, -1 if gid is None else gid)
        f.write(data)  # not fsynced: see write_run_dir
    os.replace(tmp, path)
