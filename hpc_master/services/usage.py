"""Usage: slot-seconds of trial runs over a time range, per run (Determined's "raw" resource allocation) and per
day or month by user, label, resource pool, workspace and Slurm account ("aggregated"), as Determined's
``det resources`` and ``/api/v1/resources/allocation/*`` report them.

A run counts from its Slurm job's start to its end (or now, while it runs), clipped to the range, times its
slots (``resources.slots_per_trial``: GPUs; a CPU-only trial, 0 slots, counts its seconds but no slot-seconds,
as in Determined). Its Slurm account is the one its job was charged to where the master chose it (the
experiment's ``slurm.account``, else its pool's ``account``); otherwise the user's default association, shown as
``""``. Tasks (notebooks, commands) are not counted yet: the master does not record when their jobs started.

Admins see everyone's usage; other users their own.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from hpc_master.db.models import ExperimentModel, TrialModel, TrialRunModel, UserModel, utcnow
from hpc_master.errors import ClientError
from hpc_master.masterconf import MasterConfig
from hpc_master.services import access, workspaces
from hpc_master.services.access import Principal
from hpc_master.services.stored_config import experiment_config

Period = Literal["daily", "monthly"]
MAX_DAYS = 3700  # about ten years of days: a bound on the answer, not on the data


@dataclass(frozen=True)
class RunUsage:
    start: dt.datetime
    end: dt.datetime
    experiment_id: int
    trial_id: int
    run_number: int
    slurm_job_id: str
    username: str
    user_id: int
    labels: tuple[str, ...]
    slots: int
    resource_pool: str
    workspace: str
    slurm_account: str

    @property
    def seconds(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds())

    @property
    def slot_seconds(self) -> float:
        return self.seconds * self.slots


def runs_in(
    session: Session, config: MasterConfig, viewer: Principal, after: dt.datetime, before: dt.datetime
) -> list[RunUsage]:
    """The runs that held their slots during ``[after, before)``, each clipped to it, oldest first."""
    viewer.require_user()
    if before <= after:
        raise ClientError("timestamp_before: must be after timestamp_after", field="timestamp_before")
    query = (
        select(TrialRunModel, TrialModel.experiment_id, ExperimentModel, UserModel.username)
        .join(TrialModel, TrialModel.id == TrialRunModel.trial_id)
        .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
        .join(UserModel, UserModel.id == ExperimentModel.owner_id)
        .where(TrialRunModel.start_time.is_not(None), TrialRunModel.start_time < _utc(before))
        .where(or_(TrialRunModel.end_time.is_(None), TrialRunModel.end_time > _utc(after)))
        .order_by(TrialRunModel.start_time, TrialRunModel.id)
    )
    query = access.only_own(query, ExperimentModel.owner_id, viewer)  # an admin's: everyone's
    now = _utc(utcnow())
    out = []
    for run, experiment_id, experiment, username in session.execute(query).all():
        assert run.start_time is not None
        start = max(_utc(run.start_time), _utc(after))
        end = min(_utc(run.end_time or now), _utc(before))
        out.append(_usage(config, run, experiment_id, experiment, username, start, end))
    return out


def _usage(
    config: MasterConfig, run: TrialRunModel, experiment_id: int, experiment: ExperimentModel, username: str,
    start: dt.datetime, end: dt.datetime,
) -> RunUsage:  # fmt: skip
    typed = experiment_config(experiment)
    pool = config.resource_pools.get(experiment.resource_pool)
    account = typed.slurm.account or (pool.account if pool else None) or ""
    slots = typed.resources.slots_per_trial
    return RunUsage(
        start=start, end=end, experiment_id=experiment_id, trial_id=run.trial_id, run_number=run.run_number,
        slurm_job_id=run.slurm_job_id or "", username=username, user_id=experiment.owner_id,
        labels=tuple(typed.labels), slots=slots, resource_pool=experiment.resource_pool,
        workspace=workspaces.names_of(typed)[0], slurm_account=account,
    )  # fmt: skip


def aggregated(
    runs: list[RunUsage], first_day: dt.date, last_day: dt.date, period: Period
) -> list[dict[str, Any]]:
    """Slot-seconds per period from ``first_day`` to ``last_day`` (both whole days, UTC), in Determined's
    fields (``periodStart``, ``seconds``, ``byUsername``, ``byExperimentLabel``, ``byResourcePool``) and ours
    (``byWorkspace``, ``bySlurmAccount``)."""
    entries = []
    for start, end in _periods(first_day, last_day, period):
        sums: dict[str, defaultdict[str, float]] = {k: defaultdict(float) for k in _BY}
        total = 0.0
        for run in runs:
            overlap = (min(run.end, end) - max(run.start, start)).total_seconds()
            if overlap <= 0:
                continue
            used = overlap * run.slots
            total += used
            for key, values in _BY.items():
                for value in values(run):
                    sums[key][value] += used
        entries.append({
            "periodStart": start.date().isoformat(),
            "period": f"RESOURCE_ALLOCATION_AGGREGATION_PERIOD_{period.upper()}",
            "seconds": total,
            **{key: dict(sorted(s.items())) for key, s in sums.items()},
        })  # fmt: skip
    return entries


_BY: dict[str, Callable[[RunUsage], Iterable[str]]] = {
    "byUsername": lambda r: [r.username],
    "byExperimentLabel": lambda r: r.labels,
    "byResourcePool": lambda r: [r.resource_pool],
    "byWorkspace": lambda r: [r.workspace],
    "bySlurmAccount": lambda r: [r.slurm_account],
}


def day_range(start_date: str, end_date: str) -> tuple[dt.date, dt.date]:
    """Determined's ``start_date`` and ``end_date`` (``YYYY-MM-DD``, both included)."""
    days = []
    for field, value in (("start_date", start_date), ("end_date", end_date)):
        try:
            days.append(dt.date.fromisoformat(value))
        except ValueError:
            raise ClientError(f"{field}: expected a date YYYY-MM-DD, got {value!r}", field=field) from None
    first, last = days
    if last < first:
        raise ClientError("end_date: must not be before start_date", field="end_date")
    if (last - first).days > MAX_DAYS:
        raise ClientError(f"end_date: at most {MAX_DAYS} days after start_date", field="end_date")
    return first, last


def _periods(first: dt.date, last: dt.date, period: Period) -> Iterator[tuple[dt.datetime, dt.datetime]]:
    day = first if period == "daily" else first.replace(day=1)
    while day <= last:
        following = day + dt.timedelta(days=1) if period == "daily" else _next_month(day)
        yield _midnight(day), _midnight(following)
        day = following


def _next_month(day: dt.date) -> dt.date:
    return day.replace(year=day.year + 1, month=1) if day.month == 12 else day.replace(month=day.month + 1)


def _midnight(day: dt.date) -> dt.datetime:
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)


def _utc(when: dt.datetime) -> dt.datetime:
    """``when`` in UTC (a time without a zone is taken as UTC), as the database's times are."""
    return when.astimezone(dt.UTC) if when.tzinfo else when.replace(tzinfo=dt.UTC)
