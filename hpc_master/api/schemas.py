"""Request bodies (camelCase on the wire, as Determined's ``/api/v1``). Responses come from ``convert``."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class LoginRequest(ApiModel):
    username: str
    password: str = ""


class NewUser(ApiModel):
    username: str
    admin: bool = False
    active: bool = True
    display_name: str | None = None
    unix_username: str | None = None
    agent_user_group: dict[str, Any] | None = None


class PostUserRequest(ApiModel):
    user: NewUser
    password: str = ""


class PatchUserRequest(ApiModel):
    password: str | None = None
    active: bool | None = None
    admin: bool | None = None
    display_name: str | None = None
    unix_username: str | None = None
    agent_user_group: dict[str, Any] | None = None


class ModelDefinitionFile(ApiModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    path: str
    type: int = 48
    content: str = ""
    mode: int | None = None
    mtime: int | None = None


class CreateExperimentRequest(ApiModel):
    config: str
    model_definition: list[ModelDefinitionFile] = Field(default_factory=list)
    activate: bool = True
    parent_id: int | None = None
    validate_only: bool = False
    project_id: int | None = None


class MetricItem(ApiModel):
    trial_run_id: int = Field(ge=0)
    steps_completed: int = Field(ge=0)
    group: str = Field(default="training", min_length=1, max_length=64)
    metrics: dict[str, Any]
    report_time: dt.datetime | None = None


MAX_BATCH_ROWS = 10_000


class MetricsBatchRequest(ApiModel):
    metrics: list[MetricItem] = Field(max_length=MAX_BATCH_ROWS)


class ReportMetricsRequest(ApiModel):
    metrics: MetricItem
    group: str | None = None


class CheckpointBody(ApiModel):
    uuid: str = Field(min_length=1, max_length=64)
    trial_id: int
    trial_run_id: int = 0
    report_time: dt.datetime | None = None
    resources: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    state: str = "COMPLETED"


class ReportCheckpointRequest(ApiModel):
    checkpoint: CheckpointBody


class ProgressRequest(ApiModel):
    progress: float


class RunnerMetadata(ApiModel):
    state: str = ""


class RunnerMetadataRequest(ApiModel):
    metadata: RunnerMetadata


class EarlyExit(ApiModel):
    reason: str = "EXITED_REASON_UNSPECIFIED"


class EarlyExitRequest(ApiModel):
    early_exit: EarlyExit


class ValidateAfter(ApiModel):
    length: int


class SearcherOp(ApiModel):
    validate_after: ValidateAfter


class CompletedOperationRequest(ApiModel):
    op: SearcherOp
    searcher_metric: float | None = None


class DeleteCheckpointsRequest(ApiModel):
    checkpoint_uuids: list[str]
