"""``det-master`` with two probes for ``bench/many_users.py``, installed from outside (nothing in hpc_master changes).

    python bench/_many_users_master.py --config master.yaml   # then exactly as ``python -m hpc_master.server``

- ``DET_BENCH_TICK_LOG``: one JSON line per lifecycle tick: its wall-clock start ``t``, its duration ``dur``, the
  loop's ``interval`` and the time spent in each step of the tick (``LifecycleLoop`` and ``JobDriver`` methods,
  wrapped on the class before the loop is built).
- ``DET_BENCH_REQ_LOG``: one line per HTTP request, ``wall method path status head_s total_s``: seconds from
  the request reaching the app to its response headers (what a client of a stream waits for) and to its end.
  An outermost pure-ASGI middleware, so the master's own middlewares (the metrics fast path) are inside it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LOOP_STEPS = (
    "repair_stranded_trials",
    "drive_searchers",
    "renice_pending",
    "collect_checkpoints",
    "housekeeping",
)
JOB_STEPS = ("cancel_stopped", "poll", "submit_pending")


def install_tick_probe(path: str) -> None:
    from hpc_master.lifecycle.jobs import JobDriver
    from hpc_master.lifecycle.loop import LifecycleLoop

    out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the life of the process
    steps: dict[str, float] = {}  # only the loop's thread ticks

    def timed(cls: type, name: str) -> None:
        original: Callable[..., Any] = getattr(cls, name)

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                steps[name] = steps.get(name, 0.0) + time.perf_counter() - t0

        setattr(cls, name, wrapper)

    for name in LOOP_STEPS:
        timed(LifecycleLoop, name)
    for name in JOB_STEPS:
        timed(JobDriver, name)
    original_tick = LifecycleLoop.tick

    def tick(self: LifecycleLoop) -> None:
        steps.clear()
        wall, t0 = time.time(), time.perf_counter()
        try:
            original_tick(self)
        finally:
            record = {"t": wall, "dur": time.perf_counter() - t0, "interval": self.interval_s, **steps}
            out.write(json.dumps(record) + "\n")

    LifecycleLoop.tick = tick


class RequestTimer:
    """Pure ASGI: times every HTTP request, streams included (headers and end apart)."""

    out: Any = None

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        head: list[Any] = [0, None]

        async def send_timed(message: Any) -> None:
            if message["type"] == "http.response.start":
                head[0], head[1] = message["status"], time.perf_counter()
            await send(message)

        try:
            await self.app(scope, receive, send_timed)
        finally:
            end = time.perf_counter()
            first = head[1] if head[1] is not None else end
            self.out.write(
                f"{time.time():.3f} {scope['method']} {scope['path']} {head[0]} {first - t0:.6f} {end - t0:.6f}\n"
            )


def install_request_probe(path: str) -> None:
    import hpc_master.api.app as app_module

    RequestTimer.out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the life of the process
    original = app_module.create_app

    def create_app(*args: Any, **kwargs: Any) -> Any:
        app = original(*args, **kwargs)
        app.add_middleware(RequestTimer)  # added last: outermost
        return app

    app_module.create_app = create_app


if __name__ == "__main__":
    install_tick_probe(os.environ["DET_BENCH_TICK_LOG"])
    install_request_probe(os.environ["DET_BENCH_REQ_LOG"])
    from hpc_master import server

    sys.exit(server.main())
