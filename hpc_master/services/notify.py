"""Wakes the lifecycle loop when the API changed something it acts on (a new or activated experiment, a
validation for the searcher), so the loop reacts at once instead of at its next tick; and counts the loop's
searcher passes, so a request waiting for a searcher's decision re-reads the database only after one."""

from __future__ import annotations

import asyncio
import contextlib
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
_pass_lock = threading.Lock()
_pass_waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()


def searchers_driven() -> None:
    """The lifecycle loop finished a pass over the searchers (called from its one thread); wakes the
    requests waiting for one."""
    global _searcher_passes
    with _pass_lock:
        _searcher_passes += 1
        waiters = list(_pass_waiters)
        _pass_waiters.clear()
    for loop, future in waiters:
        with contextlib.suppress(RuntimeError):  # that event loop is closed: nobody waits there any more
            loop.call_soon_threadsafe(_settle, future)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def searcher_passes() -> int:
    return _searcher_passes


async def next_searcher_pass(after: int, timeout_s: float) -> bool:
    """Wait until a searcher pass after the ``after``-th one has ended, or ``timeout_s``; returns whether one
    has. Woken by the loop itself, not by polling the counter."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    entry = (loop, future)
    with _pass_lock:
        if _searcher_passes != after:
            return True
        _pass_waiters.add(entry)
    try:
        await asyncio.wait_for(future, timeout=max(0.0, timeout_s))
    except TimeoutError:
        pass
    finally:
        with _pass_lock:
            _pass_waiters.discard(entry)
    return _searcher_passes != after
