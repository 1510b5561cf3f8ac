"""ORM rows. Names end in ``Model``; API schemas live in ``hpc_master.api.schemas``.

Every table a lifecycle step updates concurrently (experiments, trials, trial runs) has a ``version`` column:
writers that loaded a row, did something slow outside the session, and come back, update with
``WHERE version = :loaded`` (see :func:`hpc_master.services.common.guarded_update`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        if value is not None and dialect.name == "sqlite":
            return value.astimezone(dt.UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


class Base(DeclarativeBase):
    type_annotation_map = {  # noqa: RUF012
        dict[str, Any]: JSON,
        dt.datetime: UTCDateTime(),
    }


class UserModel(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    username: Mapped[str] = mapped_column(String(128), unique=True)
    password_hash: Mapped[str] = mapped_column(String(256), default="")
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    unix_username: Mapped[str | None] = mapped_column(String(128), nullable=True)
    display_name: Mapped[str | None] = mapped_column(String(256), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class SessionModel(Base):
    """A bearer token (stored as its SHA-256). ``trial_id`` set means a per-trial token for the harness."""

    __tablename__ = "sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    trial_id: Mapped[int | None] = mapped_column(
        ForeignKey("trials.id", ondelete="CASCADE"), nullable=True, index=True
    )
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[dt.datetime]


class ExperimentModel(Base):
    __tablename__ = "experiments"
    __table_args__ = {"sqlite_autoincrement": True}  # noqa: RUF012  # ids are never reused (migration 0008)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(512), default="")
    description: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[str] = mapped_column(String(32), index=True)
    config_text: Mapped[str] = mapped_column(Text)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    # Both deferred: loaded when read, not with every experiment row (listings, the loop's reads).
    searcher_snapshot: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True, deferred=True)
    """Grows with the trials (about 180 KB at 2,000)."""
    context_archive: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True, deferred=True)
    """gzip'd tar of the model definition (≤ 95 MB uncompressed)."""
    context_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    archived: Mapped[bool] = mapped_column(Boolean, default=False)
    progress: Mapped[float | None] = mapped_column(Float, nullable=True)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("experiments.id"), nullable=True)
    resource_pool: Mapped[str] = mapped_column(String(128), default="default")
    version: Mapped[int] = mapped_column(Integer, default=0)
    start_time: Mapped[dt.datetime] = mapped_column(default=utcnow)
    end_time: Mapped[dt.datetime | None] = mapped_column(nullable=True)

    __mapper_args__ = {"version_id_col": version}  # noqa: RUF012


class TrialModel(Base):
    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("experiment_id", "request_id"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    request_id: Mapped[str] = mapped_column(String(64))
    hparams: Mapped[dict[str, Any]] = mapped_column(JSON)
    proposal: Mapped[str | None] = mapped_column(String(16), nullable=True)
    """Where the hyperparameters came from: the searcher's ``Create.proposal`` (``random``, ``model``, ...)."""
    seed: Mapped[int] = mapped_column(BigInteger, default=0)
    state: Mapped[str] = mapped_column(String(32), index=True)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    run_id: Mapped[int] = mapped_column(Integer, default=0)
    """Number of the latest trial run (0 before the first job)."""
    latest_checkpoint: Mapped[str | None] = mapped_column(String(64), nullable=True)
    steps_completed: Mapped[int] = mapped_column(BigInteger, default=0)
    searcher_metric: Mapped[float | None] = mapped_column(Float, nullable=True)
    best_validation: Mapped[float | None] = mapped_column(Float, nullable=True)
    progress: Mapped[float | None] = mapped_column(Float, nullable=True)
    searcher_op_length: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """Length the searcher asked this trial to train to (``validateAfter``); null when no op is pending."""
    searcher_done: Mapped[bool] = mapped_column(Boolean, default=False)
    """The searcher has no more work for this trial (``completed`` in the harness answer)."""
    early_exit_reason: Mapped[str | None] = mapped_column(String(64), nullable=True)
    pause_reason: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """Why a PAUSED trial is paused (a TerminationReason): user pauses resume on activate, searcher ones not."""
    exit_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    version: Mapped[int] = mapped_column(Integer, default=0)
    start_time: Mapped[dt.datetime] = mapped_column(default=utcnow)
    end_time: Mapped[dt.datetime | None] = mapped_column(nullable=True)

    __mapper_args__ = {"version_id_col": version}  # noqa: RUF012


class TrialRunModel(Base):
    """One Slurm job of a trial."""

    __tablename__ = "trial_runs"
    __table_args__ = (UniqueConstraint("trial_id", "run_number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), index=True)
    run_number: Mapped[int] = mapped_column(Integer)
    slurm_job_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    node_list: Mapped[str | None] = mapped_column(Text, nullable=True)
    state: Mapped[str] = mapped_column(String(32), index=True)
    exit_reason: Mapped[str | None] = mapped_column(String(64), nullable=True)
    exit_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    runner_state: Mapped[str | None] = mapped_column(String(128), nullable=True)
    preempt_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    preempt_acked: Mapped[bool] = mapped_column(Boolean, default=False)
    version: Mapped[int] = mapped_column(Integer, default=0)
    __mapper_args__ = {"version_id_col": version}  # noqa: RUF012
    submit_time: Mapped[dt.datetime] = mapped_column(default=utcnow)
    start_time: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    end_time: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    pending_reason: Mapped[str | None] = mapped_column(String(256), nullable=True)
    """Why a PENDING run waits: Slurm's pending reason (Priority, Resources, QOSMaxJobsPerUserLimit, ...) once
    it has a job, or why the master holds it back before sbatch (AssocMaxSubmitJobLimit, SlurmUnavailable)."""
    pending_since: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    jobs_ahead: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """Pending jobs Slurm considers before this run's (``slurm_backend.pending``); None: unknown, or not pending."""
    """When the master first saw `pending_reason` (Slurm does not say since when a reason holds)."""


class MetricModel(Base):
    __tablename__ = "metrics"
    __table_args__ = (
        # Also the index for per-trial queries (trial_id is its first column).
        UniqueConstraint("trial_id", "trial_run_id", "group", "steps_completed", name="uq_metrics_report"),
        # A trial's reports of one group by steps (metric streams, latest validations, a checkpoint's
        # validation): the constraint above, with the run second, walks every row of the trial for those.
        Index("ix_metrics_trial_group_steps", "trial_id", "group", "steps_completed"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    trial_run_id: Mapped[int] = mapped_column(Integer)
    """The harness's run number (``DET_TRIAL_RUN_ID``), not ``trial_runs.id``."""
    group: Mapped[str] = mapped_column(String(64))
    steps_completed: Mapped[int] = mapped_column(BigInteger)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    report_time: Mapped[dt.datetime] = mapped_column(default=utcnow)


class MetricCurveModel(Base):
    """A (trial, group, metric)'s downsampled learning curve (``services.curves.experiment``), saved so that a master
    restart does not re-read every metric row: ``data`` is ``MinMaxCurve.to_bytes()``."""

    __tablename__ = "metric_curves"

    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True)
    group: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class MetricCurveMarkModel(Base):
    """How far an experiment's saved curves (``metric_curves``) have read its metric rows: every row with an
    id ≤ ``last_id`` except those late-committed ones not in ``recent`` (little-endian int64s)."""

    __tablename__ = "metric_curve_marks"

    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    last_id: Mapped[int] = mapped_column(BigInteger)
    recent: Mapped[bytes] = mapped_column(LargeBinary)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    """When the saved curves were read from the metric rows."""


class CheckpointModel(Base):
    __tablename__ = "checkpoints"

    uuid: Mapped[str] = mapped_column(String(64), primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), index=True)
    trial_run_id: Mapped[int] = mapped_column(Integer)
    steps_completed: Mapped[int] = mapped_column(BigInteger, default=0)
    state: Mapped[str] = mapped_column(String(32), default="COMPLETED")
    resources: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    report_time: Mapped[dt.datetime] = mapped_column(default=utcnow)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    """The sum of ``resources`` (the harness's {path: bytes}), kept for the storage totals."""
    gc_attempts: Mapped[int] = mapped_column(Integer, default=0)
    """Failed attempts to delete the checkpoint's files (``services.checkpoints.gc``)."""
    gc_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    """Why the last attempt to delete its files failed."""
    gc_retry_at: Mapped[dt.datetime | None] = mapped_column(nullable=True, index=True)
    """Set while its deletion is wanted and not done: when the next attempt is due (or a running attempt's
    lease ends). Null once deleted, and for checkpoints nobody asked to delete."""


class CheckpointGCRequestModel(Base):
    """Outbox of experiments whose checkpoints the GC policy should look at again (a trial paused or ended,
    the experiment ended, its policy changed); the lifecycle loop's collector consumes them."""

    __tablename__ = "checkpoint_gc_requests"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class LogFileModel(Base):
    """Where a trial run's output file lives (the Slurm job's stdout/stderr on the shared filesystem)."""

    __tablename__ = "log_files"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_run_id: Mapped[int] = mapped_column(ForeignKey("trial_runs.id", ondelete="CASCADE"), index=True)
    path: Mapped[str] = mapped_column(Text)
    stream: Mapped[str] = mapped_column(String(16), default="stdout")


class EventModel(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_entity", "entity", "entity_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    entity: Mapped[str] = mapped_column(String(32))
    entity_id: Mapped[int] = mapped_column(Integer)
    old_state: Mapped[str | None] = mapped_column(String(32), nullable=True)
    new_state: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text, default="")
    time: Mapped[dt.datetime] = mapped_column(default=utcnow)


class AuditEventModel(Base):
    """Append-only (``services.audit``; migration 0011's triggers refuse UPDATE and DELETE): who did what as
    whom. A privileged or cross-user action: an admin acting on another user's experiment, model or task
    (``as_unix``: the owner's Unix account, as which the master acts on its jobs and files), user accounts
    created or changed, admin rights given."""

    __tablename__ = "audit_events"
    __table_args__ = {"sqlite_autoincrement": True}  # noqa: RUF012

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    time: Mapped[dt.datetime] = mapped_column(default=utcnow, index=True)
    actor_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    actor: Mapped[str] = mapped_column(String(128))
    """The user who acted (their name then), or ``munge``/``ldap`` for a login that made or changed a user."""
    action: Mapped[str] = mapped_column(String(512))
    """The request (``POST /api/v1/experiments/5/kill``) or what the master did (``create user``)."""
    target: Mapped[str] = mapped_column(String(256))
    owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    """Whose the target is (a username), where it is a user's."""
    as_unix: Mapped[str | None] = mapped_column(String(128), nullable=True)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class SearcherOpCompletionModel(Base):
    """Outbox of validations the harness reported for the searcher; the lifecycle loop consumes them."""

    __tablename__ = "searcher_op_completions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), index=True)
    length: Mapped[int] = mapped_column(BigInteger)
    metric: Mapped[float | None] = mapped_column(Float, nullable=True)
    consumed: Mapped[bool] = mapped_column(Boolean, default=False, index=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class RegistryModel(Base):
    """A model of the registry (Determined's ``models``): a named collection of versions, each a checkpoint
    (``ModelVersionModel``). ``name_key`` is the name casefolded: names are unique regardless of case."""

    __tablename__ = "models"
    __table_args__ = {"sqlite_autoincrement": True}  # noqa: RUF012  # ids are never reused (migration 0008)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(256))
    name_key: Mapped[str] = mapped_column(String(1024), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    labels: Mapped[list[str]] = mapped_column(JSON, default=list)
    notes: Mapped[str] = mapped_column(Text, default="")
    archived: Mapped[bool] = mapped_column(Boolean, default=False)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    workspace_id: Mapped[int] = mapped_column(Integer, default=1)
    last_version: Mapped[int] = mapped_column(Integer, default=0)
    """The highest version number given so far: numbers are never reused, even after a deletion."""
    creation_time: Mapped[dt.datetime] = mapped_column(default=utcnow)
    last_updated_time: Mapped[dt.datetime] = mapped_column(default=utcnow)


class ModelVersionModel(Base):
    """A version of a registry model: a checkpoint, numbered per model. A checkpoint a version points at is
    never garbage-collected (``services.checkpoints.gc``) nor deleted (``DELETE /api/v1/checkpoints``)."""

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("model_id", "version", name="uq_model_versions_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    checkpoint_uuid: Mapped[str] = mapped_column(ForeignKey("checkpoints.uuid"), index=True)
    name: Mapped[str] = mapped_column(String(256), default="")
    comment: Mapped[str] = mapped_column(Text, default="")
    notes: Mapped[str] = mapped_column(Text, default="")
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    labels: Mapped[list[str]] = mapped_column(JSON, default=list)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    creation_time: Mapped[dt.datetime] = mapped_column(default=utcnow)
    last_updated_time: Mapped[dt.datetime] = mapped_column(default=utcnow)


class TaskModel(Base):
    """A command, notebook, shell or TensorBoard: one Slurm job, no searcher, no restarts (``hpc_master.tasks``)."""

    __tablename__ = "tasks"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    """A UUID, as Determined's task ids."""
    task_type: Mapped[str] = mapped_column(String(16), index=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    description: Mapped[str] = mapped_column(String(512), default="")
    state: Mapped[str] = mapped_column(String(32), index=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    context_archive: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True, deferred=True)
    """gzip'd tar of the context directory (≤ 95 MB uncompressed), written to the run directory at submit."""
    resource_pool: Mapped[str] = mapped_column(String(128), default="default")
    run_dir: Mapped[str] = mapped_column(Text)
    """Where the task's files are: the master's record, the only path its logs and files are read from."""
    slurm_job_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    submit_attempted: Mapped[bool] = mapped_column(Boolean, default=False)
    """sbatch was (maybe) run: after a crash the job is looked for by its comment before another sbatch."""
    node_list: Mapped[str | None] = mapped_column(Text, nullable=True)
    pending_reason: Mapped[str | None] = mapped_column(String(256), nullable=True)
    jobs_ahead: Mapped[int | None] = mapped_column(Integer, nullable=True)
    kill_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    exit_status: Mapped[str | None] = mapped_column(Text, nullable=True)
    """Why it ended, in words (Determined's ``exitStatus``)."""
    service_args: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    """The server's arguments the master decided (a TensorBoard's ``--logdir_spec``, from the trials' records)."""
    service_token: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """The token a notebook's or TensorBoard's server requires: written to the job's run directory for the
    server, never read back from there; the proxy adds this record of it to every request."""
    service_address: Mapped[str | None] = mapped_column(String(256), nullable=True)
    """``host:port`` of a notebook's or TensorBoard's server once it answers: where ``/proxy/<id>/`` goes."""
    last_activity: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    """The last request through the proxy (or the last moment a WebSocket was open): idle timeouts count from it."""
    version: Mapped[int] = mapped_column(Integer, default=0)
    start_time: Mapped[dt.datetime] = mapped_column(default=utcnow)
    end_time: Mapped[dt.datetime | None] = mapped_column(nullable=True)

    __mapper_args__ = {"version_id_col": version}  # noqa: RUF012
