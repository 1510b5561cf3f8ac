"""What the web UI's routes and the streams answer (``responses`` has the rest).

A stream (the logs, Determined's metrics streams, the UI's change streams) answers newline-delimited JSON,
one ``{"result": ...}`` per line: its route names the line's shape with ``response_model`` and
``response_class=NdjsonStream``, so the OpenAPI document gives each line's schema under
``application/x-ndjson`` (``ndjson``). A stream's lines are written as they come, not checked one by one.
"""

from __future__ import annotations

from typing import Any

from pydantic import with_config
from starlette.responses import JSONResponse
from typing_extensions import TypedDict

from hpc_master.api.responses import (
    STRICT,
    Experiment,
    Mapping,
    Number,
    Pagination,
    Run,
    Trial,
)
from hpc_master.api.streams import NDJSON


class NdjsonStream(JSONResponse):
    """What a streaming route names as its response class, for the OpenAPI document only: its answers'
    media type, ``application/x-ndjson``, with the schema of one line. FastAPI documents the schema of a
    route's ``response_model`` for a JSON response class only; the route itself returns its own streaming
    response (``api.streams.open_stream``), so this class never answers anything."""

    media_type = NDJSON


# ---------------------------------------------------------------- pages


@with_config(STRICT)
class UiExperiment(Experiment):
    bestSearcherMetric: float | None
    canModify: bool


@with_config(STRICT)
class UiExperiments(TypedDict):
    experiments: list[UiExperiment]
    pagination: Pagination


@with_config(STRICT)
class LatestValidation(TypedDict):
    stepsCompleted: int
    metrics: Mapping


@with_config(STRICT)
class UiTrial(Trial):
    currentRun: Run | None
    runLive: bool
    latestValidation: LatestValidation | None


@with_config(STRICT)
class UiTrials(TypedDict):
    trials: list[UiTrial]


@with_config(STRICT)
class Bracket(TypedDict):
    index: int
    rungs: list[Mapping]


@with_config(STRICT)
class Rungs(TypedDict):
    searcherType: str
    promotion: str
    brackets: list[Bracket]


@with_config(STRICT)
class Vocabulary(TypedDict):
    """Ours: the master's words and choices, so the UI re-types none of them."""

    experimentStates: list[str]
    trialStates: list[str]
    runStates: list[str]
    experimentActions: dict[str, list[str]]
    """Per experiment state, the actions it allows: pause, activate, cancel, kill, archive."""
    terminationReasons: dict[str, str]
    """How a trial run ended, by reason (a run's exitReason), in words."""
    taskStates: list[str]
    liveTaskStates: list[str]
    """The task states that are not ended (the tasks page hides the others unless asked)."""
    taskActions: dict[str, list[str]]
    """Per task state, the actions it allows (kill)."""


@with_config(STRICT)
class Agent(TypedDict):
    """A Slurm node, in Determined's words (a GPU is a slot)."""

    id: str
    state: str
    reason: str
    enabled: bool
    resourcePools: list[str]
    gpuType: str
    numSlots: int
    slotsUsed: int
    slotsFree: int
    cpus: int
    cpusUsed: int
    memoryMb: int
    memoryUsedMb: int


@with_config(STRICT)
class ResourcePool(TypedDict):
    """A Slurm partition, in Determined's words."""

    name: str
    description: str
    type: str
    state: str
    defaultComputePool: bool
    numAgents: int
    agentIds: list[str]
    slotType: str
    slotsAvailable: int
    slotsUsed: int
    slotsFree: int
    maxTime: str
    priorityTier: int
    preemptMode: str


@with_config(STRICT)
class QueuedRun(Run):
    trialId: int
    experimentId: int
    experimentName: str
    owner: str


@with_config(STRICT)
class Cluster(TypedDict):
    resourcePools: list[ResourcePool]
    agents: list[Agent]
    fetchedAt: str
    error: str
    cacheSeconds: float
    queued: list[QueuedRun]


@with_config(STRICT)
class SeriesPoint(TypedDict):
    batches: int
    time: str | None
    values: Mapping


@with_config(STRICT)
class Series(TypedDict):
    group: str
    type: str
    data: list[SeriesPoint]


@with_config(STRICT)
class TrialSeries(TypedDict):
    trial: Trial
    metrics: list[Series]


@with_config(STRICT)
class TimeSeries(TypedDict):
    """Determined's ``CompareTrials``."""

    trials: list[TrialSeries]


# ---------------------------------------------------------------- stream lines


@with_config(STRICT)
class GroupNames(TypedDict):
    group: str
    metricNames: list[str]


@with_config(STRICT)
class MetricNames(TypedDict):
    searcherMetric: str
    trainingMetrics: list[str]
    validationMetrics: list[str]
    metricNames: list[GroupNames]


@with_config(STRICT)
class MetricNamesLine(TypedDict):
    result: MetricNames


@with_config(STRICT)
class SamplePoint(TypedDict):
    batches: int
    value: Number | None


@with_config(STRICT)
class SampledTrial(TypedDict):
    trialId: int
    hparams: Mapping
    data: list[SamplePoint]


@with_config(STRICT)
class TrialsSample(TypedDict):
    trials: list[SampledTrial]
    promotedTrials: list[int]
    demotedTrials: list[int]


@with_config(STRICT)
class TrialsSampleLine(TypedDict):
    result: TrialsSample


@with_config(STRICT)
class SnapshotTrial(TypedDict):
    trialId: int
    hparams: Mapping
    metric: Number | None
    batchesProcessed: int


@with_config(STRICT)
class TrialsSnapshot(TypedDict):
    trials: list[SnapshotTrial]


@with_config(STRICT)
class TrialsSnapshotLine(TypedDict):
    result: TrialsSnapshot


@with_config(STRICT)
class ChangesLine(TypedDict):
    """A page's digests by key (the first line: every key; later lines: those that changed)."""

    result: dict[str, str]


@with_config(STRICT)
class TrialLog(TypedDict):
    id: int
    trialId: int
    trialRunId: int
    rankId: int | None
    message: str
    log: str
    level: str
    timestamp: str
    stdtype: str
    source: str


@with_config(STRICT)
class TrialLogLine(TypedDict):
    result: TrialLog


@with_config(STRICT)
class TaskLog(TypedDict):
    id: str
    taskId: str
    allocationId: str
    message: str
    log: str
    level: str
    timestamp: str
    stdtype: str
    source: str
    rankId: int | None


@with_config(STRICT)
class TaskLogLine(TypedDict):
    result: TaskLog


@with_config(STRICT)
class MasterLogEntry(TypedDict):
    id: int
    level: str
    message: str
    timestamp: str


@with_config(STRICT)
class MasterLog(TypedDict):
    logEntry: MasterLogEntry


@with_config(STRICT)
class MasterLogLine(TypedDict):
    result: MasterLog


@with_config(STRICT)
class MetricsReport(TypedDict):
    """Determined's ``v1MetricsReport``."""

    id: int
    trialId: int
    trialRunId: int
    totalBatches: int
    endTime: str
    metrics: Mapping
    group: str
    archived: bool


@with_config(STRICT)
class MetricsPage(TypedDict):
    metrics: list[MetricsReport]


@with_config(STRICT)
class MetricsPageLine(TypedDict):
    result: MetricsPage


def ndjson(line: type[Any]) -> dict[str, Any]:
    """A streaming route's decorator arguments: its lines' shape, under ``application/x-ndjson``."""
    return {"response_class": NdjsonStream, "response_model": line}


def errors_as_json(document: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI `document` with a stream's errors documented as what they are, JSON (FastAPI puts every
    response of a route under the route's media type)."""
    for item in document.get("paths", {}).values():
        for operation in item.values():
            answers = operation.get("responses", {})
            content = answers.get("default", {}).get("content", {})
            if NDJSON in content and NDJSON in answers.get("200", {}).get("content", {}):
                content["application/json"] = content.pop(NDJSON)
    return document
