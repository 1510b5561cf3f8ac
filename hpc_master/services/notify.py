"""Wakes the lifecycle loop when the API changed something it acts on (a new or activated experiment, a
validation for the searcher), so the loop reacts at once instead of at its next tick; and counts two kinds of
event that long-polling requests wait for, so they re-read the database only after one: the loop's searcher
passes (a trial's next operation) and committed stop requests (a run's preemption signal)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable

_changed = threading.Event()


def changed() -> None:
    _changed.set()


def wait(timeout_s: float) -> bool:
    """Sleep until something changed or `timeout_s` passed; returns whether something changed."""
    woke = _changed.wait(timeout_s)
    _changed.clear()
    return woke


class KeyedGeneration:
    """Events for keys, fired from any thread, that asyncio requests wait on without polling; a request waits
    for its own key's (a run, ``(trial_id, run_number)``), so an event wakes only the requests waiting on its
    keys. Each key remembers the event count at its last event (the most recent ``KEEP`` keys), so an event
    between a request's count and its wait is not missed."""

    KEEP = 100_000

    def __init__(self) -> None:
        self._count = 0
        self._last: OrderedDict[Hashable, int] = OrderedDict()
        self._lock = threading.Lock()
        self._waiters: dict[Hashable, set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}

    def fire(self, keys: Iterable[Hashable]) -> None:
        woken: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        with self._lock:
            self._count += 1
            for key in keys:
                self._last[key] = self._count
                self._last.move_to_end(key)
                woken.extend(self._waiters.pop(key, ()))
            while len(self._last) > self.KEEP:
                self._last.popitem(last=False)
        for loop, future in woken:
            with contextlib.suppress(RuntimeError):  # that event loop is closed: nobody waits there any more
                loop.call_soon_threadsafe(_settle, future)

    def count(self) -> int:
        return self._count

    async def next(self, key: Hashable, after: int, timeout_s: float) -> bool:
        """Wait until ``key`` has an event counted after ``after``, or ``timeout_s``; returns whether it has."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry = (loop, future)
        with self._lock:
            if self._last.get(key, 0) > after:
                return True
            self._waiters.setdefault(key, set()).add(entry)
        try:
            await asyncio.wait_for(future, timeout=max(0.0, timeout_s))
        except TimeoutError:
            pass
        finally:
            with self._lock:
                waiting = self._waiters.get(key)
                if waiting is not None:
                    waiting.discard(entry)
                    if not waiting:
                        del self._waiters[key]
        return self._last.get(key, 0) > after


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


_searcher_passes = KeyedGeneration()  # one key: every pass concerns every waiting request
_PASS = "pass"
_stop_requests = KeyedGeneration()


def searchers_driven() -> None:
    """The lifecycle loop finished a pass over the searchers (called from its one thread); wakes the
    requests waiting for one."""
    _searcher_passes.fire([_PASS])


def searcher_passes() -> int:
    return _searcher_passes.count()


async def next_searcher_pass(after: int, timeout_s: float) -> bool:
    """Wait until a searcher pass after the ``after``-th one has ended, or ``timeout_s``; returns whether one
    has. Woken by the loop itself, not by polling the counter."""
    return await _searcher_passes.next(_PASS, after, timeout_s)


def stops_requested(runs: Iterable[tuple[int, int]]) -> None:
    """A transaction that asked these runs (``(trial_id, run_number)``) to stop has committed."""
    _stop_requests.fire(runs)


def stop_requests() -> int:
    return _stop_requests.count()


async def next_stop_request(run: tuple[int, int], after: int, timeout_s: float) -> bool:
    """Wait until a stop request for ``run`` commits after the ``after``-th stop request, or ``timeout_s``.
    A stop request for another run does not wake it (a grid search stops every trial as it completes)."""
    return await _stop_requests.next(run, after, timeout_s)
