"""SearcherContext: the ≤0.37 ``operations()`` form, for scripts written against it."""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterator
from typing import Any

from harness._http import MasterSession, retry
from harness.core._distributed import DistributedContext
from harness.core._preempt import preempt_signal_received
from harness.core._train import TrainContext

logger = logging.getLogger("harness.core")


class SearcherMode(enum.Enum):
    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"


class Unit(enum.Enum):
    EPOCHS = "EPOCHS"
    RECORDS = "RECORDS"
    BATCHES = "BATCHES"


def parse_searcher_units(config: dict[str, Any]) -> Unit | None:
    """The unit of ``searcher.max_length`` (``{"batches": 100}`` → BATCHES); None for a bare number."""
    searcher = config.get("searcher") or {}
    length = searcher.get("max_length")
    if isinstance(length, dict) and len(length) == 1:
        key = next(iter(length)).upper()
        if key in Unit.__members__:
            return Unit[key]
    time_metric = searcher.get("time_metric")
    if isinstance(time_metric, str) and time_metric.upper() in Unit.__members__:
        return Unit[time_metric.upper()]
    return None


class SearcherOperation:
    """One unit of work from the searcher: train until ``length`` (cumulative) and report a metric."""

    def __init__(self, context: SearcherContext | None, length: int, is_chief: bool) -> None:
        self._context = context
        self._length = length
        self._is_chief = is_chief
        self._completed = False

    @property
    def length(self) -> int:
        return self._length

    def report_progress(self, length: float) -> None:
        if not self._is_chief:
            raise RuntimeError("you must only call op.report_progress() from the chief worker")
        if self._completed and length != self._length:
            raise RuntimeError("you must not call op.report_progress() after op.report_completed()")
        if self._context is not None and self._length > 0:
            self._context._train.report_progress(max(0.0, min(1.0, float(length) / self._length)))

    def report_completed(self, searcher_metric: Any) -> None:
        if not self._is_chief:
            raise RuntimeError("you must only call op.report_completed() from the chief worker")
        if self._completed:
            raise RuntimeError("you may only call op.report_completed() once")
        self._completed = True
        if self._context is not None:
            self._context._complete(self._length, float(searcher_metric))


class SearcherContext:
    def __init__(
        self,
        session: MasterSession,
        dist: DistributedContext,
        trial_id: int,
        train: TrainContext,
        units: Unit | None = None,
    ) -> None:
        self._session = session
        self._dist = dist
        self._trial_id = trial_id
        self._train = train
        self._units = units
        self._next: dict[str, Any] | None = None

    def _next_length(self) -> int | None:
        path = f"/api/v1/trials/{self._trial_id}/searcher/operation"
        out, self._next = self._next, None
        if out is None:
            out = retry(lambda: self._session.get(path), what="get searcher operation")
        while out.get("pending"):  # the searcher has not answered the last completion yet: a long poll
            if preempt_signal_received():  # Slurm preempts or the time limit nears: end, to be resumed
                return None
            out = retry(lambda: self._session.get(path), what="get searcher operation")
        op = out.get("op")
        if out.get("completed") or not op:
            return None
        return int(op["validateAfter"]["length"])

    def _complete(self, length: int, metric: float) -> None:
        self._train.flush(timeout_s=60)  # validation metrics first, so the master sees them with the op
        body = {"op": {"validateAfter": {"length": length}}, "searcherMetric": metric}
        path = f"/api/v1/trials/{self._trial_id}/searcher/completed_operation"
        out = retry(lambda: self._session.post(path, body), what="complete searcher operation")
        nxt = out.get("next")  # the next operation's answer when the master already knows it
        self._next = nxt if isinstance(nxt, dict) else None

    def operations(
        self, searcher_mode: SearcherMode = SearcherMode.WorkersAskChief, auto_ack: bool = True
    ) -> Iterator[SearcherOperation]:
        """Yield operations until the searcher has none left for this trial. The chief must complete each."""
        mode = SearcherMode(searcher_mode)
        is_chief = self._dist.rank == 0
        if not is_chief and mode == SearcherMode.ChiefOnly:
            raise RuntimeError("SearcherMode.ChiefOnly: operations() may only be called on the chief")
        while True:
            if is_chief:
                length = self._next_length()
                if mode == SearcherMode.WorkersAskChief:
                    self._dist.broadcast(length)
            else:
                length = self._dist.broadcast(None)
            if length is None:
                return
            op = SearcherOperation(self, length, is_chief)
            yield op
            if is_chief and not op._completed:
                raise RuntimeError("you must call op.report_completed() on each operation before the next")

    def acknowledge_out_of_ops(self) -> None:
        pass

    def get_configured_units(self) -> Unit | None:
        return self._units


class DummySearcherContext(SearcherContext):
    """Yields one operation of ``length`` off-cluster, with the same collective pattern."""

    def __init__(self, dist: DistributedContext, length: int = 1) -> None:
        self._dist = dist
        self._length = length
        self._units = None

    def operations(
        self, searcher_mode: SearcherMode = SearcherMode.WorkersAskChief, auto_ack: bool = True
    ) -> Iterator[SearcherOperation]:
        mode = SearcherMode(searcher_mode)
        is_chief = self._dist.rank == 0
        if not is_chief and mode == SearcherMode.ChiefOnly:
            raise RuntimeError("SearcherMode.ChiefOnly: operations() may only be called on the chief")
        for length in (self._length, None):
            if mode == SearcherMode.WorkersAskChief:
                length = self._dist.broadcast(length)
            if length is None:
                return
            op = SearcherOperation(None, length, is_chief)
            yield op
            if is_chief and not op._completed:
                raise RuntimeError("you must call op.report_completed() on each operation before the next")
