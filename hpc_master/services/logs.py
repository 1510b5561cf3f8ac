"""Trial logs: read the output files recorded in the log index (no log shipping over HTTP).

Each line becomes Determined's ``v1TrialLogsResponse`` (``id``, ``trialId``, ``message``, ``log``, ``level``,
``timestamp``, ``rankId``, ``stdtype``, ``source``; ``trialRunId`` too). The files carry no time or level per
line, so: ``rankId`` comes from the ``[rank=N]`` prefix that ``launchers/wrap_rank.py`` writes, ``level`` from a
Python-logging-style word at the start of the line (``INFO:root:...``, ``2024-01-02 10:00:00 WARNING ...``;
INFO when there is none), ``stdtype`` from the file's stream, and ``timestamp`` is when the file had last been
written at the time the line was read (an upper bound on the line's own time, and close to it while following).
"""

from __future__ import annotations

import datetime as dt
import enum
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePath

from sqlalchemy import select
from sqlalchemy.orm import Session

from hpc_master.asuser import RunFiles
from hpc_master.db.models import ExperimentModel, LogFileModel, TrialModel, TrialRunModel, UserModel
from hpc_master.helper_client import HelperPool, decode
from hpc_master.trialjob import user_job_root

RANK_PREFIX = re.compile(r"^\[rank=(\d+)\] ?")
LEVEL_WORD = re.compile(
    r"^(?:[\d\-/:.,T+Z\[\]]+ ){0,2}\[?(TRACE|DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\]?(?::|\s|$)"
)
"""A level word at a line's start, after at most two date or time words (``2024-05-01 10:00:00,123 ERROR``)."""
MAX_READ_BYTES = 4 << 20
"""At most this much of one file per read, so that a long log streams in pieces instead of being held whole."""


class LogLevel(enum.StrEnum):
    """Determined's ``v1LogLevel``, in increasing order."""

    UNSPECIFIED = "LOG_LEVEL_UNSPECIFIED"
    TRACE = "LOG_LEVEL_TRACE"
    DEBUG = "LOG_LEVEL_DEBUG"
    INFO = "LOG_LEVEL_INFO"
    WARNING = "LOG_LEVEL_WARNING"
    ERROR = "LOG_LEVEL_ERROR"
    CRITICAL = "LOG_LEVEL_CRITICAL"


_LEVEL_OF_WORD = {
    "TRACE": LogLevel.TRACE,
    "DEBUG": LogLevel.DEBUG,
    "INFO": LogLevel.INFO,
    "WARN": LogLevel.WARNING,
    "WARNING": LogLevel.WARNING,
    "ERROR": LogLevel.ERROR,
    "CRITICAL": LogLevel.CRITICAL,
    "FATAL": LogLevel.CRITICAL,
}


@dataclass(frozen=True)
class LogSource:
    """A log file, read beneath `anchor` (the master's job storage root): never through a link, never a FIFO
    (``userfiles``); a file that is not below it is not read at all."""

    run_number: int
    path: PurePath
    anchor: PurePath
    stream: str = "stdout"
    owner_unix: str | None = None
    """The Unix account whose job writes it (a service-account master reads it through their helper)."""


LogReader = Callable[[LogSource, int, int], tuple[bytes, float]]
"""(source, offset, most bytes) → (the bytes, the file's mtime); OSError when it cannot be read."""


def read_in_process(source: LogSource, offset: int, max_bytes: int) -> tuple[bytes, float]:
    """A log read by the master itself (a personal master, or a root one): beneath its anchor, never
    through a link or from a FIFO (``userfiles``)."""
    data, status = RunFiles.read_bytes(source.anchor, source.path, offset=offset, max_bytes=max_bytes)
    return data, status.st_mtime


def helper_reader(pool: HelperPool, job_root: str) -> LogReader:
    """A service-account master's reader: each log read by its owner's long-lived helper (`HelperPool`),
    beneath the owner's directory (or the root, for a run from before directories were per user)."""

    def read(source: LogSource, offset: int, max_bytes: int) -> tuple[bytes, float]:
        if source.owner_unix is None:
            return read_in_process(source, offset, max_bytes)
        anchor = user_job_root(job_root, source.owner_unix)
        if not str(source.path).startswith(anchor.rstrip("/") + "/"):
            anchor = job_root
        answer = pool.call(source.owner_unix, "read", anchor=anchor, path=str(source.path), offset=offset,
                           max_bytes=max_bytes)  # fmt: skip
        return decode(str(answer["data"])), float(answer["mtime"])

    return read


@dataclass
class LogCursor:
    """Where a follower is: per file, the byte offset already read; ``line_id`` counts lines read."""

    offsets: dict[str, int]
    line_id: int = 0


@dataclass(frozen=True)
class LogFilter:
    """Determined's trial-log filters that a line's own fields can answer (empty: no filter)."""

    rank_ids: frozenset[int] = frozenset()
    levels: frozenset[LogLevel] = frozenset()
    stdtypes: frozenset[str] = frozenset()
    sources: frozenset[str] = frozenset()
    search_text: str = ""

    def matches(self, entry: dict[str, object]) -> bool:
        wanted_by_field: tuple[tuple[str, frozenset[object]], ...] = (
            ("rankId", self.rank_ids),
            ("level", self.levels),
            ("stdtype", self.stdtypes),
            ("source", self.sources),
        )
        if any(wanted and entry.get(name) not in wanted for name, wanted in wanted_by_field):
            return False
        return not self.search_text or self.search_text in str(entry.get("log", ""))


def log_sources(session: Session, trial_id: int, anchor: PurePath) -> list[LogSource]:
    rows = session.execute(
        select(TrialRunModel.run_number, LogFileModel.path, LogFileModel.stream, UserModel.unix_username)
        .join(LogFileModel, LogFileModel.trial_run_id == TrialRunModel.id)
        .join(TrialModel, TrialModel.id == TrialRunModel.trial_id)
        .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
        .outerjoin(UserModel, UserModel.id == ExperimentModel.owner_id)
        .where(TrialRunModel.trial_id == trial_id)
        .order_by(TrialRunModel.run_number, LogFileModel.id)
    ).all()
    return [
        LogSource(run_number, PurePath(path), anchor, stream or "stdout", unix)
        for run_number, path, stream, unix in rows
    ]


def line_level(text: str) -> LogLevel:
    """The level a line names at its start (after any rank prefix), INFO when it names none."""
    match = LEVEL_WORD.match(text)
    return _LEVEL_OF_WORD[match.group(1)] if match else LogLevel.INFO


def log_entry(
    trial_id: int,
    line_id: int,
    run_number: int,
    line: str,
    *,
    stream: str = "stdout",
    timestamp: str | None = None,
) -> dict[str, object]:
    match = RANK_PREFIX.match(line)
    rank = int(match.group(1)) if match else None
    text = line.rstrip("\n")
    return {
        "id": line_id,
        "trialId": trial_id,
        "trialRunId": run_number,
        "rankId": rank,
        "message": line if line.endswith("\n") else line + "\n",
        "log": text,
        "level": line_level(text[match.end() :] if match else text).value,
        "timestamp": timestamp or _iso(dt.datetime.now(dt.UTC)),
        "stdtype": stream,
        "source": "slurm",
    }


def _iso(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _to_emit(data: bytes, *, final: bool, at_end: bool) -> bytes:
    """What of `data` (read from a file) to emit now: complete lines only, unless `final` and at the file's end
    (a line longer than a whole read comes in pieces); empty when nothing."""
    if final and at_end:
        return data
    cut = data.rfind(b"\n")
    if cut < 0:
        if at_end:
            return b""
        cut = len(data) - 1  # one line longer than a read: emit it in pieces
    return data[: cut + 1]


def read_new_lines(
    trial_id: int,
    sources: Sequence[LogSource],
    cursor: LogCursor,
    *,
    final: bool = False,
    max_bytes: int = MAX_READ_BYTES,
    reader: LogReader | None = None,
) -> tuple[list[dict[str, object]], bool]:
    """Lines appended since `cursor`, advancing it: complete lines only, unless `final` and at a file's end.

    Returns the lines and whether a file has more than `max_bytes` left (read again at once).
    """
    out: list[dict[str, object]] = []
    more = False
    for source in sources:
        key = str(source.path)
        start = cursor.offsets.get(key, 0)
        try:
            data, mtime = (reader or read_in_process)(source, start, max_bytes + 1)
        except OSError:  # not there (yet), or a link, FIFO or root's file in its place: nothing to show
            continue
        written = dt.datetime.fromtimestamp(mtime, dt.UTC)
        at_end = len(data) <= max_bytes
        if not at_end:
            data = data[:max_bytes]
            more = True
        data = _to_emit(data, final=final, at_end=at_end)
        if not data:
            continue
        cursor.offsets[key] = start + len(data)
        stamp = _iso(written)
        for raw in data.splitlines(keepends=True):
            cursor.line_id += 1
            text = raw.decode("utf-8", "replace")
            out.append(log_entry(trial_id, cursor.line_id, source.run_number, text, stream=source.stream,
                                 timestamp=stamp))  # fmt: skip
    return out, more
