"""Wakes the lifecycle loop when the API changed something it acts on (a new or activated experiment, a
validation for the searcher), so the loop reacts at once instead of at its next tick; and counts the loop's
searcher passes, so a request waiting for a searcher's decision re-reads the database only after one."""

from __future__ import annotations

import threading

_changed = threading.Event()


def changed() -> None:
    _changed.set()


def wait(timeout_s: float) -> bool:
    """Sleep until something changed or `timeout_s` passed; returns whether something changed."""
    woke = _changed.wait(timeout_s)
    _changed.clear()
    return woke


_searcher_passes = 0


def searchers_driven() -> None:
    """The lifecycle loop finished a pass over the searchers (called from its one thread)."""
    global _searcher_passes
    _searcher_passes += 1


def searcher_passes() -> int:
    return _searcher_passes
