"""The signals that long-polling requests wait on (searcher passes, stop requests): woken from another thread, never leaked."""

from __future__ import annotations

import asyncio
import threading
import time

from hpc_master.services import notify


def test_a_pass_that_already_happened_answers_at_once() -> None:
    before = notify.searcher_passes()
    notify.searchers_driven()
    assert asyncio.run(notify.next_searcher_pass(before, 30)) is True
    assert not notify._searcher_passes._waiters


def test_no_pass_times_out_and_leaves_no_waiter() -> None:
    now = notify.searcher_passes()
    assert asyncio.run(notify.next_searcher_pass(now, 0.05)) is False
    assert not notify._searcher_passes._waiters


def test_a_pass_from_another_thread_wakes_every_waiter_before_the_timeout() -> None:
    async def main() -> tuple[list[bool], float]:
        now = notify.searcher_passes()
        started = time.monotonic()
        timer = threading.Timer(0.05, notify.searchers_driven)  # the lifecycle loop's thread
        timer.start()
        woke = await asyncio.gather(*(notify.next_searcher_pass(now, 30) for _ in range(3)))
        timer.join()
        return list(woke), time.monotonic() - started

    woke, elapsed = asyncio.run(main())
    assert woke == [True, True, True]
    assert elapsed < 10  # woken by the pass, not by the 30 s timeout
    assert not notify._searcher_passes._waiters
