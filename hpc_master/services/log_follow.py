"""Following a job's output: the one loop behind a trial's logs and a task's (``GET /api/v1/trials/{id}/logs``,
``GET /api/v1/tasks/{id}/logs``).

Each pass reads what the files gained since the last (``logs.read_new_lines``, through the job layer's file
reader: as the job's owner when the master serves as its service account), keeps the lines the caller asked
for, and hands them on; a file with more than one read's worth left is read again at once. Without
``follow`` it ends at the files' ends; with it, it waits ``POLL_S`` and looks again, asking ``snapshot``
for the sources (a trial's new run adds one) and whether their producer has ended, and ends once it has
and its last lines were read. ``limit`` caps the lines (0: all); ``tail`` (no ``follow``) keeps only the
last ``limit`` and gives them newest first. The route turns each batch into its stream's lines.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpc_master.services import logs

POLL_S = 0.5
"""How long a follow waits between looks when nothing was new."""

Line = dict[str, object]
Snapshot = Callable[[], tuple[Sequence[logs.LogSource], bool]]


@dataclass
class Follow:
    """One log stream's reads. `run` runs a blocking read away from the event loop (the API's stream
    threads); `trial_id` is the id the lines carry (0 for a task)."""

    run: Callable[..., Awaitable[Any]]
    snapshot: Snapshot
    reader: logs.LogReader | None
    follow: bool = False
    limit: int = 0
    tail: bool = False
    keep: Callable[[Line], bool] = field(default=lambda _line: True)
    trial_id: int = 0


class _Window:
    """What a stream still sends: at most `limit` lines (0: all), or (`tail`) the last `limit`, newest first."""

    def __init__(self, limit: int, tail: bool) -> None:
        self.limit, self.tail, self.sent = limit, tail, 0
        self.last: deque[Line] = deque(maxlen=limit if limit > 0 else None)

    def take(self, lines: list[Line]) -> list[Line]:
        """What of `lines` to send now (a tail keeps them for the end)."""
        if self.tail:
            self.last.extend(lines)
            return []
        if self.limit > 0:
            lines = lines[: self.limit - self.sent]
        self.sent += len(lines)
        return lines

    @property
    def full(self) -> bool:
        return not self.tail and 0 < self.limit <= self.sent

    def rest(self) -> list[Line]:
        return list(reversed(self.last))


async def batches(spec: Follow, sources: Sequence[logs.LogSource], done: bool) -> AsyncIterator[list[Line]]:
    """The lines, batch by batch, from `sources` (and `done`: their producer has ended) as first read."""
    cursor = logs.LogCursor(offsets={})
    window = _Window(spec.limit, spec.tail)
    while True:
        final = done or not spec.follow
        lines, more = await spec.run(
            logs.read_new_lines, spec.trial_id, sources, cursor, final=final, reader=spec.reader
        )
        taken = window.take([line for line in lines if spec.keep(line)])
        if taken:
            yield taken
        if window.full:
            return
        if more:
            continue
        if final:
            if spec.tail:
                yield window.rest()
            return
        await asyncio.sleep(POLL_S)
        sources, done = await spec.run(spec.snapshot)
