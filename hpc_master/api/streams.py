"""Long-lived requests (streams and long polls): a cap per caller, and threads of their own for their reads.

**The cap.** A stream holds a slot of its caller's from the moment its route accepts it until its response
ends, however it ends: the stream finished, the client went away, or the server failed while sending
(``CappedStreamingResponse`` releases it in ``finally``; a response that is never sent releases it when it is
collected). A user holds at most ``security.max_streams_per_user`` slots; one more stream is refused at once
with HTTP 429 ``too_many_streams`` and a ``Retry-After``, never queued. Routes take the slot after their own
checks, so a 404 or a 403 still answers as such. A long poll (``long_poll``) holds a slot while its route
waits. A trial's harness, calling with its per-trial token, long-polls under a cap of its own per trial
(``security.max_long_polls_per_trial``): a job's ranks never use up its owner's streams, and a user's streams
never keep a job from hearing that it must stop.

**The threads.** A stream's reads (a log file's new lines, a metrics query every ``periodSeconds``, a change
hub's aggregates) run in ``STREAM_THREADS`` threads of their own (``stream_threads.run``), never in the
thread pool (40 threads) of the synchronous routes. However many streams are open, at most that many of their
reads run at once, and ``GET /api/v1/me`` and every other synchronous route never queue behind them: before,
a thousand streams polling every second queued their reads ahead of every other user's request in that pool
(``bench/streams.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import ParamSpec, TypeVar

import anyio
import anyio.to_thread
import orjson
from starlette.responses import ContentStream, StreamingResponse
from starlette.types import Receive, Scope, Send

from hpc_master.errors import TooManyRequestsError
from hpc_master.services.access import Principal

T = TypeVar("T")
P = ParamSpec("P")

STREAM_THREADS = 8
"""Threads that streams' and change hubs' reads share (the synchronous routes have 40 of their own)."""
RETRY_AFTER_S = 5.0
"""What a refused stream's ``Retry-After`` says: streams end at any time, so soon, but not in a tight loop."""
NDJSON = "application/x-ndjson"
MAX_LONG_POLL_S = 60
"""The longest a long poll waits (``timeoutSeconds`` beyond it is cut to it)."""

SlotKey = tuple[str, int]
"""``("user", user_id)`` or ``("trial", trial_id)``."""


def ndjson(results: Iterable[object], *, browser: bool = False) -> bytes:
    """Newline-delimited JSON, one ``{"result": ...}`` per line: what every stream sends (``responses_ui``
    documents each stream's line). For a browser (the web UI's streams): strict JSON, by orjson, where a NaN
    or an infinity is ``null`` (``JSON.parse`` refuses them). Otherwise (Determined's Python client, ``det``)
    ``json.dumps``'s: a NaN metric stays ``NaN``, which Python's ``json`` reads back as one."""
    if browser:
        return b"".join(orjson.dumps({"result": r}) + b"\n" for r in results)
    return "".join(json.dumps({"result": r}) + "\n" for r in results).encode()


class TooManyStreamsError(TooManyRequestsError):
    default_code = "too_many_streams"


class StreamSlot:
    """One open stream's or long poll's place under its caller's cap; ``release`` is idempotent."""

    __slots__ = ("__weakref__", "_key", "_released", "_slots")

    def __init__(self, slots: StreamSlots, key: SlotKey) -> None:
        self._slots = slots
        self._key = key
        self._released = False

    def release(self) -> None:
        self._slots._release(self)


class StreamSlots:
    """How many streams each user, and how many long polls each trial's harness, has open (one per app)."""

    def __init__(self, per_user: int, per_trial: int) -> None:
        self.per_user = per_user
        self.per_trial = per_trial
        self._open: dict[SlotKey, int] = {}
        self._lock = threading.Lock()  # sync routes take slots in the thread pool

    def acquire(self, principal: Principal) -> StreamSlot:
        """A slot of the caller's, or `TooManyStreamsError` when the caller has its cap's worth open."""
        key, cap = self._key_and_cap(principal)
        with self._lock:
            held = self._open.get(key, 0)
            if held >= cap:
                raise TooManyStreamsError(self._refusal(principal, cap), retry_after_s=RETRY_AFTER_S)
            self._open[key] = held + 1
        return StreamSlot(self, key)

    def held(self, principal: Principal) -> int:
        """How many slots the caller holds now."""
        with self._lock:
            return self._open.get(self._key_and_cap(principal)[0], 0)

    def _key_and_cap(self, principal: Principal) -> tuple[SlotKey, int]:
        if principal.trial_id is not None:
            return ("trial", principal.trial_id), self.per_trial
        return ("user", principal.user_id), self.per_user

    def _refusal(self, principal: Principal, cap: int) -> str:
        if principal.trial_id is not None:
            return (
                f"trial {principal.trial_id} has {cap} long polls open, the most this master allows one trial "
                f"(security.max_long_polls_per_trial: {cap}); retry when one has answered"
            )
        return (
            f"user {principal.username} has {cap} streams open (log follows, metric streams, web UI pages, "
            f"long polls), the most this master allows one user (security.max_streams_per_user: {cap}); close "
            "one, or ask an admin to raise the limit"
        )

    def _release(self, slot: StreamSlot) -> None:
        with self._lock:
            if slot._released:
                return
            slot._released = True
            left = self._open[slot._key] - 1
            if left:
                self._open[slot._key] = left
            else:
                del self._open[slot._key]


class CappedStreamingResponse(StreamingResponse):
    """A streaming response that gives its slot back when it ends, whichever way it ends."""

    def __init__(
        self,
        slot: StreamSlot,
        content: ContentStream,
        *,
        headers: Mapping[str, str] | None = None,
        media_type: str = NDJSON,
    ) -> None:
        super().__init__(content, headers=headers, media_type=media_type)
        self.slot = slot
        weakref.finalize(self, slot.release)  # a response that is never sent (an error after the route)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)  # returns when the client disconnects, too
        finally:
            self.slot.release()


def open_stream(
    slots: StreamSlots,
    principal: Principal,
    content: ContentStream,
    *,
    headers: Mapping[str, str] | None = None,
    media_type: str = NDJSON,
) -> StreamingResponse:
    """The response of a stream route, under the caller's cap (`TooManyStreamsError` when over it). Call it
    last, after the route's checks: nothing between taking the slot and the response may fail."""
    slot = slots.acquire(principal)
    return CappedStreamingResponse(slot, content, headers=headers, media_type=media_type)


@contextlib.contextmanager
def long_poll(slots: StreamSlots, principal: Principal) -> Iterator[None]:
    """Hold one of the caller's slots while a long poll waits."""
    slot = slots.acquire(principal)
    try:
        yield
    finally:
        slot.release()


class StreamThreads:
    """Runs streams' blocking reads under a capacity limiter of their own (one per event loop)."""

    def __init__(self, total: int = STREAM_THREADS) -> None:
        self.total = total
        self._limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter] = (
            weakref.WeakKeyDictionary()
        )

    def limiter(self) -> anyio.CapacityLimiter:
        loop = asyncio.get_running_loop()
        limiter = self._limiters.get(loop)
        if limiter is None:
            limiter = self._limiters[loop] = anyio.CapacityLimiter(self.total)
        return limiter

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=self.limiter())

    async def iterate(self, iterator: Iterator[T]) -> AsyncIterator[T]:
        """A blocking iterator's items, each ``next`` in these threads (Starlette's ``iterate_in_threadpool``
        runs them in the shared pool)."""

        def step() -> tuple[T] | None:
            try:
                return (next(iterator),)
            except StopIteration:
                return None

        while (item := await self.run(step)) is not None:
            yield item[0]


stream_threads = StreamThreads()
"""The master's one set of stream threads."""
