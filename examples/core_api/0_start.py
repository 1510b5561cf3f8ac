"""Stage 0: a plain training script, with no platform code at all.

It fits a line ``y = w * x + b`` to noisy points by mini-batch gradient descent, in plain Python so that the
tutorial is about the Core API and not about a framework. ``time.sleep`` stands in for real work.
"""

from __future__ import annotations

import logging
import random
import time

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


def main(learning_rate: float = 0.05, max_steps: int = 200) -> None:
    train, validation = make_data(256, seed=0), make_data(64, seed=1)
    w = b = 0.0
    for step in range(max_steps):
        loss, dw, db = loss_and_gradient(w, b, batch_at(train, step))
        w, b = w - learning_rate * dw, b - learning_rate * db
        time.sleep(0.05)
        steps_completed = step + 1
        if steps_completed % 20 == 0:
            logging.info(f"step {steps_completed}: loss {loss:.4f}")
    validation_loss, _, _ = loss_and_gradient(w, b, validation)
    logging.info(f"done: w={w:.3f} b={b:.3f} validation_loss={validation_loss:.4f}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    main()
