"""An experiment's ``resources.priority`` and ``max_slots`` in the lifecycle loop (docs/priority.md).

- ``max_slots``: the experiment's trials use at most that many slots (GPUs) at once: a trial that would go past
  it waits in the master, unallocated, until a run of the experiment ends (Determined's semantics).
- ``priority``: a job is submitted with ``--nice`` from it (``hpc_master.priority``); when ``det e set
  priority`` changes it, ``Renicer`` re-nices the experiment's jobs still pending in Slurm.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from det_errors import SlurmError
from hpc_master import priority
from hpc_master.db.models import ExperimentModel, TrialModel, TrialRunModel, UserModel
from hpc_master.expconf import ExperimentConfigError, ResourcesConfig, parse_experiment_config
from hpc_master.masterconf import MasterConfig
from hpc_master.services.states import LIVE_RUN_STATES, RunState
from slurm_backend import Outcome, Poller, SlurmCli
from slurm_backend.cli import SlurmUnavailableError

log = logging.getLogger(__name__)
RENICE_EVERY_S = 2.0


@dataclass(frozen=True)
class Knobs:
    """What scheduling reads of an experiment's config (``resources``), which ``PATCH`` may change."""

    priority: int | None
    max_slots: int | None
    slots_per_trial: int
    pool: str | None


class KnobCache:
    """Each experiment's `Knobs`, read from its config only when its row changed (its ``version``, bumped by
    every update, ``PATCH`` included): a tick never reads the config column of an experiment it has seen,
    which may be megabytes (``lifecycle.configs``)."""

    def __init__(self, max_entries: int = 4096) -> None:
        self._by_id: dict[int, tuple[int, Knobs]] = {}
        self.max_entries = max_entries
        self.reads = 0

    def get(self, session: Session, experiment_ids: Iterable[int]) -> dict[int, Knobs]:
        ids = set(experiment_ids)
        if not ids:
            return {}
        versions = dict(
            session.execute(
                select(ExperimentModel.id, ExperimentModel.version).where(ExperimentModel.id.in_(ids))
            ).all()
        )
        stale = [i for i, v in versions.items() if self._by_id.get(i, (None,))[0] != v]
        if stale:
            self.reads += 1
            rows = session.execute(
                select(ExperimentModel.id, ExperimentModel.version, ExperimentModel.config).where(
                    ExperimentModel.id.in_(stale)
                )
            )
            for exp_id, version, config in rows:
                self._by_id[exp_id] = (version, _knobs(exp_id, config))
            self._evict(versions)
        return {i: self._by_id[i][1] for i in versions if i in self._by_id}

    def _evict(self, keep: Container[int]) -> None:
        """Forget entries past `max_entries`, first cached first, never those of `keep` (the ones just asked for)."""
        if len(self._by_id) > self.max_entries:
            for old in [i for i in self._by_id if i not in keep][: len(self._by_id) - self.max_entries]:
                del self._by_id[old]


def _knobs(exp_id: int, config: dict[str, Any] | None) -> Knobs:
    """An experiment's `Knobs` from its stored config."""
    try:  # one default for each knob, the model's
        r = parse_experiment_config(config or {}).resources
    except ExperimentConfigError as err:  # the job driver fails such an experiment, saying why
        log.warning("experiment %s: its stored config does not parse (%s)", exp_id, err.message)
        r = ResourcesConfig()
    return Knobs(
        priority=r.priority, max_slots=r.max_slots, slots_per_trial=r.slots_per_trial, pool=r.resource_pool
    )


def within_max_slots(session: Session, knobs: KnobCache, trials: list[tuple[int, int]]) -> list[int]:
    """The trial ids of `trials` ((trial id, experiment id), in submission order) that fit under their
    experiments' ``max_slots``; slots in use are the live runs' (pending or running, in Slurm or waiting in
    the master)."""
    capped = {
        e: k for e, k in knobs.get(session, {e for _, e in trials}).items()
        if k.max_slots is not None and k.slots_per_trial > 0
    }  # fmt: skip
    if not capped:
        return [t for t, _ in trials]
    live = dict(
        session.execute(
            select(TrialModel.experiment_id, func.count())
            .join(TrialRunModel, TrialRunModel.trial_id == TrialModel.id)
            .where(TrialModel.experiment_id.in_(capped), TrialRunModel.state.in_(LIVE_RUN_STATES))
            .group_by(TrialModel.experiment_id)
        ).all()
    )
    room = {e: (k.max_slots or 0) - int(live.get(e, 0)) * k.slots_per_trial for e, k in capped.items()}
    return _fitting(trials, capped, room)


def _fitting(trials: list[tuple[int, int]], capped: dict[int, Knobs], room: dict[int, int]) -> list[int]:
    """The trial ids of `trials` that fit in their capped experiments' `room` (slots left), which each takes up."""
    out = []
    for trial_id, exp_id in trials:
        if exp_id in room:
            if room[exp_id] < capped[exp_id].slots_per_trial:
                continue
            room[exp_id] -= capped[exp_id].slots_per_trial
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
    knobs: KnobCache
    sent: dict[str, int | None] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    as_owner: bool = False
    """Re-nice as each job's owner (a master that acts for its users)."""
    _last: float | None = None

    def submitted(self, job_id: str, nice: int | None) -> None:
        self.sent[job_id] = nice

    def wanted(self, knobs: Knobs) -> int | None:
        pool = self.config.resource_pools.get(knobs.pool or self.config.default_resource_pool)
        return priority.nice(knobs.priority, pool.priority_nice_step if pool is not None else 0)

    def step(self, session_factory: Callable[[], Any], *, every_s: float = RENICE_EVERY_S) -> int:
        """Re-nice what needs it (at most every `every_s`); returns how many jobs were updated."""
        now = self.clock()
        if self._last is not None and now - self._last < every_s:
            return 0
        self._last = now
        with session_factory() as s:
            rows, knobs = self._pending(s)
        self._forget_all_but({str(job) for job, _, _ in rows})
        updated = 0
        for job, exp_id, unix in rows:
            job_id = str(job)
            want = self.wanted(knobs[exp_id]) if exp_id in knobs else None
            if want is None or not self._due(job_id, want):
                continue
            took = self._set_nice(job_id, want, unix)
            if took is None:
                return updated  # the next pass tries again
            if took:
                updated += 1
            self.sent[job_id] = want
        return updated

    def _forget_all_but(self, live: Container[str]) -> None:
        for job in [j for j in self.sent if j not in live]:
            del self.sent[job]  # ended or started: forget it

    def _pending(self, s: Session) -> tuple[Sequence[Any], dict[int, Knobs]]:
        """The runs pending in Slurm, as (job id, experiment id, owner's Unix account), and their experiments'
        `Knobs`."""
        rows = s.execute(
            select(TrialRunModel.slurm_job_id, TrialModel.experiment_id, UserModel.unix_username)
            .join(TrialModel, TrialModel.id == TrialRunModel.trial_id)
            .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
            .outerjoin(UserModel, UserModel.id == ExperimentModel.owner_id)
            .where(TrialRunModel.state == RunState.PENDING, TrialRunModel.slurm_job_id.is_not(None))
        ).all()
        knobs = self.knobs.get(s, {e for _, e, _ in rows}) if rows else {}
        return rows, knobs

    def _due(self, job_id: str, want: int) -> bool:
        """Whether the job is to be re-niced to `want`: not sent it yet, and not known to have left pending."""
        if job_id in self.sent and self.sent[job_id] == want:
            return False
        status = self.poller.status(job_id)
        return status is None or status.outcome is Outcome.PENDING

    def _set_nice(self, job_id: str, want: int, unix: str | None) -> bool | None:
        """Re-nice one job: whether Slurm took it; None when the controller does not answer."""
        try:
            with self.cli.retries_at_most(0):
                self.cli.set_nice(job_id, want, as_user=unix if self.as_owner else None)
        except SlurmUnavailableError:
            return None
        except SlurmError as e:  # it started or ended meanwhile
            log.info("re-nicing Slurm job %s failed: %s", job_id, e)
            return False
        log.info("Slurm job %s re-niced to %s (its experiment's priority)", job_id, want)
        return True
