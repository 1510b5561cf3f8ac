"""What the checkpoint and model registry routes answer (``responses`` has the rest): Determined's
``v1Checkpoint``, ``v1Model`` and ``v1ModelVersion``, and the garbage collection's preview."""

from __future__ import annotations

from typing import Any, NotRequired

from pydantic import with_config
from typing_extensions import TypedDict

from hpc_master.api.responses import STRICT, Mapping, Pagination

# ---------------------------------------------------------------- checkpoints


@with_config(STRICT)
class Deletion(TypedDict):
    """Ours: a wanted deletion that is not done, why, and when it is tried again."""

    error: str | None
    attempts: int
    retryAt: str | None


@with_config(STRICT)
class CheckpointMetrics(TypedDict):
    avgMetrics: Mapping
    batchMetrics: NotRequired[Any]


@with_config(STRICT)
class CheckpointTraining(TypedDict):
    trialId: int
    trialRunId: int
    experimentId: int
    hparams: Mapping
    experimentConfig: Mapping
    validationMetrics: CheckpointMetrics | None
    searcherMetric: float | None


@with_config(STRICT)
class Checkpoint(TypedDict):
    uuid: str
    taskId: str
    allocationId: str
    reportTime: str | None
    resources: Mapping
    metadata: Mapping
    state: str
    stepsCompleted: int
    size: int  # ours: bytes
    deletion: NotRequired[Deletion]
    training: CheckpointTraining


@with_config(STRICT)
class CheckpointAnswer(TypedDict):
    checkpoint: Checkpoint


@with_config(STRICT)
class Checkpoints(TypedDict):
    checkpoints: list[Checkpoint]
    pagination: Pagination


@with_config(STRICT)
class DeleteFailure(TypedDict):
    uuid: str
    error: str


@with_config(STRICT)
class DeletedCheckpoints(TypedDict):
    failed: NotRequired[list[DeleteFailure]]  # ours: deletions that failed, retried later


@with_config(STRICT)
class PreviewedCheckpoint(TypedDict):
    """Determined's ``CheckpointByUUIDs`` row (its CLI's ``det e set gc-policy`` reads these keys)."""

    UUID: str
    TrialID: int
    StepsCompleted: int
    State: str
    ReportTime: str | None
    Resources: Mapping
    Metadata: Mapping
    ValidationMetrics: Mapping | None
    SearcherMetric: float | None
    Size: int


@with_config(STRICT)
class GCPolicy(TypedDict):
    save_experiment_best: int
    save_trial_best: int
    save_trial_latest: int


@with_config(STRICT)
class PreviewGC(TypedDict):
    checkpoints: list[PreviewedCheckpoint]
    metric_name: str
    policy: GCPolicy


# ---------------------------------------------------------------- the model registry


@with_config(STRICT)
class Model(TypedDict):
    id: int
    name: str
    description: str
    metadata: Mapping
    creationTime: str | None
    lastUpdatedTime: str | None
    numVersions: int
    labels: list[str]
    username: str
    userId: int
    archived: bool
    notes: str
    workspaceId: int


@with_config(STRICT)
class ModelVersion(TypedDict):
    id: int
    model: Model
    checkpoint: Checkpoint
    version: int
    creationTime: str | None
    lastUpdatedTime: str | None
    name: str
    comment: str
    notes: str
    metadata: Mapping
    labels: list[str]
    username: str
    userId: int


@with_config(STRICT)
class ModelAnswer(TypedDict):
    model: Model


@with_config(STRICT)
class Models(TypedDict):
    models: list[Model]
    pagination: Pagination


@with_config(STRICT)
class ModelVersionAnswer(TypedDict):
    modelVersion: ModelVersion


@with_config(STRICT)
class ModelVersions(TypedDict):
    model: Model
    modelVersions: list[ModelVersion]
    pagination: Pagination
