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


def test_a_stop_request_wakes_only_the_polls_of_its_runs() -> None:
    async def main() -> tuple[list[bool], float]:
        now = notify.stop_requests()
        started = time.monotonic()
        timer = threading.Timer(0.05, notify.stops_requested, args=[{(7, 1), (8, 2)}])
        timer.start()
        woke = await asyncio.gather(
            notify.next_stop_request((7, 1), now, 30),
            notify.next_stop_request((8, 2), now, 30),
            notify.next_stop_request((7, 2), now, 0.5),  # another run of trial 7: sleeps on
        )
        timer.join()
        return list(woke), time.monotonic() - started

    woke, elapsed = asyncio.run(main())
    assert woke == [True, True, False]
    assert elapsed < 10
    assert not notify._stop_requests._waiters


def test_a_stop_request_between_the_count_and_the_wait_is_not_missed() -> None:
    now = notify.stop_requests()
    notify.stops_requested([(9, 1)])
    assert asyncio.run(notify.next_stop_request((9, 1), now, 30)) is True
    assert asyncio.run(notify.next_stop_request((9, 2), now, 0.01)) is False
    assert not notify._stop_requests._waiters


def test_stop_request_memory_is_bounded() -> None:
    keyed = notify.KeyedGeneration()
    keyed.KEEP = 10
    for i in range(25):
        keyed.fire([(i, 1)])
    assert len(keyed._last) == 10 and (24, 1) in keyed._last and (0, 1) not in keyed._last
