"""Ships metrics to the master from a background thread, in batches, surviving master outages.

``put()`` only appends to an in-memory deque (a few microseconds). The shipper thread wakes every
``flush_interval_s`` (or when asked to flush), and POSTs everything pending to
``/api/v1/trials/{id}/metrics/batch`` in batches of ``batch_size``. A failed batch is retried with capped
exponential backoff until it is accepted; the master deduplicates on (trial, trialRunId, group, stepsCompleted),
so a retry after a timeout or a master restart never duplicates. When more than ``max_queue_items`` are
pending, the overflow is spilled to a JSON-lines file in ``spill_dir`` and sent later; spill files left by a
previous run of the same trial are sent on start. ``close(timeout_s)`` flushes; what could not be sent stays in
a spill file.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from harness._http import JSON, MasterError, MasterSession, backoff_s

logger = logging.getLogger("harness.metrics")


def get_spill_dir() -> pathlib.Path:
    from harness import cluster_info

    base = cluster_info.get_job_storage() or pathlib.Path(tempfile.gettempdir())
    return base / ".harness-metrics-spill"


class MetricsShipper:
    def __init__(
        self,
        session: MasterSession,
        trial_id: int,
        *,
        flush_interval_s: float = 1.0,
        batch_size: int = 1000,
        max_queue_items: int = 100_000,
        spill_dir: pathlib.Path | None = None,
        backoff_base_s: float = 0.2,
        backoff_cap_s: float = 10.0,
    ) -> None:
        self._session = session
        self._trial_id = trial_id
        self._path = f"/api/v1/trials/{trial_id}/metrics/batch"
        self._flush_interval_s = flush_interval_s
        self._batch_size = batch_size
        self._max_queue_items = max_queue_items
        self._spill_dir = spill_dir or get_spill_dir()
        self._backoff = (backoff_base_s, backoff_cap_s)
        self._lock = threading.Lock()
        self._pending: deque[JSON] = deque()
        self._wake = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._in_flight = 0
        self._spilled = 0
        self._draining_spill = False
        self._stopped = False
        self._control: dict[str, tuple[str, JSON]] = {}  # latest-wins calls (progress, status)
        self.sent = 0
        self.duplicates = 0
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name="harness-metrics", daemon=True)
        self._thread.start()

    # -- producer side -------------------------------------------------------------------------------
    def put(self, item: JSON) -> None:
        with self._lock:
            if self._stopped:
                raise RuntimeError("metrics shipper is closed")
            if len(self._pending) >= self._max_queue_items:
                self._spill_locked([item])
                return
            self._pending.append(item)

    def put_control(self, key: str, path: str, body: JSON) -> None:
        """A call whose latest value is all that matters (progress, status): coalesced, sent in the background."""
        with self._lock:
            self._control[key] = (path, body)
        self._wake.set()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything put so far was accepted by the master. False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._wake.set()
        with self._idle:
            while self._unsent_locked():
                if not self._thread.is_alive():
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._wake.set()
                self._idle.wait(0.05 if left is None else min(left, 0.05))
        return True

    def _unsent_locked(self) -> bool:
        """Whether anything put so far is not yet accepted by the master (queued, in flight, spilled, a control
        call, or a spill file being sent). The caller holds the lock."""
        return bool(
            self._pending or self._in_flight or self._spilled or self._control or self._draining_spill
        )

    def close(self, timeout_s: float = 60.0) -> bool:
        ok = self.flush(timeout_s)
        with self._lock:
            self._stopped = True
        self._wake.set()
        self._thread.join(timeout=5.0)
        self._spill_pending()
        if not ok:
            logger.error(
                "could not send all metrics within %.0fs; the rest is kept in %s", timeout_s, self._spill_dir
            )
        return ok

    # -- spill ---------------------------------------------------------------------------------------
    def _spill_file(self) -> pathlib.Path:
        return self._spill_dir / f"trial-{self._trial_id}-{os.getpid()}.jsonl"

    def _spill_pending(self) -> None:
        with self._lock:
            if self._pending:
                self._spill_locked(list(self._pending))
                self._pending.clear()

    def _spill_locked(self, items: list[JSON]) -> None:
        self._spill_dir.mkdir(parents=True, exist_ok=True)
        with open(self._spill_file(), "a", encoding="utf-8") as f:
            for it in items:
                f.write(json.dumps(it) + "\n")
        self._spilled += len(items)

    def _spill_batches(self) -> Iterator[tuple[pathlib.Path, list[JSON]]]:
        """Batches from spill files of this trial (this run's and earlier runs'), oldest file first."""
        if not self._spill_dir.is_dir():
            return
        mine = self._spill_file()
        for path in sorted(self._spill_dir.glob(f"trial-{self._trial_id}-*.jsonl*")):
            if path == mine:
                with self._lock:  # take the file away from producers before reading it
                    sending = path.with_suffix(f".jsonl.sending-{time.monotonic_ns()}")
                    path.rename(sending)
                    self._spilled = 0
                path = sending
            batch: list[JSON] = []
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        try:
                            batch.append(json.loads(line))
                        except ValueError:
                            continue  # a torn last line from a crash
                    if len(batch) >= self._batch_size:
                        yield path, batch
                        batch = []
            yield path, batch
            path.unlink(missing_ok=True)

    # -- shipper thread ------------------------------------------------------------------------------
    def _send(self, batch: list[JSON]) -> None:
        """POST one batch until the master takes it (or we are closing and give up)."""
        attempt = 0
        while True:
            try:
                out = self._session.post(self._path, {"metrics": batch})
                self.sent += len(batch)
                self.duplicates += int(out.get("duplicates") or 0)
                return
            except Exception as e:
                if isinstance(e, MasterError) and not e.retryable:
                    logger.error("master rejected %d metrics (%s); dropping them", len(batch), e)
                    return
                self.failures += 1
                if self._stopped:
                    raise
                delay = backoff_s(attempt, base_s=self._backoff[0], cap_s=self._backoff[1])
                if attempt == 0 or attempt % 10 == 0:
                    logger.warning("sending metrics failed (%s); retrying in %.1fs", e, delay)
                attempt += 1
                self._wake.wait(delay)
                self._wake.clear()

    def _send_control(self) -> None:
        with self._lock:
            control, self._control = self._control, {}
        for key, (path, body) in control.items():
            try:
                self._session.post(path, body)
            except Exception as e:
                if isinstance(e, MasterError) and not e.retryable:
                    logger.warning("master rejected %s: %s", key, e)
                    continue
                with self._lock:
                    self._control.setdefault(key, (path, body))
                raise

    def _send_spilled(self) -> None:
        self._draining_spill = True
        try:
            for _, batch in self._spill_batches():
                if batch:
                    self._send(batch)
        finally:
            self._draining_spill = False

    def _run(self) -> None:
        try:
            self._send_spilled()
        except Exception:
            logger.warning("could not resend spilled metrics; keeping them", exc_info=True)
        try:
            self._loop()
        finally:
            self._spill_pending()
            with self._idle:
                self._idle.notify_all()

    def _loop(self) -> None:
        while True:
            self._wake.wait(self._flush_interval_s)
            self._wake.clear()
            try:
                self._drain()
            except Exception:
                if self._stopped:
                    break
                logger.warning("metrics shipper error", exc_info=True)
                time.sleep(backoff_s(3))
            with self._idle:
                self._idle.notify_all()
                if self._stopped and not self._pending:
                    break

    def _drain(self) -> None:
        while True:
            if self._control:
                self._send_control()
            with self._lock:
                spilled = self._spilled
            if spilled:
                self._send_spilled()
                continue
            with self._lock:
                n = min(len(self._pending), self._batch_size)
                if n == 0:
                    return
                batch = [self._pending.popleft() for _ in range(n)]
                self._in_flight = n
            try:
                self._send(batch)
            except Exception:
                with self._lock:
                    self._pending.extendleft(reversed(batch))
                raise
            finally:
                with self._lock:
                    self._in_flight = 0


def to_json_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Metric values as JSON numbers: tensors and numpy scalars become floats, nested dicts/lists kept."""
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        out[str(k)] = _value(v)
    return out


def _value(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, dict):
        return to_json_metrics(v)
    if isinstance(v, (list, tuple)):
        return [_value(x) for x in v]
    item = getattr(v, "item", None)
    if callable(item):
        try:
            return item()
        except (ValueError, RuntimeError):
            tolist = getattr(v, "tolist", None)
            if callable(tolist):
                return tolist()
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)
