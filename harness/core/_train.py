"""TrainContext: metrics, progress, status and early exit, reported to the master."""

from __future__ import annotations

import datetime
import enum
import logging
from typing import Any

from harness._http import MasterError, MasterSession, retry
from harness.core._metrics import MetricsShipper, to_json_metrics

logger = logging.getLogger("harness.core")


class EarlyExitReason(enum.Enum):
    INVALID_HP = "EXITED_REASON_INVALID_HP"
    USER_REQUESTED_STOP = "EXITED_REASON_USER_REQUESTED_STOP"
    UNSPECIFIED = "EXITED_REASON_UNSPECIFIED"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


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
        body: dict[str, Any] = {"avgMetrics": to_json_metrics(metrics)}
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
        """Wait until every metric reported so far was accepted by the master."""
        return self._shipper.flush(timeout_s)

    def get_tensorboard_path(self) -> None:
        return None

    def upload_tensorboard_files(self, *_: Any, **__: Any) -> None:
        logger.debug("tensorboard upload is not supported; ignored")


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
