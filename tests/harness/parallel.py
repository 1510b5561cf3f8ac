"""Run a function once per rank, each rank a thread, with real TCP collectives between them."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

from harness.core import DistributedContext


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_ranks(
    size: int,
    fn: Callable[[DistributedContext], Any],
    *,
    local_size: int | None = None,
    timeout_s: float = 30,
) -> list[Any]:
    """Call ``fn(dist)`` on ``size`` thread-ranks (``local_size`` per fake node) and return results by rank."""
    local_size = local_size or size
    port = free_port()
    results: list[Any] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def one(rank: int) -> None:
        try:
            with DistributedContext(
                rank=rank,
                size=size,
                local_rank=rank % local_size,
                local_size=local_size,
                cross_rank=rank // local_size,
                cross_size=size // local_size,
                chief_ip="127.0.0.1",
                pub_port=port,
                connect_timeout_s=timeout_s,
            ) as dist:
                results[rank] = fn(dist)
        except BaseException as e:
            errors[rank] = e

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
        if t.is_alive():
            raise TimeoutError("a rank did not finish (deadlock?)")
    for e in errors:
        if e is not None:
            raise e
    return results
