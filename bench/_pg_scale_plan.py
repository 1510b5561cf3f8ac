"""What ``bench/pg_scale_reads.py`` writes: experiments whose trials come from the real search methods.

Each experiment's searcher (``adaptive_asha`` for large ones, ``random`` for small ones, ``single`` for one
trial) is driven by ``searcher.simulate`` against synthetic learning curves, with trial ids offset into
the database's id range, so its stored searcher snapshot is the one the master would have written, and the
trials' lengths, validations, pauses, resumes and errors are the ones that search produced. Experiments that
are not COMPLETED are cut at a random point of their search (``max_time_s``). A second simulation at a
scaled ``max_length`` makes the trained batches match the metric rows asked for (one training report every
``REPORT_EVERY`` batches, one validation report per ``VALIDATION_EVERY`` training reports).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

from searcher import Create, Pause, Resume, Stop, ValidateAfter, make_search_method
from searcher.simulate import SimConfig, SyntheticCurves, simulate

REPORT_EVERY = 10
"""Batches between two training reports (the rows' ``steps_completed`` spacing, about)."""
VALIDATION_EVERY = 10
WORKERS = 16
"""Trials of one experiment running at once (``max_concurrent_trials``)."""
USERS = ("admin", "determined", "alice", "bob", "carol", "dave")
OWNERS = (("alice", 5), ("bob", 3), ("carol", 2), ("dave", 1), ("admin", 1))
HPARAMS: dict[str, Any] = {
    "lr": {"type": "log", "base": 10, "minval": -4, "maxval": -0.5},
    "layers": {"type": "int", "minval": 1, "maxval": 6},
    "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5},
    "optimizer": {"type": "categorical", "vals": ["adam", "sgd", "adamw"]},
}
STATE_SHARES = (("ACTIVE", 0.05), ("PAUSED", 0.03), ("ERROR", 0.03), ("CANCELED", 0.04))


@dataclass
class TrialPlan:
    id: int
    request_id: str
    hparams: dict[str, Any]
    seed: int
    validations: list[tuple[int, float]] = field(default_factory=list)
    target: int | None = None
    paused: bool = False
    resumes: int = 0
    stopped: bool = False
    errored: bool = False
    closed: bool = False
    state: str = ""
    units: int = 0
    rows: int = 0
    live: str | None = None
    """The trial's live run: RUNNING or PENDING (in Slurm), None when it has none."""


@dataclass
class ExperimentPlan:
    id: int
    owner: str
    name: str
    state: str
    config: dict[str, Any]
    trials: list[TrialPlan]
    snapshot: dict[str, Any]
    progress: float
    age_days: float


class _Recorder:
    """A search method as ``simulate`` drives it, with trial ids offset into the database's range; records
    what became of each trial."""

    def __init__(self, method: Any, first_id: int) -> None:
        self.method = method
        self.off = first_id - 1
        self.trials: dict[int, TrialPlan] = {}
        self.shut_down = False
        self._created: dict[str, Create] = {}

    def _out(self, actions: list[Any]) -> list[Any]:
        out = []
        for a in actions:
            if isinstance(a, Create):
                self._created[a.request_id] = a
            elif isinstance(a, ValidateAfter | Pause | Resume | Stop):
                t = self.trials[a.trial_id]
                if isinstance(a, ValidateAfter):
                    t.target = a.length
                elif isinstance(a, Pause):
                    t.paused = True
                elif isinstance(a, Resume):
                    t.paused, t.resumes = False, t.resumes + 1
                else:
                    t.stopped = True
                a = dataclasses.replace(a, trial_id=a.trial_id - self.off)
            else:
                self.shut_down = True
            out.append(a)
        return out

    def initial_actions(self) -> list[Any]:
        return self._out(self.method.initial_actions())

    def on_trial_created(self, request_id: str, trial_id: int) -> list[Any]:
        c = self._created.pop(request_id)
        db_id = trial_id + self.off
        self.trials[db_id] = TrialPlan(db_id, request_id, dict(c.hparams), c.trial_seed)
        return self._out(self.method.on_trial_created(request_id, db_id))

    def on_validation_completed(self, trial_id: int, metric: float, units_completed: int) -> list[Any]:
        self.trials[trial_id + self.off].validations.append((units_completed, metric))
        return self._out(self.method.on_validation_completed(trial_id + self.off, metric, units_completed))

    def on_trial_exited_early(self, trial_id: int, reason: Any) -> list[Any]:
        self.trials[trial_id + self.off].errored = True
        return self._out(self.method.on_trial_exited_early(trial_id + self.off, reason))

    def on_trial_closed(self, trial_id: int) -> list[Any]:
        self.trials[trial_id + self.off].closed = True
        return self._out(self.method.on_trial_closed(trial_id + self.off))


def _searcher(size: int, max_length: int) -> dict[str, Any]:
    base = {"metric": "validation_loss", "smaller_is_better": True, "max_length": {"batches": max_length}}
    if size == 1:
        return {"name": "single", **base}
    if size < 40:
        return {"name": "random", "max_trials": size, "max_concurrent_trials": WORKERS, **base}
    return {
        "name": "adaptive_asha",
        "max_trials": size,
        "max_concurrent_trials": WORKERS,
        "max_rungs": 4,
        **base,
    }


def _run(searcher: dict[str, Any], seed: int, first_id: int, cut_s: float | None) -> tuple[_Recorder, Any]:
    method = make_search_method(searcher, HPARAMS, seed=seed)
    recorder = _Recorder(method, first_id)
    length = int(searcher["max_length"]["batches"])
    sim = SimConfig(workers=WORKERS, error_rate=0.02, seed=seed, max_time_s=cut_s, final_length=length)
    summary = simulate(recorder, SyntheticCurves(horizon=length, seed=seed), sim)
    return recorder, summary


def _sizes(trials: int, experiments: int) -> list[int]:
    """Trials per experiment, largest first: a long tail of small searches, every tenth a single trial."""
    weights = [(i + 1) ** -1.15 for i in range(experiments)]
    sizes = [max(1, int(trials * w / sum(weights))) for w in weights]
    for i in range(9, experiments, 10):
        sizes[i] = 1
    sizes[0] += trials - sum(sizes)
    return sizes


def _states(experiments: int, rng: random.Random) -> list[str]:
    states = ["COMPLETED"] * experiments
    states[0] = "ACTIVE"  # the largest search is the one running
    others = list(range(1, experiments))
    rng.shuffle(others)
    for state, share in STATE_SHARES:
        for _ in range(max(1, round(experiments * share)) - (state == "ACTIVE")):
            if others:
                states[others.pop()] = state
    return states


def _close_out(rec: _Recorder, state: str, rng: random.Random) -> None:
    """Each trial's state, trained units and live run, as the master would have them."""
    running = 0
    for t in rec.trials.values():
        done = max((u for u, _ in t.validations), default=0)
        t.units = done
        if t.closed:
            t.state = "ERROR" if t.errored else "COMPLETED"
            if t.errored and t.target:
                t.units = max(done, int(t.target * rng.uniform(0.3, 0.9)))
        elif t.paused:
            t.state = {"CANCELED": "CANCELED", "ERROR": "ERROR"}.get(state, "PAUSED")
        elif state == "ACTIVE":
            t.state = "ACTIVE"
            t.live = "RUNNING" if running < WORKERS * 3 // 4 else "PENDING"  # the rest queued in Slurm
            if t.live == "RUNNING" and t.target:
                t.units = max(done, done + int((t.target - done) * rng.uniform(0.1, 0.9)))
            running += 1
        else:
            t.state = {"PAUSED": "PAUSED", "CANCELED": "CANCELED", "ERROR": "ERROR"}[state]


def plan_experiments(trials: int, rows: int, seed: int = 0) -> list[ExperimentPlan]:
    """~``trials``/100 experiments (5 to 100) totalling ``trials`` trials and ``rows`` metric rows."""
    rng = random.Random(seed)
    count = max(1, min(100, trials // 100)) if trials >= 5 else 1
    sizes = _sizes(trials, count)
    states = _states(count, rng)
    nominal = [rng.choice((1_000, 2_000, 5_000, 10_000)) for _ in range(count)]
    cut_at = [rng.uniform(0.35, 0.8) for _ in range(count)]
    # Lengths scaled so that the reports (one every REPORT_EVERY batches, plus validations) add up to `rows`:
    # a first pass at nominal lengths says how many batches the searches train.
    units = sum(int(_run(_searcher(sizes[i], nominal[i]), i, 1, None)[1].units_trained) for i in range(count))
    scale = rows * REPORT_EVERY * VALIDATION_EVERY / (VALIDATION_EVERY + 1) / max(1, units)
    searchers = [_searcher(sizes[i], max(WORKERS, round(nominal[i] * scale))) for i in range(count)]
    cuts: list[float | None] = [None] * count
    for i in range(count):
        if states[i] != "COMPLETED":  # cut short: fewer trials than asked; completed ones make up for it
            cuts[i] = float(_run(searchers[i], i, 1, None)[1].makespan_s) * cut_at[i]
            sizes[i] = len(_run(searchers[i], i, 1, cuts[i])[0].trials)
    done = [i for i in range(count) if states[i] == "COMPLETED" and sizes[i] > 1]
    missing = trials - sum(sizes)
    for k, i in enumerate(done):
        sizes[i] += missing // len(done) + (k < missing % len(done))
        searchers[i] = _searcher(sizes[i], int(searchers[i]["max_length"]["batches"]))
    order = list(range(count))
    rng.shuffle(order)
    plans: list[ExperimentPlan] = []
    next_id = 1
    for exp_id, i in enumerate(order, start=1):
        rec, _ = _run(searchers[i], i, next_id, cuts[i])
        _close_out(rec, states[i], rng)
        plans.append(_experiment(exp_id, i, states[i], searchers[i], rec, count, rng))
        next_id += len(rec.trials)
    if next_id - 1 != trials:
        raise RuntimeError(f"planned {next_id - 1} trials, not {trials}")
    _allocate_rows(plans, rows)
    return plans


def _experiment(
    exp_id: int, i: int, state: str, searcher: dict[str, Any], rec: _Recorder, count: int, rng: random.Random
) -> ExperimentPlan:
    owner = rng.choices([o for o, _ in OWNERS], [w for _, w in OWNERS])[0]
    name = f"{searcher['name']}-{exp_id}"
    config = {
        "name": name,
        "entrypoint": "python3 train.py",
        "searcher": searcher,
        "hyperparameters": HPARAMS,
        "reproducibility": {"experiment_seed": i},
        "resources": {"slots_per_trial": 1},
        "slurm": {"partition": "batch"},
    }
    snapshot = {
        "format": 1,
        "method": rec.method.snapshot(),
        "closed": sorted(t.id for t in rec.trials.values() if t.closed),
        "shutDown": rec.shut_down,
    }
    trials = sorted(rec.trials.values(), key=lambda t: t.id)
    age_days = (count - exp_id) * 90 / count + rng.uniform(0, 0.5)
    return ExperimentPlan(
        exp_id, owner, name, state, config, trials, snapshot, float(rec.method.progress()), age_days
    )


def _allocate_rows(plans: list[ExperimentPlan], rows: int) -> None:
    """Metric rows per trial in proportion to the batches it trained (largest remainder: exactly `rows`)."""
    every = [t for p in plans for t in p.trials]
    total = sum(t.units for t in every) or 1
    shares = [rows * t.units / total for t in every]
    for t, s in zip(every, shares, strict=True):
        t.rows = min(int(s), t.units)
    left = rows - sum(t.rows for t in every)
    by_remainder = sorted(range(len(every)), key=lambda k: shares[k] - int(shares[k]), reverse=True)
    for k in by_remainder:
        if left <= 0:
            break
        if every[k].rows < every[k].units:
            every[k].rows += 1
            left -= 1
