"""Runs waiting in the master: when the job driver may ask Slurm again, and why each pending run waits.

Slurm says "wait" more often than "no" (see `hpc_master.lifecycle.jobs`). `SubmitGate` keeps what Slurm
said: the controller did not answer (ask again after a backoff of 5 s doubling to 60 s, and not while the
poller's last try failed the same way), or a submit limit was hit for a (Unix account, account, QOS,
partition) (ask again once a job ended, or after `limit_retry_s`, since the user's other jobs end too).
The rest are the few queries and updates of `trial_runs` that the waiting needs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from hpc_master.db.models import ExperimentModel, TrialModel, TrialRunModel, UserModel, utcnow
from hpc_master.errors import SlurmError
from hpc_master.services.states import ExperimentState, RunState, TrialState
from slurm_backend import Poller
from slurm_backend.cli import SlurmUnavailableError

log = logging.getLogger(__name__)

SLURM_UNAVAILABLE = "SlurmControllerUnavailable"
"""The pending reason of a run the master could not submit because slurmctld did not answer."""
UNAVAILABLE_BACKOFF_S = (5.0, 60.0)
LimitKey = tuple[str | None, ...]


class SubmitGate:
    """Whether the job driver may ask Slurm now. Used by the loop's one thread."""

    def __init__(
        self, poller: Poller, *, limit_retry_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.poller = poller
        self.limit_retry_s = limit_retry_s
        self.clock = clock
        self._limits: dict[
            LimitKey, tuple[float, str]
        ] = {}  # key → (ask again at, Slurm's name of the limit)
        self._unavailable_until = float("-inf")
        self._backoff_s = 0.0

    def slurm_unavailable(self) -> bool:
        """The controller did not answer lately (our last try, or the poller's)."""
        return self.clock() < self._unavailable_until or isinstance(
            self.poller.last_error, SlurmUnavailableError
        )

    def note_unavailable(self, e: SlurmError) -> None:
        low, high = UNAVAILABLE_BACKOFF_S
        self._backoff_s = min(max(low, self._backoff_s * 2), high)
        self._unavailable_until = self.clock() + self._backoff_s
        log.warning("Slurm does not answer (%s); trying again in %.0f s", e, self._backoff_s)

    def note_submitted(self, key: LimitKey) -> None:
        self._backoff_s = 0.0
        self._limits.pop(key, None)

    def held(self, key: LimitKey) -> str | None:
        """The submit limit `key`'s jobs were last refused for, while it is too early to try again."""
        held = self._limits.get(key)
        return held[1] if held is not None and self.clock() < held[0] else None

    def hold(self, key: LimitKey, reason: str) -> None:
        self._limits[key] = (self.clock() + self.limit_retry_s, reason)

    def jobs_ended(self) -> None:
        """A job ended: a place under some submit limit may have freed up."""
        self._limits.clear()


@dataclass
class Prepared:
    """A run's job, built and written to its run directory, waiting for (another) sbatch."""

    run_id: int
    trial_id: int
    run_number: int
    script: str
    comment: str
    as_user: str | None
    output_path: str
    limit_key: LimitKey
    """Whose submit limit applies: (Unix account, account, QOS, partition)."""
    check_comment: bool = False
    """An earlier sbatch may have created the job (its answer was lost): look for it before submitting."""
    nice: int | None = None
    """The job's ``--nice`` (its experiment's priority; ``lifecycle.priorities``)."""


@dataclass(frozen=True)
class Waiting:
    """A live run with no Slurm job yet (held back by the master, or allocated before a restart)."""

    run_id: int
    run_number: int
    trial_id: int
    experiment_id: int
    trial_state: TrialState
    submittable: bool
    """Its trial is ACTIVE, in an ACTIVE experiment, and nobody asked it to stop."""
    owner_unix: str | None
    pending_reason: str | None


def list_waiting(session: Session) -> list[Waiting]:
    """Live runs without a Slurm job, oldest first."""
    rows = session.execute(
        select(
            TrialRunModel.id,
            TrialRunModel.run_number,
            TrialRunModel.trial_id,
            TrialModel.experiment_id,
            TrialModel.state,
            ExperimentModel.state,
            TrialRunModel.preempt_requested,
            UserModel.unix_username,
            TrialRunModel.pending_reason,
        )
        .join(TrialModel, TrialModel.id == TrialRunModel.trial_id)
        .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
        .join(UserModel, UserModel.id == ExperimentModel.owner_id)
        .where(TrialRunModel.state == RunState.PENDING, TrialRunModel.slurm_job_id.is_(None))
        .order_by(TrialRunModel.id)
    ).all()
    return [
        Waiting(
            run_id=run_id,
            run_number=run_number,
            trial_id=trial_id,
            experiment_id=exp_id,
            trial_state=TrialState(trial_state),
            submittable=trial_state == TrialState.ACTIVE
            and exp_state == ExperimentState.ACTIVE
            and not preempt_requested,
            owner_unix=owner_unix,
            pending_reason=reason,
        )
        for run_id, run_number, trial_id, exp_id, trial_state, exp_state, preempt_requested, owner_unix, reason in rows
    ]


def pending_reasons(session: Session) -> dict[int, tuple[str | None, int | None]]:
    """Each pending run's recorded (reason, jobs ahead)."""
    rows = session.execute(
        select(TrialRunModel.id, TrialRunModel.pending_reason, TrialRunModel.jobs_ahead).where(
            TrialRunModel.state == RunState.PENDING
        )
    ).all()
    return {run_id: (reason, ahead) for run_id, reason, ahead in rows}


def write_waiting(
    session: Session,
    run_id: int,
    reason: str | None,
    ahead: int | None,
    recorded: tuple[str | None, int | None],
) -> None:
    """Record Slurm's word on a pending run where it changed: the reason (and since now), the jobs ahead."""
    if recorded[0] != reason:
        write_pending_reason(session, run_id, reason)
    if recorded[1] != ahead:
        session.execute(
            update(TrialRunModel).where(TrialRunModel.id == run_id).values(jobs_ahead=ahead)
            .execution_options(synchronize_session=False)
        )  # fmt: skip


def write_pending_reason(session: Session, run_id: int, reason: str | None) -> None:
    """Record why a pending run waits, and since now; a plain UPDATE that leaves the row's version alone
    (the API's writers of the run, a pause say, must not find it stale for this)."""
    changes: dict[str, object] = {"pending_reason": reason[:256] if reason else None, "pending_since": None}
    if reason:
        changes["pending_since"] = utcnow()
    else:
        changes["jobs_ahead"] = None  # not waiting any more
    session.execute(
        update(TrialRunModel)
        .where(TrialRunModel.id == run_id)
        .values(changes)
        .execution_options(synchronize_session=False)
    )
