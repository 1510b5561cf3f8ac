"""What the API answers: one typed shape per JSON response, Determined's field names where it has the route.

Each route names its answer with ``response_model=``: the OpenAPI document then says what every 2xx holds
(no free-form object at the top), FastAPI checks each answer against it and writes it with pydantic's
serializer. The shapes are ``TypedDict``s that refuse keys they do not name (``extra="forbid"``): a
converter that grows a field without its shape fails the suite (a 500 naming the field) rather than
sending it undocumented. Validating a dict against a ``TypedDict`` builds no objects, and the serializer
writes the JSON in Rust, where ``jsonable_encoder`` walked it in Python first (``bench/typed_responses.py``).

The objects themselves (an experiment, a trial, a checkpoint, ...) are Determined's ``v1Experiment``,
``v1Trial``, ``v1Checkpoint`` ...; what Determined has no field for is marked "ours". What a user wrote
(configs, hyperparameters, metrics, metadata) stays a free-form mapping. Checkpoints and the model registry
are in ``responses_checkpoints``, tasks in ``responses_tasks``, the web UI's own answers and the streams'
lines in ``responses_ui``.
"""

from __future__ import annotations

from typing import Any, NotRequired

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

STRICT = ConfigDict(extra="forbid")
Number = int | float
"""A value reported by a user's code: kept as it came (an int is not turned into a float)."""
Mapping = dict[str, Any]
"""What a user wrote, as they wrote it: a config, hyperparameters, metrics, metadata."""


@with_config(STRICT)
class ApiError(TypedDict):
    """Every error's answer: a machine-readable ``code`` (``not_found``, ``invalid_argument``, ...), a
    ``message`` for people, and the request ``field`` it is about, when there is one."""

    code: str
    message: str
    field: NotRequired[str | None]


ERRORS: dict[int | str, dict[str, Any]] = {
    "default": {"model": ApiError, "description": "an error: its code, its message and the field it names"}
}
"""Every router's error answer, in the OpenAPI document (instead of FastAPI's ``HTTPValidationError``,
which this master never sends: its 422s are ``ApiError``s too)."""


@with_config(STRICT)
class Empty(TypedDict):
    """An action's answer with nothing in it (Determined's ``v1PauseExperimentResponse`` and the like)."""


@with_config(STRICT)
class Pagination(TypedDict):
    offset: int
    limit: int
    startIndex: int
    endIndex: int
    total: int


# ---------------------------------------------------------------- users and the master


@with_config(STRICT)
class AgentUserGroup(TypedDict):
    agentUser: str


@with_config(STRICT)
class User(TypedDict):
    id: int
    username: str
    admin: bool
    active: bool
    displayName: str
    unixUsername: str  # ours: the Unix account its jobs run as
    agentUserGroup: AgentUserGroup
    modifiedAt: str | None


@with_config(STRICT)
class UserAnswer(TypedDict):
    user: User


@with_config(STRICT)
class Users(TypedDict):
    users: list[User]
    pagination: Pagination


@with_config(STRICT)
class MungeNonce(TypedDict):
    nonce: str
    masterUid: int


@with_config(STRICT)
class Login(TypedDict):
    user: User
    token: NotRequired[str]  # absent for a browser, which gets the session as a cookie
    csrfToken: NotRequired[str]  # ours: a browser's, sent back in a header


@with_config(STRICT)
class Session(TypedDict):
    """Ours (the web UI): who is signed in, and whether this master asks for passwords."""

    user: User
    passwordsRequired: bool
    csrfToken: str | None
    """The X-CSRF-Token value of a cookie session (None for a bearer token)."""


@with_config(STRICT)
class MasterInfo(TypedDict):
    version: str
    masterId: str
    clusterId: str
    clusterName: str
    externalUrl: str
    loginMethods: list[str]  # ours: password, ldap, munge
    telemetryEnabled: bool
    rbacEnabled: bool
    userManagementEnabled: bool
    strictJobQueueControl: bool
    hasCustomLogo: bool


@with_config(STRICT)
class Telemetry(TypedDict):
    enabled: bool


@with_config(STRICT)
class Info(TypedDict):
    """Determined's unauthenticated ``GET /info`` (snake_case there, as Determined has it)."""

    version: str
    hpcDetVersion: str  # ours
    master_id: str
    cluster_id: str
    cluster_name: str
    telemetry: Telemetry
    rbacEnabled: bool
    userManagementEnabled: bool
    strictJobQueueControl: bool


@with_config(STRICT)
class MasterConfigAnswer(TypedDict):
    config: Mapping


# ---------------------------------------------------------------- experiments


@with_config(STRICT)
class Experiment(TypedDict):
    id: int
    name: str
    description: str
    labels: list[str]
    state: str
    archived: bool
    startTime: str | None
    endTime: str | None
    userId: int
    username: str
    displayName: str
    resourcePool: str
    searcherType: str
    searcherMetric: str
    progress: float | None
    forkedFrom: int | None
    projectId: int
    projectOwnerId: int
    workspaceId: int
    workspaceName: str
    projectName: str
    parentArchived: bool
    notes: str
    jobId: str
    trialIds: NotRequired[list[int]]
    numTrials: NotRequired[int]
    config: NotRequired[Mapping]
    originalConfig: NotRequired[str]
    checkpointSize: NotRequired[int]
    checkpointCount: NotRequired[int]
    deletedCheckpointSize: NotRequired[int]  # ours
    deletedCheckpointCount: NotRequired[int]  # ours


@with_config(STRICT)
class UnsavedExperiment(TypedDict):
    """A validate-only create's experiment: every field at its zero value."""

    id: int
    name: str
    description: str
    labels: list[str]
    state: str
    archived: bool
    startTime: str
    numTrials: int
    trialIds: list[int]
    username: str
    userId: int
    resourcePool: str
    searcherType: str
    searcherMetric: str
    config: Mapping
    originalConfig: str
    projectId: int
    projectOwnerId: int
    workspaceId: int
    jobId: str
    notes: str
    progress: float
    parentArchived: bool


@with_config(STRICT)
class Message(TypedDict):
    message: str


@with_config(STRICT)
class CreatedExperiment(TypedDict):
    experiment: Experiment | UnsavedExperiment
    config: Mapping
    warnings: list[str]  # Determined's LaunchWarning values: none of ours
    configWarnings: list[Message]  # ours: the parts of the config Slurm ignores


@with_config(STRICT)
class ExperimentAnswer(TypedDict):
    experiment: Experiment


@with_config(STRICT)
class ExperimentDetail(TypedDict):
    experiment: Experiment
    jobSummary: Mapping | None
    trialCounts: dict[str, int]  # ours: trials per state


@with_config(STRICT)
class Experiments(TypedDict):
    experiments: list[Experiment]
    pagination: Pagination


@with_config(STRICT)
class Labels(TypedDict):
    labels: list[str]


@with_config(STRICT)
class ModelDef(TypedDict):
    b64Tgz: str


@with_config(STRICT)
class FileNode(TypedDict):
    path: str
    name: str
    isDir: bool
    contentType: str
    contentLength: int
    modifiedTime: str
    files: NotRequired[list[FileNode]]  # a directory's entries


@with_config(STRICT)
class FileTree(TypedDict):
    files: list[FileNode]


@with_config(STRICT)
class FileContent(TypedDict):
    file: str


@with_config(STRICT)
class BestMetric(TypedDict):
    metric: float | None


# ---------------------------------------------------------------- trials and their metrics


@with_config(STRICT)
class Run(TypedDict):
    """Ours: one Slurm job of a trial (a trial runs again after a pause, a preemption or a failure)."""

    id: int
    trialRunId: int
    slurmJobId: str | None
    nodeList: str | None
    state: str
    exitReason: str | None
    exitMessage: str | None
    runnerState: str | None
    submitTime: str | None
    startTime: str | None
    endTime: str | None
    pendingReason: str | None
    pendingSince: str | None
    pendingClass: str | None  # limit, resources, priority, held, dependency, other (slurm_backend.pending)
    stuck: bool  # it will not start until someone acts (held, a partition down, ...)
    jobsAhead: int | None  # pending jobs Slurm considers first (blank under PrivateData=jobs)
    waitingIn: str | None


@with_config(STRICT)
class Trial(TypedDict):
    id: int
    experimentId: int
    requestId: str
    state: str
    restarts: int
    hparams: Mapping
    seed: int
    proposal: str | None  # ours: random | model | grid | given
    totalBatchesProcessed: int
    stepsCompleted: int
    latestCheckpointUuid: str | None
    searcherMetricValue: float | None
    bestValidationMetric: float | None
    progress: float | None
    runId: int
    exitMessage: str | None
    startTime: str | None
    endTime: str | None
    runs: NotRequired[list[Run]]  # ours
    runnerState: NotRequired[str | None]
    totalCheckpointSize: NotRequired[int]
    checkpointCount: NotRequired[int]
    deletedCheckpointSize: NotRequired[int]  # ours
    deletedCheckpointCount: NotRequired[int]  # ours


@with_config(STRICT)
class TrialAnswer(TypedDict):
    trial: Trial


@with_config(STRICT)
class Trials(TypedDict):
    trials: list[Trial]
    pagination: Pagination


@with_config(STRICT)
class MetricReport(TypedDict):
    """Ours: one stored report (``GET /trials/{id}/metrics`` and its per-group forms)."""

    id: int
    trialId: int
    trialRunId: int
    stepsCompleted: int
    group: str
    metrics: Any
    reportTime: str | None


@with_config(STRICT)
class MetricReports(TypedDict):
    metrics: list[MetricReport]


@with_config(STRICT)
class WorkloadMetrics(TypedDict):
    avgMetrics: Mapping
    batchMetrics: NotRequired[Any]


@with_config(STRICT)
class MetricsWorkload(TypedDict):
    metrics: WorkloadMetrics
    numInputs: int
    totalBatches: int
    endTime: str | None


@with_config(STRICT)
class CheckpointWorkload(TypedDict):
    uuid: str
    state: str
    totalBatches: int
    endTime: str | None
    resources: Mapping
    metadata: Mapping


@with_config(STRICT)
class Workload(TypedDict, total=False):
    """Determined's ``WorkloadContainer``: one of the three."""

    training: MetricsWorkload
    validation: MetricsWorkload
    checkpoint: CheckpointWorkload


@with_config(STRICT)
class Workloads(TypedDict):
    workloads: list[Workload]
    pagination: Pagination


@with_config(STRICT)
class BatchAccepted(TypedDict):
    """Ours: a metrics batch's reports stored, and those already stored (a retried batch)."""

    accepted: int
    duplicates: int


@with_config(STRICT)
class Preemption(TypedDict):
    preempt: bool


@with_config(STRICT)
class ValidateAfter(TypedDict):
    length: int


@with_config(STRICT)
class SearcherOp(TypedDict):
    validateAfter: ValidateAfter


@with_config(STRICT)
class SearcherOperation(TypedDict):
    op: SearcherOp | None
    completed: bool
    pending: NotRequired[bool]  # ours: no answer yet (a long poll that ran out)


@with_config(STRICT)
class CompletedOperation(TypedDict):
    next: NotRequired[SearcherOperation]  # ours: the next operation, saving the harness a call


# ---------------------------------------------------------------- workspaces and projects


@with_config(STRICT)
class Workspace(TypedDict):
    id: int
    name: str
    archived: bool
    username: str
    userId: int
    immutable: bool
    numProjects: int
    numExperiments: int
    pinned: bool
    state: str
    errorMessage: str


@with_config(STRICT)
class Project(TypedDict):
    id: int
    name: str
    key: str
    description: str
    workspaceId: int
    workspaceName: str
    archived: bool
    immutable: bool
    notes: list[Mapping]
    numExperiments: int
    numActiveExperiments: int
    numRuns: int
    username: str
    userId: int
    state: str
    errorMessage: str


@with_config(STRICT)
class WorkspaceAnswer(TypedDict):
    workspace: Workspace


@with_config(STRICT)
class Workspaces(TypedDict):
    workspaces: list[Workspace]
    pagination: Pagination


@with_config(STRICT)
class ProjectAnswer(TypedDict):
    project: Project


@with_config(STRICT)
class Projects(TypedDict):
    projects: list[Project]
    pagination: Pagination


@with_config(STRICT)
class UsageEntry(TypedDict):
    """Determined's ``ResourceAllocationRawEntry``, and ours after ``slots``."""

    kind: str
    startTime: str
    endTime: str
    experimentId: int
    username: str
    userId: int
    labels: list[str]
    seconds: float
    slots: int
    slotSeconds: float
    trialId: int
    trialRunId: int
    slurmJobId: str
    resourcePool: str
    workspace: str
    slurmAccount: str


@with_config(STRICT)
class UsageRaw(TypedDict):
    resourceEntries: list[UsageEntry]


@with_config(STRICT)
class UsagePeriod(TypedDict):
    """Determined's ``ResourceAllocationAggregatedEntry`` (slot-seconds), with ``byWorkspace`` and
    ``bySlurmAccount`` of ours."""

    periodStart: str
    period: str
    seconds: float
    byUsername: dict[str, float]
    byExperimentLabel: dict[str, float]
    byResourcePool: dict[str, float]
    byWorkspace: dict[str, float]
    bySlurmAccount: dict[str, float]


@with_config(STRICT)
class UsageAggregated(TypedDict):
    resourceEntries: list[UsagePeriod]


@with_config(STRICT)
class AuditEvent(TypedDict):
    id: int
    time: str
    actorId: int | None
    actor: str
    action: str
    target: str
    owner: str | None
    asUnix: str | None
    detail: dict[str, Any] | None


@with_config(STRICT)
class AuditEvents(TypedDict):
    events: list[AuditEvent]


@with_config(STRICT)
class Health(TypedDict):
    """``GET /health``: ``ok`` or ``unhealthy`` (HTTP 503) with what is wrong."""

    status: str
    problems: list[str]
    lastTickAgeSeconds: float | None
