"""Checkpoint garbage collection: apply each experiment's GC policy, delete the files, record the outcome.

When it runs: ``services.lifecycle`` asks for it (a ``checkpoint_gc_requests`` row) when a trial pauses or
ends, when a paused trial's last job ends, when the experiment ends, and when its policy changes
(``PATCH /api/v1/experiments/{id}``). The lifecycle loop's `CheckpointCollector` takes the requests.

What it deletes: the policy (`policy`) of the experiment's stored ``checkpoint_storage`` (fields it
lacks come from the master's), over every existing checkpoint of the experiment, applied only to trials no
job runs for (paused or ended), never to the latest checkpoint of a trial that can still run (a paused
trial resumes from it), and never to a checkpoint registered in the model registry (``models_registry``):
those still rank (a registered best fills the best's place) but are never deleted, by the policy or by
``claim`` (which every deletion goes through).

How: load → act → apply, as the rest of the loop. A short transaction chooses the checkpoints and *claims*
them (``gc_retry_at`` = a lease, so a master that dies mid-way retries them); the files are removed with no
transaction open, as the owner's account (`remover`), in a worker thread so that the loop is never
held up; a second short transaction records the outcome. A removed checkpoint becomes DELETED. A failure is
never silent: the checkpoint keeps its state (PARTIALLY_DELETED once some of its files may be gone), with
``gc_error`` and ``gc_attempts``, and ``gc_retry_at`` says when the loop tries again (30 s, doubling to 1 h).
Once chosen, a checkpoint's deletion is final: retries do not ask the policy again.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import (
    CheckpointGCRequestModel,
    CheckpointModel,
    ExperimentModel,
    MetricModel,
    TrialModel,
    TrialRunModel,
    UserModel,
    utcnow,
)
from hpc_master.expconf import ExperimentConfig
from hpc_master.services.checkpoints.policy import CheckpointFacts, GCPolicy, checkpoints_to_delete
from hpc_master.services.checkpoints.records import checkpoint_dir_map
from hpc_master.services.checkpoints.remover import CheckpointRemover, Owner, Removal
from hpc_master.services.experiments import searcher_metric
from hpc_master.services.lifecycle import GC_TRIAL_STATES
from hpc_master.services.metrics import metric_value
from hpc_master.services.models_registry import registered_checkpoints
from hpc_master.services.states import LIVE_RUN_STATES, TERMINAL_TRIAL_STATES, ExperimentState
from hpc_master.services.stored_config import StoredConfigError, experiment_config

log = logging.getLogger(__name__)

LEASE = dt.timedelta(minutes=30)
"""A claimed deletion whose attempt never reported (the master died) is tried again after this."""
RETRY_FIRST_S = 30.0
RETRY_MAX_S = 3600.0
NOT_VISIBLE = (
    "the checkpoint's storage is not visible to the master (a `directory` storage), so it cannot delete it"
)
SKIPPED_EXPERIMENTS = (ExperimentState.DELETING, ExperimentState.DELETE_FAILED)


def retry_delay(attempts: int) -> dt.timedelta:
    """How long after its `attempts`-th failure a deletion is tried again."""
    return dt.timedelta(seconds=min(RETRY_FIRST_S * 2 ** max(attempts - 1, 0), RETRY_MAX_S))


def experiment_policy(config: ExperimentConfig, default: GCPolicy | None = None) -> GCPolicy:
    return GCPolicy.of(config.checkpoint_storage_dict(), default)


@dataclass(frozen=True)
class Target:
    """A claimed checkpoint: whose it is and where its directory is (None: not visible here)."""

    uuid: str
    owner: Owner
    path: Path | None


# ---------------------------------------------------------------- choosing


def _facts(session: Session, experiment_id: int, metric_name: str | None) -> list[CheckpointFacts]:
    """Every existing checkpoint of the experiment not already being deleted, with its validation metric."""
    stmt = (
        select(
            CheckpointModel.uuid,
            CheckpointModel.trial_id,
            CheckpointModel.steps_completed,
            CheckpointModel.report_time,
            MetricModel.metrics,
        )
        .join(TrialModel, TrialModel.id == CheckpointModel.trial_id)
        .outerjoin(
            MetricModel,
            and_(
                MetricModel.trial_id == CheckpointModel.trial_id,
                MetricModel.steps_completed == CheckpointModel.steps_completed,
                MetricModel.group == "validation",
            ),
        )
        .where(
            TrialModel.experiment_id == experiment_id,
            CheckpointModel.state == "COMPLETED",
            CheckpointModel.gc_retry_at.is_(None),
        )
        .order_by(MetricModel.trial_run_id)  # the latest run's validation at those steps wins
    )
    out: dict[str, CheckpointFacts] = {}
    for uuid, trial_id, steps, reported, metrics in session.execute(stmt).all():
        value = metric_value(metrics, metric_name) if metrics and metric_name else None
        out[uuid] = CheckpointFacts(uuid, trial_id, int(steps), reported, value)
    return list(out.values())


def select_for_gc(
    session: Session, experiment_id: int, policy: GCPolicy | None = None, *, default: GCPolicy | None = None
) -> list[str]:
    """The checkpoints `policy` (default: the experiment's own) deletes now (`policy`), of trials
    that are paused or ended with no job running, never a non-terminal trial's latest checkpoint."""
    experiment = session.get(ExperimentModel, experiment_id)
    if experiment is None:
        return []
    config = experiment_config(experiment)
    policy = policy or experiment_policy(config, default)
    metric_name, smaller_is_better = searcher_metric(config)
    trials = session.execute(
        select(TrialModel.id, TrialModel.state, TrialModel.latest_checkpoint).where(
            TrialModel.experiment_id == experiment_id
        )
    ).all()
    running = set(
        session.scalars(
            select(TrialRunModel.trial_id)
            .join(TrialModel, TrialModel.id == TrialRunModel.trial_id)
            .where(TrialModel.experiment_id == experiment_id, TrialRunModel.state.in_(LIVE_RUN_STATES))
        )
    )
    collectable = {t.id for t in trials if t.state in GC_TRIAL_STATES and t.id not in running}
    protected = {
        t.latest_checkpoint for t in trials if t.state not in TERMINAL_TRIAL_STATES and t.latest_checkpoint
    }
    facts = _facts(session, experiment_id, metric_name)
    protected |= set(registered_checkpoints(session, (f.uuid for f in facts)))
    return checkpoints_to_delete(
        facts,
        policy,
        smaller_is_better=smaller_is_better,
        collectable_trials=collectable,
        protected=protected,
    )


@dataclass(frozen=True)
class Previewed:
    checkpoint: CheckpointModel
    validation: dict[str, Any] | None
    metric: float | None


def preview(session: Session, experiment_id: int, policy: GCPolicy) -> list[Previewed]:
    """What `policy` would delete now (``det e set gc-policy`` shows it before asking), oldest first."""
    uuids = select_for_gc(session, experiment_id, policy)
    if not uuids:
        return []
    experiment = session.get(ExperimentModel, experiment_id)
    metric_name, _ = searcher_metric(experiment_config(experiment) if experiment is not None else None)
    rows = session.execute(
        select(CheckpointModel, MetricModel.metrics)
        .outerjoin(
            MetricModel,
            and_(
                MetricModel.trial_id == CheckpointModel.trial_id,
                MetricModel.steps_completed == CheckpointModel.steps_completed,
                MetricModel.group == "validation",
            ),
        )
        .where(CheckpointModel.uuid.in_(uuids))
        .order_by(MetricModel.trial_run_id)
    ).all()
    out: dict[str, Previewed] = {}
    for ckpt, metrics in rows:
        value = metric_value(metrics, metric_name) if metrics and metric_name else None
        out[ckpt.uuid] = Previewed(ckpt, metrics, value)
    return sorted(out.values(), key=lambda p: (p.checkpoint.trial_id, p.checkpoint.steps_completed))


def claim(session: Session, uuids: Iterable[str], now: dt.datetime, default_root: Path) -> list[Target]:
    """Record that these checkpoints' deletion is wanted and is being attempted (a lease until
    ``now + LEASE``), and say where their files are. Checkpoints already DELETED, or held by an attempt in
    progress, are left out (another deletion is doing them), and so are registered ones (model versions),
    looked at before and again after the claim: a registration holds the checkpoint's row until it commits,
    so one that the claim waited for is seen by the second look (PostgreSQL's statements each see what was
    committed when they began), and its claim is dropped."""
    asked = set(uuids)
    wanted = sorted(asked - set(registered_checkpoints(session, asked)))
    if not wanted:
        return []
    claimed = list(
        session.execute(
            update(CheckpointModel)
            .where(
                CheckpointModel.uuid.in_(wanted),
                CheckpointModel.state != "DELETED",
                or_(CheckpointModel.gc_retry_at.is_(None), CheckpointModel.gc_retry_at <= now),
            )
            .values(gc_retry_at=now + LEASE)
            .returning(CheckpointModel.uuid)
            .execution_options(synchronize_session=False)
        ).scalars()
    )
    late = set(registered_checkpoints(session, claimed))
    if late:
        session.execute(
            update(CheckpointModel)
            .where(CheckpointModel.uuid.in_(sorted(late)))
            .values(gc_retry_at=None)
            .execution_options(synchronize_session=False)
        )
        claimed = [u for u in claimed if u not in late]
    if not claimed:
        return []
    owners = {
        uuid: Owner(name, unix)
        for uuid, name, unix in session.execute(
            select(CheckpointModel.uuid, UserModel.username, UserModel.unix_username)
            .join(TrialModel, TrialModel.id == CheckpointModel.trial_id)
            .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
            .join(UserModel, UserModel.id == ExperimentModel.owner_id)
            .where(CheckpointModel.uuid.in_(claimed))
        ).all()
    }
    paths = checkpoint_dir_map(session, claimed, default_root)
    return [Target(u, owners[u], paths.get(u)) for u in sorted(claimed) if u in owners]


# ---------------------------------------------------------------- acting and recording


def remove(remover: CheckpointRemover, targets: Iterable[Target]) -> dict[str, Removal]:
    """Remove the targets' directories, grouped by owner (no transaction open: this is the slow part)."""
    out: dict[str, Removal] = {}
    by_owner: dict[Owner, list[Target]] = defaultdict(list)
    for target in targets:
        if target.path is None:
            out[target.uuid] = Removal(ok=False, error=NOT_VISIBLE)
        else:
            by_owner[target.owner].append(target)
    for owner, items in by_owner.items():
        out.update(_remove_owned(remover, owner, items))
    return out


def _remove_owned(remover: CheckpointRemover, owner: Owner, items: list[Target]) -> dict[str, Removal]:
    """Remove one owner's targets (each with a path); a target the remover says nothing of failed."""
    try:
        done = remover.remove(owner, [t.path for t in items if t.path is not None])
    except Exception as exc:  # an unexpected failure is recorded like any other
        log.exception("removing checkpoints of %s failed", owner.name)
        done = {}
        error = f"internal error: {type(exc).__name__}: {exc}"
    else:
        error = "no answer"
    out: dict[str, Removal] = {}
    for t in items:
        assert t.path is not None
        out[t.uuid] = done.get(t.path) or Removal(ok=False, error=error)
    return out


@dataclass
class Outcome:
    deleted: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def record(session: Session, results: Mapping[str, Removal], now: dt.datetime) -> Outcome:
    """Apply the removals' results: DELETED, or the failure recorded and a retry scheduled."""
    outcome = Outcome()
    rows = session.scalars(select(CheckpointModel).where(CheckpointModel.uuid.in_(list(results))))
    for row in rows:
        result = results[row.uuid]
        if result.ok:
            row.state, row.gc_error, row.gc_retry_at = "DELETED", None, None
            outcome.deleted.append(row.uuid)
            continue
        row.gc_attempts = (row.gc_attempts or 0) + 1
        row.gc_error = (result.error or "unknown error")[:2000]
        row.gc_retry_at = None if result.error == NOT_VISIBLE else now + retry_delay(row.gc_attempts)
        if result.touched and row.state != "DELETED":
            row.state = "PARTIALLY_DELETED"
        outcome.failed[row.uuid] = row.gc_error
        log.warning(
            "could not delete checkpoint %s (attempt %d; %s): %s", row.uuid, row.gc_attempts,
            f"retrying at {row.gc_retry_at:%H:%M:%S}" if row.gc_retry_at else "not retried", row.gc_error,
        )  # fmt: skip
    return outcome


# ---------------------------------------------------------------- the loop's collector


def take_requests(session: Session, limit: int, skip: Iterable[int] = ()) -> dict[int, int]:
    """Pending requests by experiment (oldest first): {experiment id: the newest request's id}."""
    stmt = (
        select(CheckpointGCRequestModel.experiment_id, func.max(CheckpointGCRequestModel.id))
        .group_by(CheckpointGCRequestModel.experiment_id)
        .order_by(func.min(CheckpointGCRequestModel.id))
        .limit(limit)
    )
    skipped = list(skip)
    if skipped:
        stmt = stmt.where(CheckpointGCRequestModel.experiment_id.not_in(skipped))
    return {int(e): int(i) for e, i in session.execute(stmt).all()}


def plan_collection(
    session: Session,
    now: dt.datetime,
    *,
    default_root: Path,
    default_policy: GCPolicy | None = None,
    max_experiments: int = 20,
    max_retries: int = 500,
    skip: Iterable[int] = (),
) -> tuple[list[Target], list[int]]:
    """What the collector does next: the checkpoints the pending requests' policies delete and the failed
    deletions that are due, claimed; and the experiments whose requests it took."""
    requests = take_requests(session, max_experiments, skip)
    uuids: list[str] = []
    for experiment_id, last_id in requests.items():
        state = session.scalar(select(ExperimentModel.state).where(ExperimentModel.id == experiment_id))
        if state is not None and state not in SKIPPED_EXPERIMENTS:
            try:
                uuids += select_for_gc(session, experiment_id, default=default_policy)
            except StoredConfigError as err:  # no policy to apply: its checkpoints are kept
                log.warning("checkpoint GC skips experiment %s: %s", experiment_id, err.message)
        session.execute(
            delete(CheckpointGCRequestModel).where(
                CheckpointGCRequestModel.experiment_id == experiment_id,
                CheckpointGCRequestModel.id <= last_id,
            )
        )
    due = session.scalars(
        select(CheckpointModel.uuid)
        .where(CheckpointModel.gc_retry_at <= now, CheckpointModel.state != "DELETED")
        .order_by(CheckpointModel.gc_retry_at)
        .limit(max_retries)
    )
    uuids += list(due)
    return claim(session, uuids, now, default_root), list(requests)


class CheckpointCollector:
    """The lifecycle loop's checkpoint GC. `step()` (every tick) never waits on files: it records a finished
    batch, and starts the next one in a worker thread; `run_once()` does a whole pass at once (tests, tools).

    An experiment is looked at again at most every `min_interval_s` (its requests wait meanwhile): a grid
    whose trials end one by one does not rank its checkpoints once per trial."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        default_root: Path,
        default_policy: GCPolicy | None = None,
        remover: CheckpointRemover | None = None,
        min_interval_s: float = 5.0,
        clock: Callable[[], dt.datetime] = utcnow,
    ) -> None:
        self.sessions = sessions
        self.default_root = default_root
        self.default_policy = default_policy
        self.remover = remover or CheckpointRemover()
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._seen: dict[int, float] = {}
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._running: concurrent.futures.Future[dict[str, Removal]] | None = None

    def _plan(self) -> list[Target]:
        now_s = time.monotonic()
        recent = [e for e, t in self._seen.items() if now_s - t < self.min_interval_s]
        with transaction(self.sessions) as s:
            targets, experiments = plan_collection(
                s, self.clock(), default_root=self.default_root, default_policy=self.default_policy,
                skip=recent,
            )  # fmt: skip
        for e in experiments:
            self._seen[e] = now_s
        self._seen = {e: t for e, t in self._seen.items() if now_s - t < self.min_interval_s}
        return targets

    def _record(self, results: dict[str, Removal]) -> Outcome:
        with transaction(self.sessions) as s:
            outcome = record(s, results, self.clock())
        if outcome.deleted:
            log.info("checkpoint GC: deleted %d checkpoints", len(outcome.deleted))
        return outcome

    def run_once(self) -> Outcome:
        targets = self._plan()
        return self._record(remove(self.remover, targets)) if targets else Outcome()

    def step(self) -> None:
        if self._running is not None:
            if not self._running.done():
                return
            finished, self._running = self._running, None
            self._record(finished.result())
        targets = self._plan()
        if targets:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint-gc")
            self._running = self._executor.submit(remove, self.remover, targets)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
