"""Request bodies (camelCase on the wire, as Determined's ``/api/v1``). Responses come from ``convert``."""

from __future__ import annotations

import datetime as dt
import json
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from hpc_master.api.bounds import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    Count32,
    Count64,
    Fraction,
    Id,
    Int32,
    Int64,
    OptionalId,
)
from hpc_master.ingest.plain import MAX_BATCH_ROWS
from hpc_master.services.checkpoints.records import check_checkpoint_uuid


class ApiModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class MungeLoginRequest(ApiModel):
    credential: str = Field(max_length=8192)
    """A munge credential (``MUNGE:…``) of ``{"nonce", "url"}``, restricted to the master's uid."""


class LoginRequest(ApiModel):
    username: str = Field(max_length=128)
    password: str = Field(default="", max_length=1024)
    owner_key: str | None = Field(default=None, max_length=256)
    """A personal master's owner key (``hpc_master.owner_key``): required with a blank password."""
    is_hashed: bool = False
    """The password is Determined's client-side hash of it (Determined's own CLI and SDK send that)."""


def _check_agent_user_group(group: dict[str, Any]) -> dict[str, Any]:
    """Determined's ``{agentUser, agentUid, agentGroup, agentGid}``: ``agentUser`` becomes the unix username."""
    user = group.get("agentUser")
    if user is not None and not (isinstance(user, str) and len(user) <= 128):
        raise ValueError("agentUser must be a string of at most 128 characters")
    for key in ("agentUid", "agentGid"):
        value = group.get(key)
        if value is not None and not (type(value) is int and INT32_MIN <= value <= INT32_MAX):
            raise ValueError(f"{key} must be a 32-bit integer")
    return group


AgentUserGroup = Annotated[dict[str, Any], AfterValidator(_check_agent_user_group)]


class NewUser(ApiModel):
    username: str
    admin: bool = False
    active: bool = True
    display_name: str | None = Field(default=None, max_length=256)
    unix_username: str | None = Field(default=None, max_length=128)
    agent_user_group: AgentUserGroup | None = None


class PostUserRequest(ApiModel):
    user: NewUser
    password: str | None = Field(default="", max_length=1024)
    is_hashed: bool = False


class PatchUserRequest(ApiModel):
    username: str | None = Field(default=None, max_length=128)
    """Determined's rename: not supported here (a user's name is their login and their jobs' records); the
    same name is accepted, another is an error."""
    password: str | None = Field(default=None, max_length=1024)
    is_hashed: bool = False
    active: bool | None = None
    admin: bool | None = None
    display_name: str | None = Field(default=None, max_length=256)
    unix_username: str | None = Field(default=None, max_length=128)
    agent_user_group: AgentUserGroup | None = None


class ModelDefinitionFile(ApiModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    path: str
    type: Int32 = 48
    content: str = ""
    mode: Int32 | None = None
    mtime: Int64 | None = None


class CreateExperimentRequest(ApiModel):
    config: str
    model_definition: list[ModelDefinitionFile] = Field(default_factory=list)
    activate: bool = True
    parent_id: OptionalId | None = None
    validate_only: bool = False
    project_id: OptionalId | None = None
    template: str | None = Field(default=None, max_length=256)
    """Determined's config template (``--template``): this master has none, and says so."""


class MetricItem(ApiModel):
    trial_run_id: Count32
    steps_completed: Count64
    group: str = Field(default="training", min_length=1, max_length=64)
    metrics: dict[str, Any]
    report_time: dt.datetime | None = None


class MetricsBatchRequest(ApiModel):
    metrics: list[MetricItem] = Field(max_length=MAX_BATCH_ROWS)


class ReportMetricsRequest(ApiModel):
    metrics: MetricItem
    group: str | None = None


CheckpointUuid = Annotated[str, AfterValidator(check_checkpoint_uuid)]


def _steps_in_range(metadata: dict[str, Any]) -> dict[str, Any]:
    """``metadata.steps_completed`` is stored in a 64-bit column."""
    steps = metadata.get("steps_completed")
    if isinstance(steps, int) and not isinstance(steps, bool) and not 0 <= steps <= INT64_MAX:
        raise ValueError(f"steps_completed must be between 0 and {INT64_MAX}")
    return metadata


class CheckpointBody(ApiModel):
    uuid: CheckpointUuid
    trial_id: Id
    trial_run_id: Count32 = 0
    report_time: dt.datetime | None = None
    resources: dict[str, Any] = Field(default_factory=dict)
    metadata: Annotated[dict[str, Any], AfterValidator(_steps_in_range)] = Field(default_factory=dict)
    state: str = "COMPLETED"


class ReportCheckpointRequest(ApiModel):
    checkpoint: CheckpointBody


class ProgressRequest(ApiModel):
    progress: Fraction


class RunnerMetadata(ApiModel):
    state: str = ""


class RunnerMetadataRequest(ApiModel):
    metadata: RunnerMetadata


class EarlyExit(ApiModel):
    reason: str = "EXITED_REASON_UNSPECIFIED"


class EarlyExitRequest(ApiModel):
    early_exit: EarlyExit


class ValidateAfter(ApiModel):
    length: Count64


class SearcherOp(ApiModel):
    validate_after: ValidateAfter


class CompletedOperationRequest(ApiModel):
    op: SearcherOp
    searcher_metric: float | None = None
    """NaN and infinities are taken (a diverged run's loss): the searcher ranks NaN last."""


class DeleteCheckpointsRequest(ApiModel):
    checkpoint_uuids: list[CheckpointUuid] = Field(max_length=10_000)


class PatchCheckpointStorage(ApiModel):
    """Determined's ``PatchExperiment.PatchCheckpointStorage``; a field left out keeps its value."""

    save_experiment_best: Count32 | None = None
    save_trial_best: Count32 | None = None
    save_trial_latest: Count32 | None = None


# ---------------------------------------------------------------- the model registry (Determined's fields)

MAX_METADATA_BYTES = 64 * 1024
"""A model's or version's metadata, as compact JSON."""
MAX_METADATA_DEPTH = 32
MAX_LABELS = 100


def _bounded_metadata(value: dict[str, Any]) -> dict[str, Any]:
    """At most `MAX_METADATA_DEPTH` levels deep and `MAX_METADATA_BYTES` as JSON (UTF-8), finite numbers and
    valid Unicode only (a lone surrogate could be stored, and then never answered)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_METADATA_DEPTH:
            raise ValueError(f"metadata nests more than {MAX_METADATA_DEPTH} levels")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    try:
        size = len(json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode())
    except UnicodeEncodeError:
        raise ValueError("metadata text must be valid Unicode (no lone surrogates)") from None
    except ValueError:
        raise ValueError("metadata numbers must be finite (no NaN or Infinity)") from None
    if size > MAX_METADATA_BYTES:
        raise ValueError(f"metadata is {size} bytes as JSON; at most {MAX_METADATA_BYTES}")
    return value


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("text cannot contain NUL characters")
    return value


Metadata = Annotated[dict[str, Any], AfterValidator(_bounded_metadata)]
ModelName = Annotated[str, Field(min_length=1, max_length=256)]
"""Checked further by ``models_registry.check_model_name``."""
ShortText = Annotated[str, Field(max_length=256), AfterValidator(_no_nul)]
LongText = Annotated[str, Field(max_length=10_000), AfterValidator(_no_nul)]
Notes = Annotated[str, Field(max_length=100_000), AfterValidator(_no_nul)]
Label = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_no_nul)]
Labels = Annotated[list[Label], Field(max_length=MAX_LABELS)]


class PatchResources(ApiModel):
    """Determined's ``PatchExperiment.PatchResources``: stored in the config's ``resources`` (the bounds of
    ``expconf.resources``). A field sent as ``null`` goes back to its default (``det e set max-slots ID none``:
    no limit); a field left out keeps its value."""

    max_slots: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = None
    priority: Annotated[int, Field(ge=1, le=99)] | None = None
    weight: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] | None = None


class PatchExperimentRequest(ApiModel):
    """Determined's ``v1PatchExperiment``. hpc-det keeps no experiment notes: ``notes`` other than empty (what
    Determined's CLI sends back with every change it makes) is refused."""

    id: Id | None = None
    name: str | None = Field(default=None, min_length=1, max_length=512)
    description: str | None = Field(default=None, max_length=10_000)
    labels: Labels | None = None
    notes: str | None = Field(default=None, max_length=100_000)
    checkpoint_storage: PatchCheckpointStorage | None = None
    resources: PatchResources | None = None


class PostModelRequest(ApiModel):
    """Determined's ``v1PostModelRequest`` (``workspaceName``/``workspaceId``: only its default workspace).
    A ``null`` field is a field left out (Determined's client sends ``"metadata": null``)."""

    name: ModelName
    description: LongText | None = None
    metadata: Metadata | None = None
    labels: Labels | None = None
    notes: Notes | None = None
    workspace_name: ShortText | None = None
    workspace_id: OptionalId | None = None


class PatchModelRequest(ApiModel):
    """Determined's ``v1PatchModel`` (the body of ``PATCH /api/v1/models/{modelName}``); a field left out
    keeps its value, `metadata` and `labels` replace the old ones."""

    name: ModelName | None = None
    description: LongText | None = None
    metadata: Metadata | None = None
    labels: Labels | None = None
    notes: Notes | None = None
    workspace_name: ShortText | None = None
    """``det model move -w NAME``: only to the one workspace there is (anything else is an error)."""
    workspace_id: OptionalId | None = None


class PostModelVersionRequest(ApiModel):
    """Determined's ``v1PostModelVersionRequest`` (``modelName`` is the path's); ``null`` is left out."""

    model_name: str | None = Field(default=None, max_length=256)
    checkpoint_uuid: CheckpointUuid
    name: ShortText | None = None
    comment: LongText | None = None
    metadata: Metadata | None = None
    labels: Labels | None = None
    notes: Notes | None = None


class PatchModelVersionRequest(ApiModel):
    """Determined's ``v1PatchModelVersion`` less its ``checkpoint`` (a version keeps its checkpoint)."""

    name: ShortText | None = None
    comment: LongText | None = None
    metadata: Metadata | None = None
    labels: Labels | None = None
    notes: Notes | None = None
