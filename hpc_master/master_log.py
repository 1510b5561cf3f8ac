"""The master's own recent log lines, kept in memory for ``GET /api/v1/master/logs`` (``det master logs``).

Determined serves its master's log from memory too (a ring of recent entries); ours is a logging handler on the
root logger of ``det-master`` (``systemd.configure_logging``) keeping the last ``CAPACITY`` formatted records,
each with a sequence number so that a follower asks for "after id N". What reaches it is exactly what the master
writes to stdout or the journal, which never carries secrets (docs/security.md).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import deque
from dataclasses import dataclass

CAPACITY = 10_000


@dataclass(frozen=True)
class Entry:
    id: int
    level: str  # Determined's v1LogLevel: LOG_LEVEL_INFO, ...
    message: str
    timestamp: str  # RFC 3339, UTC

    def to_api(self) -> dict[str, object]:
        return {"id": self.id, "level": self.level, "message": self.message, "timestamp": self.timestamp}


def api_level(levelno: int) -> str:
    if levelno >= logging.CRITICAL:
        return "LOG_LEVEL_CRITICAL"
    for threshold, name in (
        (logging.ERROR, "ERROR"),
        (logging.WARNING, "WARNING"),
        (logging.INFO, "INFO"),
        (logging.DEBUG, "DEBUG"),
    ):
        if levelno >= threshold:
            return f"LOG_LEVEL_{name}"
    return "LOG_LEVEL_TRACE"


class MasterLog(logging.Handler):
    """A bounded ring of the master's log entries; thread-safe, O(1) per record."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        self._entries: deque[Entry] = deque(maxlen=capacity)
        self._next_id = 1
        self._lock_entries = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
        except Exception:  # a broken format string must not take the master's logging down
            self.handleError(record)
            return
        when = dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat().replace("+00:00", "Z")
        with self._lock_entries:
            self._entries.append(Entry(self._next_id, api_level(record.levelno), message, when))
            self._next_id += 1

    def last_id(self) -> int:
        with self._lock_entries:
            return self._next_id - 1

    def read(self, *, after_id: int = 0, offset: int = 0, limit: int = 0) -> list[Entry]:
        """Entries with an id above `after_id`; then Determined's `offset` (skip that many; negative: only that
        many from the end) and `limit` (0: no limit)."""
        with self._lock_entries:
            entries = [e for e in self._entries if e.id > after_id] if after_id else list(self._entries)
        if offset:
            entries = entries[offset:]  # a negative offset keeps that many from the end
        return entries[:limit] if limit > 0 else entries


MASTER_LOG = MasterLog()
"""The running master's ring (installed on the root logger by ``det-master``; empty in other processes)."""
