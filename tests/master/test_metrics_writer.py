"""The metrics writer's group commit, on SQLite and PostgreSQL: batches that wait share one transaction,
each request gets its own answer, and one failing batch never fails the others of its group."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.models import MetricModel
from hpc_master.errors import NotFoundError
from hpc_master.ingest.writer import MetricsWriter
from hpc_master.services.metrics import MetricReport, ingest_metrics

from .helpers import seed_trial

pytestmark = pytest.mark.storage  # metrics ingest


def _reports(first_step: int, n: int) -> list[MetricReport]:
    return [
        MetricReport(trial_run_id=1, steps_completed=s, group="training", metrics={"loss": 1.0 / s})
        for s in range(first_step, first_step + n)
    ]


def _metric_rows(sessions: sessionmaker[Session], trial_id: int) -> int:
    with sessions() as s:
        return int(s.scalar(select(func.count()).where(MetricModel.trial_id == trial_id)) or 0)


async def _run_group(writer: MetricsWriter, applies: list[Any]) -> list[Any]:
    """Hold the writer in a first transaction until every apply is queued, so they form one group."""
    gate = threading.Event()

    def blocker(_: Session) -> str:
        gate.wait(10)
        return "blocker"

    first = asyncio.ensure_future(writer.run(blocker, 0))
    await asyncio.sleep(0.05)  # the writer is now inside the blocker's transaction
    rest = [asyncio.ensure_future(writer.run(a, 1)) for a in applies]
    await asyncio.sleep(0.05)
    gate.set()
    assert await first == "blocker"
    return await asyncio.gather(*rest, return_exceptions=True)


def test_waiting_batches_commit_together(sessions: sessionmaker[Session]) -> None:
    trial_id = seed_trial(sessions)
    writer = MetricsWriter(sessions)
    applies = [
        (lambda s, i=i: ingest_metrics(s, trial_id, _reports(1 + 10 * i, 10)))  # type: ignore[misc]
        for i in range(8)
    ]
    try:
        results = asyncio.run(_run_group(writer, applies))
    finally:
        writer.close()
    assert results == [(10, 0)] * 8
    assert writer.groups == 2  # the blocker's transaction, then all eight batches in one
    assert _metric_rows(sessions, trial_id) == 80


def test_a_failing_batch_fails_alone(sessions: sessionmaker[Session]) -> None:
    trial_id = seed_trial(sessions)
    writer = MetricsWriter(sessions)

    def missing(s: Session) -> Any:
        ingest_metrics(s, trial_id, _reports(1000, 5))  # written, then rolled back with its transaction
        raise NotFoundError("trial 999 not found")

    applies = [
        lambda s: ingest_metrics(s, trial_id, _reports(1, 10)),
        missing,
        lambda s: ingest_metrics(s, trial_id, _reports(11, 10)),
        lambda s: ingest_metrics(s, trial_id, _reports(1, 10)),  # a retry of the first: all duplicates
    ]
    try:
        results = asyncio.run(_run_group(writer, applies))
    finally:
        writer.close()
    assert results[0] == (10, 0) and results[2] == (10, 0) and results[3] == (0, 10)
    assert isinstance(results[1], NotFoundError)
    assert _metric_rows(sessions, trial_id) == 20  # none of the failed batch's rows


def test_close_answers_what_was_queued(sessions: sessionmaker[Session]) -> None:
    trial_id = seed_trial(sessions)
    writer = MetricsWriter(sessions)

    async def main() -> tuple[int, int]:
        result: tuple[int, int] = await writer.run(lambda s: ingest_metrics(s, trial_id, _reports(1, 3)), 3)
        return result

    assert asyncio.run(main()) == (3, 0)
    writer.close()
    writer.close()  # idempotent
    assert _metric_rows(sessions, trial_id) == 3


@pytest.mark.parametrize("rows", [1, 6000, 20000])
def test_max_rows_bounds_a_group(sessions: sessionmaker[Session], rows: int) -> None:
    """A group stops growing once it holds max_rows (batches announced as 3000 rows each)."""
    trial_id = seed_trial(sessions)
    writer = MetricsWriter(sessions, max_rows=rows)
    applies = [
        (lambda s, i=i: ingest_metrics(s, trial_id, _reports(1 + 100 * i, 100)))  # type: ignore[misc]
        for i in range(4)
    ]

    async def main() -> list[Any]:
        gate = threading.Event()
        first = asyncio.ensure_future(writer.run(lambda _: gate.wait(10), 0))
        await asyncio.sleep(0.05)
        rest = [asyncio.ensure_future(writer.run(a, 3000)) for a in applies]
        await asyncio.sleep(0.05)
        gate.set()
        await first
        return await asyncio.gather(*rest)

    try:
        assert asyncio.run(main()) == [(100, 0)] * 4
    finally:
        writer.close()
    # max_rows 1: one batch per group; 6000: two (3000 < 6000, then 6000 is full); 20000: all four.
    assert writer.groups == 1 + {1: 4, 6000: 2, 20000: 1}[rows]
