"""An experiment's ``resources.priority`` and ``max_slots`` in the lifecycle loop (docs/priority.md).

- ``max_slots``: the experiment's trials use at most that many slots (GPUs) at once: a trial that would go past
  it waits in the master, unallocated, until a run of the experiment ends (Determined's semantics).
- ``priority``: a job is submitted with ``--nice`` from it (``hpc_master.priority``); when ``det e set
  priority`` changes it, ``Renicer`` re-nices the experiment's jobs still pending in Slurm.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from det_errors import SlurmError
from hpc_master import priority
from hpc_master.db.models import ExperimentModel, TrialModel, TrialRunModel
from hpc_master.masterconf import MasterConfig
from hpc_master.services.states import LIVE_RUN_STATES, RunState
from slurm_backend import Outcome, Poller, SlurmCli
from slurm_backend.cli import SlurmUnavailableError

log = logging.getLogger(__name__)
RENICE_EVERY_S = 2.0


def _resources(config: Any) -> dict[str, Any]:
    resources = config.get("resources") if isinstance(config, dict) else None
    return resources if isinstance(resources, dict) else {}


def slots_left(session: Session, experiment_ids: Iterable[int]) -> dict[int, tuple[int, int]]:
    """For each of `experiment_ids` whose config sets ``resources.max_slots``: (slots it may still start,
    slots per trial). Slots in use are its live runs' (pending or running, in Slurm or waiting in the master)."""
    ids = set(experiment_ids)
    if not ids:
        return {}
    capped: dict[int, tuple[int, int]] = {}
    for exp_id, config in session.execute(
        select(ExperimentModel.id, ExperimentModel.config).where(ExperimentModel.id.in_(ids))
    ):
        resources = _resources(config)
        cap, per_trial = resources.get("max_slots"), resources.get("slots_per_trial", 1)
        if isinstance(cap, int) and isinstance(per_trial, int) and per_trial > 0:
            capped[exp_id] = (cap, per_trial)
    if not capped:
        return {}
    live = dict(
        session.execute(
            select(TrialModel.experiment_id, func.count())
            .join(TrialRunModel, TrialRunModel.trial_id == TrialModel.id)
            .where(TrialModel.experiment_id.in_(capped), TrialRunModel.state.in_(LIVE_RUN_STATES))
            .group_by(TrialModel.experiment_id)
        ).all()
    )
    return {e: (cap - int(live.get(e, 0)) * per, per) for e, (cap, per) in capped.items()}


def within_max_slots(session: Session, trials: list[tuple[int, int]]) -> list[int]:
    """The trial ids of `trials` ((trial id, experiment id), in submission order) that fit under their
    experiments' ``max_slots``."""
    left = slots_left(session, {e for _, e in trials})
    out = []
    for trial_id, exp_id in trials:
        if exp_id in left:
            room, per_trial = left[exp_id]
            if room < per_trial:
                continue
            left[exp_id] = (room - per_trial, per_trial)
        out.append(trial_id)
    return out


@dataclass
class Renicer:
    """Keeps the ``--nice`` of the jobs pending in Slurm equal to what their experiments' priority asks.

    `sent` remembers the nice each job was given (at sbatch, or by an update); a job it does not know (after a
    master restart) is updated once. Pending jobs only: Slurm ignores the nice of a running one."""

    config: MasterConfig
    cli: SlurmCli
    poller: Poller
    sent: dict[str, int | None] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    _last: float | None = None

    def submitted(self, job_id: str, nice: int | None) -> None:
        self.sent[job_id] = nice

    def wanted(self, config: Any) -> int | None:
        resources = _resources(config)
        pool_name = resources.get("resource_pool") or self.config.default_resource_pool
        pool = self.config.resource_pools.get(pool_name)
        step = pool.priority_nice_step if pool is not None else 0
        value = resources.get("priority")
        return priority.nice(value if isinstance(value, int) else None, step)

    def step(self, session_factory: Callable[[], Any], *, every_s: float = RENICE_EVERY_S) -> int:
        """Re-nice what needs it (at most every `every_s`); returns how many jobs were updated."""
        now = self.clock()
        if self._last is not None and now - self._last < every_s:
            return 0
        self._last = now
        with session_factory() as s:
            rows = s.execute(
                select(TrialRunModel.slurm_job_id, ExperimentModel.config)
                .join(TrialModel, TrialModel.id == TrialRunModel.trial_id)
                .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
                .where(TrialRunModel.state == RunState.PENDING, TrialRunModel.slurm_job_id.is_not(None))
            ).all()
        live = {str(job) for job, _ in rows}
        for job in [j for j in self.sent if j not in live]:
            del self.sent[job]  # ended or started: forget it
        updated = 0
        for job_id, config in rows:
            want = self.wanted(config)
            if want is None or (job_id in self.sent and self.sent[job_id] == want):
                continue
            status = self.poller.status(job_id)
            if status is not None and status.outcome is not Outcome.PENDING:
                continue
            try:
                with self.cli.retries_at_most(0):
                    self.cli.set_nice(job_id, want)
            except SlurmUnavailableError:
                return updated  # the next pass tries again
            except SlurmError as e:  # it started or ended meanwhile
                log.info("re-nicing Slurm job %s failed: %s", job_id, e)
            else:
                log.info("Slurm job %s re-niced to %s (its experiment's priority)", job_id, want)
                updated += 1
            self.sent[job_id] = want
        return updated
