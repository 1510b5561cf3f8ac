"""Trial logs: read the output files recorded in the log index (no log shipping over HTTP)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from hpc_master.db.models import LogFileModel, TrialRunModel

RANK_PREFIX = re.compile(r"^\[rank=(\d+)\] ?")


@dataclass(frozen=True)
class LogSource:
    run_number: int
    path: Path


@dataclass
class LogCursor:
    """Where a follower is: per file, the byte offset already read; ``line_id`` counts lines emitted."""

    offsets: dict[str, int]
    line_id: int = 0


def log_sources(session: Session, trial_id: int) -> list[LogSource]:
    rows = session.execute(
        select(TrialRunModel.run_number, LogFileModel.path)
        .join(LogFileModel, LogFileModel.trial_run_id == TrialRunModel.id)
        .where(TrialRunModel.trial_id == trial_id)
        .order_by(TrialRunModel.run_number, LogFileModel.id)
    ).all()
    return [LogSource(run_number, Path(path)) for run_number, path in rows]


def log_entry(trial_id: int, line_id: int, run_number: int, line: str) -> dict[str, object]:
    match = RANK_PREFIX.match(line)
    rank = int(match.group(1)) if match else None
    return {
        "id": line_id,
        "trialId": trial_id,
        "trialRunId": run_number,
        "rankId": rank,
        "message": line if line.endswith("\n") else line + "\n",
        "log": line.rstrip("\n"),
        "stdtype": "stdout",
        "source": "slurm",
    }


def read_new_lines(
    trial_id: int, sources: list[LogSource], cursor: LogCursor, *, final: bool = False
) -> list[dict[str, object]]:
    """Lines appended since `cursor` (complete lines only, unless `final`), advancing the cursor."""
    out: list[dict[str, object]] = []
    for source in sources:
        key = str(source.path)
        start = cursor.offsets.get(key, 0)
        try:
            with source.path.open("rb") as handle:
                handle.seek(start)
                data = handle.read()
        except OSError:
            continue
        if not data:
            continue
        if not final:
            cut = data.rfind(b"\n")
            if cut < 0:
                continue
            data = data[: cut + 1]
        cursor.offsets[key] = start + len(data)
        for raw in data.splitlines(keepends=True):
            cursor.line_id += 1
            out.append(log_entry(trial_id, cursor.line_id, source.run_number, raw.decode("utf-8", "replace")))
    return out
