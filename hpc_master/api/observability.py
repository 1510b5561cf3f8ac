"""For the site's monitoring: ``GET /health`` (the unit's and a load balancer's check) and ``GET /metrics``
(Prometheus' text format, from the official ``prometheus_client``). Neither needs a login nor says anything
about any user: counts and ages only, no names.

``/health`` is 200 when the database answers and the lifecycle loop ticked lately (within
``HEALTHY_TICKS`` poll intervals, and at least ``MIN_STALE_S``), else 503 with what is wrong.

``/metrics``:

- ``det_loop_ticks_total``, ``det_loop_tick_seconds_total``, ``det_loop_last_tick_age_seconds``;
- ``det_queue_depth{waiting_in}``: trial runs waiting in Slurm (submitted) or in the master (not yet);
- ``det_slurm_calls_total{command}``: Slurm commands run (each is one or a few RPCs to slurmctld);
  ``rate(det_slurm_calls_total[1m]) * 60`` is the calls per minute;
- ``det_helper_starts_total``: per-user helper processes started;
- ``det_proxy_websockets``, ``det_proxy_requests_total``: tasks' pages through the proxy.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy import func, select, text

from hpc_master import helper_client
from hpc_master.api import proxy, responses
from hpc_master.db.models import TrialRunModel
from slurm_backend.cli import calls_by_command

router = APIRouter(tags=["observability"])
HEALTHY_TICKS = 10
MIN_STALE_S = 60.0


def _loop(request: Request) -> Any:
    return getattr(request.app.state, "loop", None)


@router.get("/health", response_model=responses.Health, responses={503: {"model": responses.Health}})
def health(request: Request) -> JSONResponse:
    """200 ``{"status": "ok", ...}``; 503 ``{"status": "unhealthy", "problems": [...]}``."""
    state = request.app.state.det
    problems = []
    try:
        with state.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as e:  # any failure to reach the database is the answer
        problems.append(f"the database does not answer: {type(e).__name__}")
    loop = _loop(request)
    age = None
    if loop is not None:
        started = loop.last_tick_at
        age = None if started is None else time.monotonic() - started
        limit = max(MIN_STALE_S, HEALTHY_TICKS * loop.interval_s)
        if age is not None and age > limit:
            problems.append(f"the lifecycle loop last ticked {age:.0f} s ago (more than {limit:.0f} s)")
    body = {"status": "unhealthy" if problems else "ok", "problems": problems, "lastTickAgeSeconds": age}
    return JSONResponse(body, status_code=503 if problems else 200)


class _Collector:
    def __init__(self, request: Request) -> None:
        self.request = request

    def collect(self) -> Iterator[Metric]:
        loop = _loop(self.request)
        if loop is not None:
            yield CounterMetricFamily("det_loop_ticks", "Lifecycle loop ticks", value=loop.ticks)
            yield CounterMetricFamily("det_loop_tick_seconds", "Time spent in ticks", value=loop.tick_seconds)
            if loop.last_tick_at is not None:
                age = time.monotonic() - loop.last_tick_at
                yield GaugeMetricFamily(
                    "det_loop_last_tick_age_seconds", "Since the last tick ended", value=age
                )
        depth = GaugeMetricFamily("det_queue_depth", "Trial runs waiting to start", labels=["waiting_in"])
        for where, n in _queue(self.request).items():
            depth.add_metric([where], n)
        yield depth
        calls = CounterMetricFamily("det_slurm_calls", "Slurm commands run", labels=["command"])
        for command, n in sorted(calls_by_command().items()):
            calls.add_metric([command], n)
        yield calls
        yield CounterMetricFamily(
            "det_helper_starts", "Per-user helpers started", value=helper_client.STARTS.value
        )
        yield GaugeMetricFamily(
            "det_proxy_websockets", "WebSockets to tasks open", value=proxy.OPEN_SOCKETS[0]
        )
        yield CounterMetricFamily("det_proxy_requests", "HTTP requests to tasks", value=proxy.PROXIED[0])


def _queue(request: Request) -> dict[str, int]:
    submitted = TrialRunModel.slurm_job_id.is_not(None)
    with request.app.state.det.tx() as session:
        rows = session.execute(
            select(submitted, func.count()).where(TrialRunModel.state == "PENDING").group_by(submitted)
        ).all()
    counts = {"slurm": 0, "master": 0}
    for in_slurm, n in rows:
        counts["slurm" if in_slurm else "master"] += int(n)
    return counts


@router.get("/metrics", response_class=Response, include_in_schema=False)  # text, not JSON
def metrics(request: Request) -> Response:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(request))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
