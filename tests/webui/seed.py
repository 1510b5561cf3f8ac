"""Experiments written straight into the database, for the web UI's tests and benchmark (no Slurm)."""

from __future__ import annotations

import datetime as dt
import math
import random
import uuid
from typing import Any

import yaml
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from hpc_master import auth
from hpc_master.db.models import (
    CheckpointModel,
    EventModel,
    ExperimentModel,
    MetricModel,
    TrialModel,
    TrialRunModel,
    UserModel,
    utcnow,
)


def seed_user(session: Session, username: str, password: str, *, admin: bool = False) -> int:
    existing = session.scalar(select(UserModel).where(UserModel.username == username))
    if existing is not None:
        existing.password_hash = auth.hash_password(password)
        existing.admin = admin or existing.admin
        session.flush()
        return existing.id
    user = UserModel(username=username, password_hash=auth.hash_password(password), admin=admin)
    session.add(user)
    session.flush()
    return user.id


def curve(trial: int, step: int, lr: float) -> float:
    """A plausible training loss: decays at a rate set by the learning rate, with a little noise."""
    rng = random.Random(trial * 1_000_003 + step)
    rate = 0.2 + 4 * min(lr, 0.5)
    return 0.08 + 2.2 * math.exp(-rate * step / 2000) * (1 + 0.25 * (trial % 7) / 7) + rng.gauss(0, 0.03)


def seed_experiment(
    session: Session,
    owner_id: int,
    *,
    name: str,
    trials: int,
    points: int,
    state: str = "COMPLETED",
    every: int = 10,
    validations: int = 10,
    asha: bool = False,
    metrics_chunk: int = 50_000,
    write_metrics: bool = True,
) -> tuple[int, list[int]]:
    """An experiment of ``trials`` trials, each with ``points`` training reports (``loss``) every ``every``
    batches and ``validations`` validation reports (``validation_loss``, ``accuracy``); a run and a
    checkpoint per trial (``write_metrics=False``: no metric rows; the benchmark writes its own, faster).
    ``asha``: an async_halving search of 3 rungs with a stored searcher snapshot in
    which some trials were promoted, some are paused waiting for promotion and one was resumed."""
    max_length = points * every
    searcher: dict[str, Any] = {
        "name": "async_halving" if asha else "random",
        "metric": "validation_loss",
        "smaller_is_better": True,
        "max_trials": trials,
        "max_length": {"batches": max_length},
    }
    if asha:
        searcher.update(num_rungs=3, divisor=3)
    config = {
        "name": name,
        "entrypoint": "python3 train.py",
        "searcher": searcher,
        "hyperparameters": {
            "lr": {"type": "log", "base": 10, "minval": -4, "maxval": -0.5},
            "layers": {"type": "int", "minval": 1, "maxval": 6},
            "optimizer": {"type": "categorical", "vals": ["adam", "sgd"]},
        },
        "resources": {"slots_per_trial": 1},
        "slurm": {"partition": "batch"},
    }
    started = utcnow() - dt.timedelta(hours=2)
    experiment = ExperimentModel(
        owner_id=owner_id,
        name=name,
        state=state,
        config_text=yaml.safe_dump(config, sort_keys=False),
        config=config,
        progress=1.0 if state == "COMPLETED" else 0.4,
        start_time=started,
        end_time=utcnow() if state == "COMPLETED" else None,
    )
    session.add(experiment)
    session.flush()
    rng = random.Random(experiment.id)
    ids: list[int] = []
    rows: list[dict[str, Any]] = []
    for t in range(trials):
        lr = 10 ** rng.uniform(-4, -0.5)
        hparams = {"lr": lr, "layers": rng.randint(1, 6), "optimizer": rng.choice(["adam", "sgd"])}
        finals = curve(t, max_length, lr)
        trial = TrialModel(
            experiment_id=experiment.id,
            request_id=uuid.UUID(int=rng.getrandbits(128)).hex,
            hparams=hparams,
            state="COMPLETED" if state == "COMPLETED" else "ACTIVE",
            steps_completed=max_length,
            best_validation=finals,
            searcher_metric=finals,
            run_id=1,
            start_time=started + dt.timedelta(seconds=t),
            end_time=utcnow() if state == "COMPLETED" else None,
        )
        session.add(trial)
        session.flush()
        ids.append(trial.id)
        session.add(
            TrialRunModel(
                trial_id=trial.id,
                run_number=1,
                slurm_job_id=str(1000 + trial.id),
                node_list=f"det-node{t % 2 + 1}",
                state="COMPLETED" if state == "COMPLETED" else "RUNNING",
                exit_reason="SEARCHER_DONE" if state == "COMPLETED" else None,
                start_time=started,
                end_time=utcnow() if state == "COMPLETED" else None,
            )
        )
        session.add(
            CheckpointModel(
                uuid=str(uuid.UUID(int=rng.getrandbits(128))),
                trial_id=trial.id,
                trial_run_id=1,
                steps_completed=max_length,
                resources={"model.pt": 1_234_567, "optimizer.pt": 2_345_678},
            )
        )
        now = utcnow()
        if not write_metrics:
            continue
        for i in range(points):
            step = (i + 1) * every
            rows.append(_row(trial.id, "training", step, {"loss": curve(t, step, lr)}, now))
        for v in range(validations):
            step = max_length * (v + 1) // validations
            loss = curve(t, step, lr) + 0.05
            rows.append(
                _row(trial.id, "validation", step, {"validation_loss": loss, "accuracy": 1 - loss / 2.5}, now)
            )
        if len(rows) >= metrics_chunk:
            session.execute(insert(MetricModel.__table__), rows)
            rows = []
    if rows:
        session.execute(insert(MetricModel.__table__), rows)
    if asha:
        _asha_snapshot(session, experiment, ids)
    return experiment.id, ids


def _row(trial_id: int, group: str, step: int, metrics: dict[str, float], now: dt.datetime) -> dict[str, Any]:
    return {
        "trial_id": trial_id,
        "trial_run_id": 1,
        "group": group,
        "steps_completed": step,
        "metrics": {"avgMetrics": metrics},
        "report_time": now,
    }


def _asha_snapshot(session: Session, experiment: ExperimentModel, ids: list[int]) -> None:
    """Rung 1: every trial; the best third promoted; two of the rest PAUSED waiting for promotion, one of
    them resumed once before. Rung 2: the promoted, the best promoted again. Rung 3: one trial training."""
    trials = [session.get(TrialModel, i) for i in ids]
    ranked = sorted((t for t in trials if t is not None), key=lambda t: t.best_validation or 0)
    promoted = ranked[: max(1, len(ranked) // 3)]
    rung0 = [[t.request_id, t.best_validation, t in promoted] for t in ranked]
    rung1 = [[t.request_id, (t.best_validation or 0) - 0.01, i == 0] for i, t in enumerate(promoted)]
    waiting = [t for t in ranked if t not in promoted][:2]
    for t in waiting:
        t.state = "PAUSED"
        t.pause_reason = "PAUSED_BY_SEARCHER"
    if waiting:
        session.add(
            EventModel(entity="trial", entity_id=waiting[0].id, old_state="PAUSED", new_state="ACTIVE")
        )
    experiment.state = "ACTIVE"
    experiment.searcher_snapshot = {
        "format": 1,
        "method": {
            "method": "async_halving",
            "algorithm": {
                "rungs": [rung0, rung1, []],
                "trial_rung": [[t.request_id, 0] for t in ranked if t not in promoted]
                + [[t.request_id, 1] for t in promoted[1:]]
                + [[promoted[0].request_id, 2]],
                "awaiting": [promoted[0].request_id],
                "early_exit": [],
                "finished": [],
                "invalid": 0,
                "completed": 0,
            },
        },
    }
    promoted[0].state = "ACTIVE"


def seed_searched_experiment(
    session: Session, owner_id: int, *, name: str, metric: str, smaller_is_better: bool, values: list[float]
) -> tuple[int, list[int]]:
    """An ASHA search (2 rungs of 100 and 200 batches) whose stored snapshot is the real searcher's: one trial
    per value, each reporting it at the first rung, in the order given. The searcher keeps metrics signed so
    that smaller is better, as it does in the master."""
    from searcher import Create, make_search_method

    searcher_cfg: dict[str, Any] = {
        "name": "async_halving", "metric": metric, "smaller_is_better": smaller_is_better,
        "max_trials": len(values), "max_concurrent_trials": len(values), "num_rungs": 2, "divisor": 2,
        "max_length": {"batches": 200},
    }  # fmt: skip
    hyperparameters = {"lr": {"type": "double", "minval": 0.001, "maxval": 0.1}}
    config = {"name": name, "entrypoint": "python3 train.py", "searcher": searcher_cfg,
              "hyperparameters": hyperparameters, "resources": {"slots_per_trial": 1}}  # fmt: skip
    experiment = ExperimentModel(
        owner_id=owner_id, name=name, state="ACTIVE", config=config, progress=0.3,
        config_text=yaml.safe_dump(config, sort_keys=False), start_time=utcnow() - dt.timedelta(hours=1),
    )  # fmt: skip
    session.add(experiment)
    session.flush()
    method = make_search_method(searcher_cfg, hyperparameters, seed=7)
    creates = [a for a in method.initial_actions() if isinstance(a, Create)]
    assert len(creates) == len(values)
    ids = []
    for create in creates:
        trial = TrialModel(experiment_id=experiment.id, request_id=create.request_id, hparams=create.hparams,
                           state="ACTIVE", steps_completed=0)  # fmt: skip
        session.add(trial)
        session.flush()
        method.on_trial_created(create.request_id, trial.id)
        ids.append(trial.id)
    for trial_id, value in zip(ids, values, strict=True):
        method.on_validation_completed(trial_id, value, 100)
        trial = session.get(TrialModel, trial_id)
        assert trial is not None
        trial.steps_completed, trial.searcher_metric, trial.best_validation = 100, value, value
    experiment.searcher_snapshot = {"format": 1, "method": method.snapshot(), "closed": [], "shutDown": False}
    session.flush()
    return experiment.id, ids
