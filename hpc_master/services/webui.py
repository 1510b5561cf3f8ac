"""What the web UI's pages show that no CLI route gathers in one query: the experiment list with its best
metric, the trials table with each trial's current Slurm job, ASHA's rungs, metrics at one step, and one
trial's downsampled time series. Pure reads; the routes are in ``hpc_master.api.routes_ui``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import Text, func, select, type_coerce
from sqlalchemy.orm import Session

from hpc_master.db.models import (
    EventModel,
    ExperimentModel,
    MetricModel,
    TrialModel,
    TrialRunModel,
    UserModel,
)
from hpc_master.expconf import ExperimentConfig
from hpc_master.services.curves.downsample import MinMaxCurve
from hpc_master.services.curves.experiment import numeric_metrics
from hpc_master.services.experiments import normalise_states, searcher_metric
from hpc_master.services.states import LIVE_RUN_STATES
from hpc_master.services.stored_config import experiment_config, shown_config
from searcher.base import WORST_METRIC

EXPERIMENT_SORTS: dict[str, Any] = {
    "id": ExperimentModel.id,
    "name": ExperimentModel.name,
    "owner": UserModel.username,
    "state": ExperimentModel.state,
    "progress": ExperimentModel.progress,
    "startTime": ExperimentModel.start_time,
    "endTime": ExperimentModel.end_time,
    "resourcePool": ExperimentModel.resource_pool,
}


@dataclass(frozen=True)
class ExperimentRow:
    experiment: ExperimentModel
    username: str
    num_trials: int
    best_metric: float | None


def list_experiments(
    session: Session,
    *,
    name: str = "",
    states: Sequence[str] = (),
    users: Sequence[str] = (),
    archived: bool | None = None,
    sort_by: str = "id",
    descending: bool = True,
    offset: int = 0,
    limit: int = 100,
) -> tuple[list[ExperimentRow], int]:
    """A page of experiments, filtered and sorted, with each one's trial count and best searcher metric."""
    stmt = select(ExperimentModel, UserModel.username).join(
        UserModel, UserModel.id == ExperimentModel.owner_id
    )
    if name:
        escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        stmt = stmt.where(ExperimentModel.name.ilike(f"%{escaped}%", escape="\\"))
    if states:
        stmt = stmt.where(ExperimentModel.state.in_(normalise_states(states)))
    if users:
        stmt = stmt.where(UserModel.username.in_(list(users)))
    if archived is not None:
        stmt = stmt.where(ExperimentModel.archived.is_(archived))
    total = int(session.scalar(select(func.count()).select_from(stmt.subquery())) or 0)
    column = EXPERIMENT_SORTS.get(sort_by, ExperimentModel.id)
    order = [column.desc() if descending else column.asc(), ExperimentModel.id.desc()]
    stmt = stmt.order_by(*order).offset(offset)
    if limit > 0:
        stmt = stmt.limit(limit)
    return _experiment_rows(session, list(session.execute(stmt).all())), total


def _experiment_rows(session: Session, page: list[Any]) -> list[ExperimentRow]:
    """The page's (experiment, owner's name) with each one's trial count and best searcher metric."""
    ids = [e.id for e, _ in page]
    stats = {
        exp_id: (count, low, high)
        for exp_id, count, low, high in session.execute(
            select(
                TrialModel.experiment_id,
                func.count(),
                func.min(TrialModel.best_validation),
                func.max(TrialModel.best_validation),
            )
            .where(TrialModel.experiment_id.in_(ids))
            .group_by(TrialModel.experiment_id)
        )
    }
    rows = []
    for experiment, username in page:
        count, low, high = stats.get(experiment.id, (0, None, None))
        _, smaller = searcher_metric(shown_config(experiment))
        rows.append(ExperimentRow(experiment, username, int(count), low if smaller else high))
    return rows


def current_runs(session: Session, trial_ids: Sequence[int]) -> dict[int, TrialRunModel]:
    """Each trial's latest run (the live one while there is one)."""
    latest = (
        select(TrialRunModel.trial_id, func.max(TrialRunModel.run_number).label("n"))
        .where(TrialRunModel.trial_id.in_(list(trial_ids)))
        .group_by(TrialRunModel.trial_id)
        .subquery()
    )
    rows = session.scalars(
        select(TrialRunModel).join(
            latest, (TrialRunModel.trial_id == latest.c.trial_id) & (TrialRunModel.run_number == latest.c.n)
        )
    )
    return {r.trial_id: r for r in rows}


def latest_validations(session: Session, trial_ids: Sequence[int]) -> dict[int, tuple[int, dict[str, float]]]:
    """Each trial's last validation report: (steps, metrics)."""
    last = (
        select(MetricModel.trial_id, func.max(MetricModel.steps_completed).label("steps"))
        .where(MetricModel.trial_id.in_(list(trial_ids)), MetricModel.group == "validation")
        .group_by(MetricModel.trial_id)
        .subquery()
    )
    rows = session.execute(
        select(MetricModel.trial_id, MetricModel.steps_completed, type_coerce(MetricModel.metrics, Text))
        .join(last, (MetricModel.trial_id == last.c.trial_id) & (MetricModel.steps_completed == last.c.steps))
        .where(MetricModel.group == "validation")
    )
    return {trial_id: (int(steps), numeric_metrics(_loads(m))) for trial_id, steps, m in rows}


def _loads(value: Any) -> Any:
    return orjson.loads(value) if isinstance(value, str | bytes) else value


def trial_rows(session: Session, experiment_id: int) -> list[tuple[TrialModel, TrialRunModel | None, Any]]:
    trials = list(
        session.scalars(
            select(TrialModel).where(TrialModel.experiment_id == experiment_id).order_by(TrialModel.id)
        )
    )
    ids = [t.id for t in trials]
    runs = current_runs(session, ids)
    latest = latest_validations(session, ids)
    return [(t, runs.get(t.id), latest.get(t.id)) for t in trials]


def run_is_live(run: TrialRunModel | None) -> bool:
    return run is not None and run.state in LIVE_RUN_STATES


# ---------------------------------------------------------------- ASHA rungs


def _rung_lengths(config: ExperimentConfig, brackets: int) -> list[list[int]] | None:
    """Each bracket's rung lengths (in the searcher's unit), or None if the config does not say."""
    try:
        from searcher.adaptive_asha import brackets_for
        from searcher.asha import rung_lengths
        from searcher.config import parse_searcher_config

        cfg = parse_searcher_config(config.searcher_dict() or {})
        if cfg.max_length is None:
            return None
        adaptive = cfg.name == "adaptive_asha"
        rungs = [b.num_rungs for b in brackets_for(cfg)] if adaptive else [cfg.num_rungs]
        if len(rungs) != brackets:
            return None
        return [rung_lengths(cfg.max_length, cfg.divisor, n) for n in rungs]
    except Exception:  # an old or odd config: show the rungs without lengths
        return None


def searcher_rungs(session: Session, experiment: ExperimentModel) -> dict[str, Any]:
    """ASHA's rungs from the stored searcher snapshot: per rung, its trials and what became of each.

    A trial in a rung is ``promoted`` (it went on to the next rung), ``paused`` (pause promotion: it waits,
    checkpointed and holding no slots, for a later result to promote it), ``running`` (training towards this
    rung), or ``stopped``. ``resumed`` marks a trial that was paused and later promoted.
    """
    config = experiment_config(experiment)
    searcher = config.searcher
    out: dict[str, Any] = {
        "searcherType": searcher.name if searcher is not None else "",
        "promotion": getattr(searcher, "promotion", None) or "pause",
        "brackets": [],
    }
    states = _bracket_states(experiment.searcher_snapshot)
    if states is None:
        return out
    trials = {
        t.request_id: t
        for t in session.scalars(select(TrialModel).where(TrialModel.experiment_id == experiment.id))
    }
    resumed = _resumed_trials(session, [t.id for t in trials.values()])
    lengths = _rung_lengths(config, len(states))
    # The searcher keeps every metric signed so that smaller is better (searcher.base): the user reported, and
    # sees, the metric in its own direction.
    sign = 1.0 if searcher is None or searcher.smaller_is_better else -1.0
    for b, state in enumerate(states):
        rungs = _bracket_rungs(state, trials, resumed, sign, lengths[b] if lengths else None)
        out["brackets"].append({"index": b, "rungs": rungs})
    return out


def _bracket_states(snapshot: Any) -> list[dict[str, Any]] | None:
    """The state of each bracket in a searcher snapshot (one for ASHA, one per bracket for adaptive ASHA), each
    with its ``rungs``; None when the snapshot holds no such thing."""
    snapshot = snapshot or {}
    algorithm = (snapshot.get("method") or {}).get("algorithm") if isinstance(snapshot, dict) else None
    if not isinstance(algorithm, dict):
        return None
    states = algorithm.get("brackets") if "brackets" in algorithm else [algorithm]
    if not isinstance(states, list) or not all(isinstance(s, dict) and "rungs" in s for s in states):
        return None
    return states


def _resumed_trials(session: Session, trial_ids: list[int]) -> set[int]:
    """The trials of `trial_ids` that were paused and later resumed."""
    return set(
        session.scalars(
            select(EventModel.entity_id).where(
                EventModel.entity == "trial",
                EventModel.entity_id.in_(trial_ids),
                EventModel.old_state == "PAUSED",
                EventModel.new_state == "ACTIVE",
            )
        )
    )


def _bracket_rungs(
    state: dict[str, Any],
    trials: dict[str, TrialModel],
    resumed: set[int],
    sign: float,
    lengths: list[int] | None,
) -> list[dict[str, Any]]:
    """One bracket's rungs: each one's length (when known), its trials and those training towards it."""
    awaiting = set(state.get("awaiting") or [])
    at_rung = {str(rid): int(r) for rid, r in state.get("trial_rung") or []}
    rungs = []
    for r, entries in enumerate(state["rungs"]):
        rows = _rung_rows(r, entries, trials, at_rung, resumed, sign)
        training = _training_ids(r, entries, trials, at_rung, awaiting)
        rungs.append(
            {
                "index": r,
                "length": lengths[r] if lengths and r < len(lengths) else None,
                "trials": rows,
                "trainingTrialIds": training,
            }
        )
    return rungs


def _training_ids(
    r: int, entries: list[Any], trials: dict[str, TrialModel], at_rung: dict[str, int], awaiting: set[Any]
) -> list[int]:
    """The trials training towards rung `r`: awaited there and not in its `entries` yet."""
    return [
        trials[rid].id
        for rid in sorted(awaiting)
        if at_rung.get(rid) == r and rid in trials and not any(e[0] == rid for e in entries)
    ]


def _rung_rows(
    r: int,
    entries: list[Any],
    trials: dict[str, TrialModel],
    at_rung: dict[str, int],
    resumed: set[int],
    sign: float,
) -> list[dict[str, Any]]:
    """Rung `r`'s trials (its `entries`: request id, signed metric, promoted) and what became of each."""
    rows = []
    # Best first, in the metric's own direction (the signed value ascending); no value last.
    for rid, signed, promoted in sorted(entries, key=lambda e: _rank(e[1])):
        trial = trials.get(str(rid))
        status = _rung_status(trial, bool(promoted), at_rung.get(str(rid), r) > r)
        rows.append(
            {
                "trialId": trial.id if trial else None,
                "requestId": str(rid),
                "metric": sign * signed if _reported(signed) else None,
                "status": status,
                "resumed": bool(trial and trial.id in resumed),
                "state": f"STATE_{trial.state}" if trial else None,
            }
        )
    return rows


def _reported(signed: Any) -> bool:
    """A metric the trial reported: not NaN, not the searcher's stand-in for "no value" (±inf, float max)."""
    return isinstance(signed, int | float) and signed == signed and abs(signed) < WORST_METRIC


def _rank(signed: Any) -> tuple[int, float]:
    return (0, float(signed)) if _reported(signed) else (1, 0.0)


def _rung_status(trial: TrialModel | None, promoted: bool, moved_on: bool) -> str:
    if promoted or moved_on:
        return "promoted"
    if trial is None:
        return "stopped"
    if trial.state == "PAUSED":
        return "paused"
    if trial.state in ("ACTIVE", "STOPPING_COMPLETED"):
        return "running"
    return "stopped"


# ---------------------------------------------------------------- metrics at a step, one trial's series


def trials_snapshot(
    session: Session, experiment_id: int, group: str, name: str, steps: int, margin: int
) -> list[tuple[TrialModel, float, int]]:
    """Each trial's ``name`` at the report closest to ``steps`` (within ``margin``): (trial, value, steps)."""
    trials = {
        t.id: t for t in session.scalars(select(TrialModel).where(TrialModel.experiment_id == experiment_id))
    }
    rows = session.execute(
        select(
            MetricModel.trial_id, MetricModel.steps_completed, type_coerce(MetricModel.metrics, Text)
        ).where(
            MetricModel.trial_id.in_(list(trials)),
            MetricModel.group == group,
            MetricModel.steps_completed >= steps - margin,
            MetricModel.steps_completed <= steps + margin,
        )
    )
    best: dict[int, tuple[int, float, int]] = {}
    for trial_id, at, metrics in rows:
        value = numeric_metrics(_loads(metrics)).get(name)
        if value is None:
            continue
        distance = abs(int(at) - steps)
        if trial_id not in best or distance < best[trial_id][0]:
            best[trial_id] = (distance, value, int(at))
    return [(trials[tid], value, at) for tid, (_, value, at) in sorted(best.items())]


def time_series(
    session: Session,
    trial_id: int,
    group: str | None,
    names: Sequence[str],
    max_points: int,
    start: int,
    end: int | None,
) -> dict[str, list[dict[str, Any]]]:
    """Group → data points ``{batches, values, time}``, downsampled: for each metric, each bucket's min and
    max report are kept, and a kept report carries all its metrics."""
    stmt = select(
        MetricModel.group,
        MetricModel.steps_completed,
        MetricModel.report_time,
        type_coerce(MetricModel.metrics, Text),
    ).where(MetricModel.trial_id == trial_id, MetricModel.steps_completed >= start)
    if group:
        stmt = stmt.where(MetricModel.group == group)
    if end is not None:
        stmt = stmt.where(MetricModel.steps_completed <= end)
    reports: dict[str, dict[int, tuple[dt.datetime, dict[str, float]]]] = {}
    for g, steps, time, metrics in session.execute(stmt.order_by(MetricModel.trial_run_id)):
        values = numeric_metrics(_loads(metrics))
        if names:
            values = {k: v for k, v in values.items() if k in names}
        reports.setdefault(g, {})[int(steps)] = (time, values)  # a later run's report at a step wins
    return {g: _downsampled(by_step, max_points) for g, by_step in reports.items()}


def _downsampled(
    by_step: dict[int, tuple[dt.datetime, dict[str, float]]], max_points: int
) -> list[dict[str, Any]]:
    """One group's reports by step, downsampled: each metric's min and max report per bucket, in step order."""
    curves: dict[str, MinMaxCurve] = {}
    for steps, (_, values) in by_step.items():
        for name, value in values.items():
            curve = curves.get(name)
            if curve is None:
                curve = curves[name] = MinMaxCurve(max_buckets=max(2, max_points // 2 - 1))
            curve.add(steps, value)
    keep = sorted({s for c in curves.values() for s, _ in c.points(max_points)})
    return [
        {"batches": s, "values": by_step[s][1], "time": by_step[s][0].isoformat().replace("+00:00", "Z")}
        for s in keep
    ]


# ---------------------------------------------------------------- the cluster page's queue

QUEUED_LIMIT = 500


@dataclass(frozen=True)
class QueuedRun:
    run: TrialRunModel
    experiment_id: int
    experiment_name: str
    username: str


def queued_runs(session: Session, limit: int = QUEUED_LIMIT) -> list[QueuedRun]:
    """The platform's PENDING trial runs, oldest first: waiting in Slurm (submitted) or in the master (held
    back before sbatch); each run says why and since when (``pending_reason``/``pending_since``) once known."""
    rows = session.execute(
        select(TrialRunModel, ExperimentModel.id, ExperimentModel.name, UserModel.username)
        .join(TrialModel, TrialModel.id == TrialRunModel.trial_id)
        .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
        .join(UserModel, UserModel.id == ExperimentModel.owner_id)
        .where(TrialRunModel.state == "PENDING")
        .order_by(TrialRunModel.submit_time, TrialRunModel.id)
        .limit(limit)
    ).all()
    return [QueuedRun(run, exp_id, name or "", username) for run, exp_id, name, username in rows]
