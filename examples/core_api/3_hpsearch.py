"""Stage 3: a hyperparameter search.

NEW: the learning rate comes from the trial's hyperparameters (``det.get_cluster_info().trial.hparams``),
and the searcher decides how long each trial trains: ``core_context.searcher.operations()`` yields operations
"train until ``op.length`` steps, then report the searcher metric with ``op.report_completed()``". With
adaptive ASHA, trials that do badly at an early length get no further operation and stop there.
Off the cluster a dummy searcher asks for a single step.
"""

from __future__ import annotations

import json
import logging
import pathlib
import random
import time
from typing import Any

import determined as det

TRUE_W, TRUE_B = 3.0, 2.0
BATCH_SIZE = 16

Point = tuple[float, float]


def make_data(n: int, seed: int) -> list[Point]:
    rng = random.Random(seed)
    xs = [rng.uniform(-1.0, 1.0) for _ in range(n)]
    return [(x, TRUE_W * x + TRUE_B + rng.gauss(0.0, 0.1)) for x in xs]


def loss_and_gradient(w: float, b: float, batch: list[Point]) -> tuple[float, float, float]:
    """Mean squared error of the batch and its gradient with respect to (w, b)."""
    n = len(batch)
    errors = [(w * x + b - y, x) for x, y in batch]
    loss = sum(e * e for e, _ in errors) / n
    return loss, sum(2 * e * x for e, x in errors) / n, sum(2 * e for e, _ in errors) / n


def batch_at(data: list[Point], step: int) -> list[Point]:
    start = (step * BATCH_SIZE) % len(data)
    return data[start : start + BATCH_SIZE]


def save_state(path: pathlib.Path, w: float, b: float, steps_completed: int) -> None:
    (path / "state.json").write_text(json.dumps({"w": w, "b": b, "steps_completed": steps_completed}))


def load_state(path: pathlib.Path) -> tuple[float, float, int]:
    state = json.loads((path / "state.json").read_text())
    return state["w"], state["b"], state["steps_completed"]


def checkpoint(core_context: Any, w: float, b: float, steps_completed: int) -> None:
    with core_context.checkpoint.store_path({"steps_completed": steps_completed}) as (path, _):
        save_state(path, w, b, steps_completed)


def main(core_context: Any, latest_checkpoint: str | None, learning_rate: float) -> None:
    train, validation = make_data(256, seed=0), make_data(64, seed=1)
    w = b = 0.0
    steps_completed = 0
    if latest_checkpoint:
        with core_context.checkpoint.restore_path(latest_checkpoint) as path:
            w, b, steps_completed = load_state(path)
        logging.info(f"resumed from checkpoint {latest_checkpoint} at step {steps_completed}")
    # NEW: train as long as the searcher asks, one operation at a time.
    for op in core_context.searcher.operations():
        while steps_completed < op.length:
            loss, dw, db = loss_and_gradient(w, b, batch_at(train, steps_completed))
            w, b = w - learning_rate * dw, b - learning_rate * db
            time.sleep(0.05)
            steps_completed += 1
            if steps_completed % 20 == 0:
                logging.info(f"step {steps_completed}: loss {loss:.4f}")
                core_context.train.report_training_metrics(
                    steps_completed=steps_completed, metrics={"loss": loss}
                )
                op.report_progress(steps_completed)  # NEW: progress, for `det e list`
                checkpoint(core_context, w, b, steps_completed)
                if core_context.preempt.should_preempt():
                    logging.info(f"preempted at step {steps_completed}")
                    return
        validation_loss, _, _ = loss_and_gradient(w, b, validation)
        core_context.train.report_validation_metrics(
            steps_completed=steps_completed, metrics={"validation_loss": validation_loss}
        )
        if steps_completed % 20:
            checkpoint(core_context, w, b, steps_completed)
        # NEW: the searcher metric of this operation; the searcher compares trials with it.
        op.report_completed(validation_loss)
    logging.info(f"done: w={w:.3f} b={b:.3f} lr={learning_rate:g}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    latest_checkpoint = info.latest_checkpoint if info else None
    # NEW: this trial's hyperparameters, chosen by the searcher from 3_hpsearch.yaml.
    hparams = info.trial.hparams if info else {"learning_rate": 0.05}
    with det.core.init() as core_context:
        main(core_context, latest_checkpoint, learning_rate=hparams["learning_rate"])
