"""TrainContext: metrics, progress, status and early exit, reported to the master."""

from __future__ import annotations

import datetime
import enum
import logging
import os
import pathlib
import threading
import time
from collections import deque
from typing import Any

from harness._http import MasterError, MasterSession, retry
from harness.core._metrics import MetricsShipper, to_json_metrics
from harness.core._tfevents import EventsWriter

logger = logging.getLogger("harness.core")


class EarlyExitReason(enum.Enum):
    INVALID_HP = "EXITED_REASON_INVALID_HP"
    USER_REQUESTED_STOP = "EXITED_REASON_USER_REQUESTED_STOP"
    UNSPECIFIED = "EXITED_REASON_UNSPECIFIED"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def get_tensorboard_dir() -> pathlib.Path | None:
    """Where this trial's TensorBoard files go: ``DET_TENSORBOARD_PATH``, set by the master for trial jobs."""
    path = os.environ.get("DET_TENSORBOARD_PATH")
    return pathlib.Path(path) if path else None


def tensorboard_tag(group: str, name: str) -> str:
    """Determined's tags: ``Determined/loss``, ``Determined/validation_loss``, ``Determined/<group>/x``."""
    if group == "training":
        return f"Determined/{name}"
    if group == "validation":
        return f"Determined/{name if name.startswith('validation_') else 'validation_' + name}"
    return f"Determined/{group}/{name}"


class TensorBoardScalars:
    """Writes reported metrics as TensorBoard scalars from a background thread.

    ``put()`` only appends to a deque; tags are made and events encoded and written by the thread, every
    ``interval_s`` or on ``flush()``. Write errors are logged, never raised into the training loop.
    """

    def __init__(self, directory: pathlib.Path, interval_s: float = 2.0) -> None:
        self.writer = EventsWriter(directory)
        self._interval_s = interval_s
        self._pending: deque[tuple[str, int, float, dict[str, Any]]] = deque()
        self._write_lock = threading.Lock()  # one drain at a time, so events stay in order
        self._wake = threading.Event()
        self._stopped = False
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="harness-tensorboard", daemon=True)
        self._thread.start()

    def put(self, group: str, steps_completed: int, metrics: dict[str, Any]) -> None:
        self._pending.append((group, steps_completed, time.time(), metrics))

    def flush(self) -> None:
        """Write everything put so far to the file, in the caller's thread."""
        self._write_pending()

    def close(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=10.0)
        self._write_pending()
        try:
            self.writer.close()
        except OSError as e:
            logger.warning("could not close the TensorBoard events file: %s", e)

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            self._write_pending()

    def _write_pending(self) -> None:
        with self._write_lock:
            try:
                while self._pending:
                    group, step, wall_time, metrics = self._pending.popleft()
                    scalars = {tensorboard_tag(group, k): v for k, v in metrics.items()}
                    self.writer.add_scalars(step, scalars, wall_time)
                self.writer.flush()
            except Exception as e:  # a full disk must not stop training
                self._pending.clear()
                if not self._failed:
                    self._failed = True
                    logger.warning("could not write TensorBoard scalars to %s: %s", self.writer.directory, e)


class TrainContext:
    """Reports metrics for a trial. Metric calls never block on the network: a background thread ships them."""

    def __init__(
        self,
        session: MasterSession,
        trial_id: int,
        run_id: int,
        exp_id: int,
        shipper: MetricsShipper,
    ) -> None:
        self._session = session
        self._trial_id = trial_id
        self._run_id = run_id
        self._exp_id = exp_id
        self._shipper = shipper
        self._tensorboard_dir = get_tensorboard_dir()
        self._tensorboard = TensorBoardScalars(self._tensorboard_dir) if self._tensorboard_dir else None

    def report_metrics(self, group: str, steps_completed: int, metrics: dict[str, Any]) -> None:
        self._report(group, steps_completed, metrics, None)

    def report_training_metrics(
        self,
        steps_completed: int,
        metrics: dict[str, Any],
        batch_metrics: list[dict[str, Any]] | None = None,
    ) -> None:
        self._report("training", steps_completed, metrics, batch_metrics)

    def report_validation_metrics(self, steps_completed: int, metrics: dict[str, Any]) -> None:
        self._report("validation", steps_completed, metrics, None)

    def _report(
        self,
        group: str,
        steps_completed: int,
        metrics: dict[str, Any],
        batch_metrics: list[dict[str, Any]] | None,
    ) -> None:
        avg = to_json_metrics(metrics)
        if self._tensorboard is not None:
            self._tensorboard.put(group, int(steps_completed), avg)
        body: dict[str, Any] = {"avgMetrics": avg}
        if batch_metrics is not None:
            body["batchMetrics"] = [to_json_metrics(m) for m in batch_metrics]
        self._shipper.put(
            {
                "trialRunId": self._run_id,
                "stepsCompleted": int(steps_completed),
                "group": group,
                "metrics": body,
                "reportTime": _now(),
            }
        )

    def report_progress(self, progress: float) -> None:
        if not 0.0 <= progress <= 1.0:
            raise ValueError(f"progress must be between 0 and 1, got {progress}")
        self._shipper.put_control(
            "progress", f"/api/v1/trials/{self._trial_id}/progress", {"progress": float(progress)}
        )

    def set_status(self, status: str) -> None:
        self._shipper.put_control(
            "status", f"/api/v1/trials/{self._trial_id}/runner/metadata", {"metadata": {"state": status}}
        )

    def get_experiment_best_validation(self) -> float | None:
        path = f"/api/v1/experiments/{self._exp_id}/searcher/best_searcher_validation_metric"
        try:
            out = retry(lambda: self._session.get(path), what="get best validation", deadline_s=60)
        except MasterError as e:
            logger.warning("could not get the best validation metric: %s", e)
            return None
        metric = out.get("metric")
        return float(metric) if metric is not None else None

    def report_early_exit(self, reason: EarlyExitReason) -> None:
        self._shipper.flush(timeout_s=60)
        body = {"earlyExit": {"reason": EarlyExitReason(reason).value}}
        path = f"/api/v1/trials/{self._trial_id}/early_exit"
        retry(lambda: self._session.post(path, body), what="report early exit")

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every metric reported so far was accepted by the master (and written for TensorBoard)."""
        if self._tensorboard is not None:
            self._tensorboard.flush()
        return self._shipper.flush(timeout_s)

    def close(self) -> None:
        """Write out the TensorBoard scalars still queued and close their file (the Context closes the shipper)."""
        if self._tensorboard is not None:
            self._tensorboard.close()

    def get_tensorboard_path(self) -> pathlib.Path | None:
        """The trial's TensorBoard directory (created), or None when the master set none.

        Files written there (by ``torch.utils.tensorboard.SummaryWriter``, say) sit next to the scalars the
        harness writes for every reported metric.
        """
        if self._tensorboard_dir is not None:
            self._tensorboard_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        return self._tensorboard_dir

    def upload_tensorboard_files(self, *_: Any, **__: Any) -> None:
        """A no-op: the TensorBoard directory is already on the shared filesystem, where TensorBoard reads it."""


class DummyTrainContext(TrainContext):
    """Logs metrics instead of sending them; keeps them in ``history`` for tests and notebooks."""

    def __init__(self, *_: Any, **__: Any) -> None:
        self.history: list[tuple[str, int, dict[str, Any]]] = []
        self.progress: float | None = None
        self.status: str | None = None
        self.early_exit: EarlyExitReason | None = None

    def _report(
        self,
        group: str,
        steps_completed: int,
        metrics: dict[str, Any],
        batch_metrics: list[dict[str, Any]] | None,
    ) -> None:
        metrics = to_json_metrics(metrics)
        self.history.append((group, int(steps_completed), metrics))
        logger.info("report %s metrics: steps_completed=%d metrics=%s", group, steps_completed, metrics)

    def report_progress(self, progress: float) -> None:
        self.progress = float(progress)
        logger.debug("report_progress(%s)", progress)

    def set_status(self, status: str) -> None:
        self.status = status
        logger.info("status: %s", status)

    def get_experiment_best_validation(self) -> float | None:
        return None

    def report_early_exit(self, reason: EarlyExitReason) -> None:
        self.early_exit = EarlyExitReason(reason)
        logger.info("report_early_exit(%s)", reason)

    def flush(self, timeout_s: float | None = None) -> bool:
        return True

    def close(self) -> None:
        pass

    def get_tensorboard_path(self) -> pathlib.Path | None:
        return None
