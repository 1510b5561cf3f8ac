"""Stage 2: checkpoints, and stopping cleanly when asked to (preemption).

NEW: every 20 steps the script saves its state with ``core_context.checkpoint.store_path()`` (the metadata
must hold ``steps_completed``) and then asks ``core_context.preempt.should_preempt()``. That is true when
Slurm is about to preempt the job or its time limit is near, or when you ran ``det e pause``: the script
returns, the trial becomes PAUSED, and the next run starts from ``latest_checkpoint``, in the cluster info.
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


# NEW: save and load the training state in a checkpoint directory.
def save_state(path: pathlib.Path, w: float, b: float, steps_completed: int) -> None:
    (path / "state.json").write_text(json.dumps({"w": w, "b": b, "steps_completed": steps_completed}))


def load_state(path: pathlib.Path) -> tuple[float, float, int]:
    state = json.loads((path / "state.json").read_text())
    return state["w"], state["b"], state["steps_completed"]


def main(
    core_context: Any, latest_checkpoint: str | None, learning_rate: float = 0.05, max_steps: int = 200
) -> None:
    train, validation = make_data(256, seed=0), make_data(64, seed=1)
    w = b = 0.0
    start = 0
    # NEW: resume from the latest checkpoint, if this trial has one.
    if latest_checkpoint:
        with core_context.checkpoint.restore_path(latest_checkpoint) as path:
            w, b, start = load_state(path)
        logging.info(f"resumed from checkpoint {latest_checkpoint} at step {start}")
    for step in range(start, max_steps):
        loss, dw, db = loss_and_gradient(w, b, batch_at(train, step))
        w, b = w - learning_rate * dw, b - learning_rate * db
        time.sleep(0.05)
        steps_completed = step + 1
        if steps_completed % 20 == 0:
            logging.info(f"step {steps_completed}: loss {loss:.4f}")
            core_context.train.report_training_metrics(
                steps_completed=steps_completed, metrics={"loss": loss}
            )
            # NEW: checkpoint, then stop if the platform asks us to; the next run resumes from here.
            with core_context.checkpoint.store_path({"steps_completed": steps_completed}) as (path, _):
                save_state(path, w, b, steps_completed)
            if core_context.preempt.should_preempt():
                logging.info(f"preempted at step {steps_completed}")
                return
    validation_loss, _, _ = loss_and_gradient(w, b, validation)
    core_context.train.report_validation_metrics(
        steps_completed=max_steps, metrics={"validation_loss": validation_loss}
    )
    logging.info(f"done: w={w:.3f} b={b:.3f} validation_loss={validation_loss:.4f}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    # NEW: the latest checkpoint comes with the cluster info (None off the cluster or on a first run).
    info = det.get_cluster_info()
    latest_checkpoint = info.latest_checkpoint if info else None
    with det.core.init() as core_context:
        main(core_context, latest_checkpoint)
