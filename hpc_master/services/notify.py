"""Wakes the lifecycle loop when the API changed something it acts on (a new or activated experiment, a
validation for the searcher), so the loop reacts at once instead of at its next tick."""

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
