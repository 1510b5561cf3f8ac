"""Determined's metric streams for trials, which its SDK reads and hpc-det's ``det`` does not (paths, parameters
and answers are Determined's, ``determined/common/api/bindings.py``; ``docs/determined-client.md``):

- ``GET /api/v1/trials/metrics/trial_metrics?trialIds=..&group=..`` (``GetMetrics``: ``Trial.iter_metrics(group)``,
  ``client.iter_trials_metrics``);
- ``GET /api/v1/trials/metrics/training_metrics?trialIds=..`` and ``/validation_metrics`` (``GetTrainingMetrics``,
  ``GetValidationMetrics``: the SDK's older ``stream_training_metrics`` / ``stream_validation_metrics``).

Each answers newline-delimited JSON, ``{"result": {"metrics": [v1MetricsReport, ...]}}`` per page of up to
``PAGE_SIZE`` reports, trial by trial in id order, each trial's reports by steps, and ends: as Determined's
master does, these streams do not follow a running trial. Only the trials' owners and admins may read them
(every trial is checked before the stream starts, so a refusal is a plain 403 or 404). Each is one of the
caller's streams while it is sent (``api.streams``), its pages read in the stream threads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from hpc_master.api import convert, responses_ui
from hpc_master.api.bounds import Id
from hpc_master.api.deps import State, UserPrincipal
from hpc_master.api.streams import open_stream, stream_threads
from hpc_master.db.models import ExperimentModel, MetricModel, TrialModel
from hpc_master.errors import ClientError
from hpc_master.services import access
from hpc_master.services import metrics as metric_svc
from hpc_master.services.common import get_or_404

router = APIRouter(prefix="/api/v1", tags=["determined-compat"])

PAGE_SIZE = 1000
"""Reports per streamed message (Determined's master sends pages of 1,000)."""
MAX_TRIAL_IDS = 1000
TrialIds = Annotated[list[Id], Query(alias="trialIds", max_length=MAX_TRIAL_IDS)]
Group = Annotated[str, Query(min_length=1, max_length=64)]  # metrics.group is a String(64)
_SUB_MILLISECONDS = re.compile(r"(\.\d{3})\d*(?=Z$)")


def metrics_report_to_api(row: MetricModel) -> dict[str, Any]:
    """Determined's ``v1MetricsReport``. Its ``metrics`` are keyed as Determined stores them: a validation's
    under ``validation_metrics``, any other group's under ``avg_metrics`` (with ``batch_metrics`` when
    reported), which is where its SDK's ``TrialMetrics`` looks for them."""
    stored = convert.metrics_to_api(row.metrics if isinstance(row.metrics, dict) else {}) or {}
    avg = stored.get("avgMetrics", {})
    metrics: dict[str, Any]
    if row.group == "validation":
        metrics = {"validation_metrics": avg}
    else:
        metrics = {"avg_metrics": avg}
        if stored.get("batchMetrics") is not None:
            metrics["batch_metrics"] = stored["batchMetrics"]
    end_time = convert.iso(row.report_time) or ""
    return {
        "id": row.id,
        "trialId": row.trial_id,
        "trialRunId": row.trial_run_id,
        "totalBatches": row.steps_completed,
        # Milliseconds, as Determined's master sends (older Pythons' parsers take no more).
        "endTime": _SUB_MILLISECONDS.sub(r"\1", end_time),
        "metrics": metrics,
        "group": row.group,
        "archived": False,
    }


def _readable_trials(state: State, principal: UserPrincipal, trial_ids: list[int]) -> list[int]:
    """The ids in order, after checking each exists and is the principal's (or the principal is an admin)."""
    if not trial_ids:
        raise ClientError("must specify at least one trialId", field="trialIds")
    if len(set(trial_ids)) != len(trial_ids):
        duplicate = next(i for i in trial_ids if trial_ids.count(i) > 1)
        raise ClientError(f"duplicate id={duplicate} specified", field="trialIds")
    with state.tx() as session:
        for trial_id in trial_ids:
            trial = get_or_404(session, TrialModel, trial_id, "trial")
            experiment = get_or_404(session, ExperimentModel, trial.experiment_id, "experiment")
            access.experiment_private(principal, experiment)
    return sorted(trial_ids)


def _stream(state: State, principal: UserPrincipal, trial_ids: list[int], group: str) -> StreamingResponse:
    def pages() -> Iterator[bytes]:  # each page read in the stream threads, not the routes' pool
        for trial_id in trial_ids:
            after: tuple[int, int] | None = None
            while True:
                with state.tx() as session:
                    rows = metric_svc.metrics_page(session, trial_id, group, after=after, limit=PAGE_SIZE)
                    page = [metrics_report_to_api(row) for row in rows]
                if page:
                    yield (json.dumps({"result": {"metrics": page}}) + "\n").encode()
                    after = (int(page[-1]["totalBatches"]), int(page[-1]["id"]))
                if len(page) < PAGE_SIZE:
                    break

    return open_stream(state.streams, principal, stream_threads.iterate(pages()))


@router.get(
    "/trials/metrics/trial_metrics",
    **responses_ui.ndjson(responses_ui.MetricsPageLine),
)
def trial_metrics(
    state: State,
    principal: UserPrincipal,
    group: Group,
    trial_ids: TrialIds = [],  # noqa: B006
) -> StreamingResponse:
    """Determined's ``GetMetrics``: the trials' reports of one group (``training``, ``validation``, or any
    group the trials reported)."""
    return _stream(state, principal, _readable_trials(state, principal, trial_ids), group)


@router.get(
    "/trials/metrics/training_metrics",
    **responses_ui.ndjson(responses_ui.MetricsPageLine),
)
def training_metrics(
    state: State,
    principal: UserPrincipal,
    trial_ids: TrialIds = [],  # noqa: B006
) -> StreamingResponse:
    return _stream(state, principal, _readable_trials(state, principal, trial_ids), "training")


@router.get(
    "/trials/metrics/validation_metrics",
    **responses_ui.ndjson(responses_ui.MetricsPageLine),
)
def validation_metrics(
    state: State,
    principal: UserPrincipal,
    trial_ids: TrialIds = [],  # noqa: B006
) -> StreamingResponse:
    return _stream(state, principal, _readable_trials(state, principal, trial_ids), "validation")
