"""Stage 1: report metrics to the master.

NEW: ``det.core.init()`` gives a Core API context; ``core_context.train.report_training_metrics()`` and
``report_validation_metrics()`` send metrics (batched in the background), which ``det trial describe
--metrics`` and the searcher see. Off the cluster the same script runs too: the context just logs them.
"""

from __future__ import annotations

import logging
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


def main(core_context: Any, learning_rate: float = 0.05, max_steps: int = 200) -> None:
    train, validation = make_data(256, seed=0), make_data(64, seed=1)
    w = b = 0.0
    for step in range(max_steps):
        loss, dw, db = loss_and_gradient(w, b, batch_at(train, step))
        w, b = w - learning_rate * dw, b - learning_rate * db
        time.sleep(0.05)
        steps_completed = step + 1
        if steps_completed % 20 == 0:
            logging.info(f"step {steps_completed}: loss {loss:.4f}")
            # NEW: report training metrics.
            core_context.train.report_training_metrics(
                steps_completed=steps_completed, metrics={"loss": loss}
            )
    validation_loss, _, _ = loss_and_gradient(w, b, validation)
    # NEW: report validation metrics.
    core_context.train.report_validation_metrics(
        steps_completed=max_steps, metrics={"validation_loss": validation_loss}
    )
    logging.info(f"done: w={w:.3f} b={b:.3f} validation_loss={validation_loss:.4f}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    # NEW: the Core API context, for the whole run.
    with det.core.init() as core_context:
        main(core_context)
