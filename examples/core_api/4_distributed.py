"""Stage 4: the same training across many processes and nodes.

NEW: 4_distributed.yaml asks for 4 slots and starts the script under ``python3 -m
determined.launch.torch_distributed``: one process per slot (2 nodes x 2 on the local cluster), every line of
output prefixed with ``[rank=N]``. ``DistributedContext.from_torch_distributed()`` reads the ranks from the
launcher's environment. Each rank computes the gradient on its share of every batch and
``core_context.distributed.allgather()`` combines them, so all ranks take the same step. Only the chief
(rank 0) reports metrics, writes checkpoints and answers the searcher; every rank asks ``should_preempt()``
(they all get the same answer).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import random
import socket
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


# NEW: every rank computes on its share of the batch; allgather combines the shares on every rank.
def distributed_loss_and_gradient(
    core_context: Any, w: float, b: float, batch: list[Point]
) -> tuple[float, float, float]:
    dist = core_context.distributed
    mine = batch[dist.rank :: dist.size]
    loss, dw, db = loss_and_gradient(w, b, mine)
    shares = dist.allgather((len(mine), loss, dw, db))
    n = sum(share[0] for share in shares)
    loss, dw, db = (sum(share[0] * share[i] for share in shares) / n for i in (1, 2, 3))
    return loss, dw, db


def main(core_context: Any, latest_checkpoint: str | None, learning_rate: float) -> None:
    rank, size = core_context.distributed.rank, core_context.distributed.size
    print(f"rank {rank} of {size} on {socket.gethostname()}", flush=True)
    train, validation = make_data(256, seed=0), make_data(64, seed=1)
    w = b = 0.0
    steps_completed = 0
    if latest_checkpoint:
        with core_context.checkpoint.restore_path(latest_checkpoint) as path:
            w, b, steps_completed = load_state(path)
        logging.info(f"resumed from checkpoint {latest_checkpoint} at step {steps_completed}")
    for op in core_context.searcher.operations():
        while steps_completed < op.length:
            loss, dw, db = distributed_loss_and_gradient(core_context, w, b, batch_at(train, steps_completed))
            w, b = w - learning_rate * dw, b - learning_rate * db
            time.sleep(0.05)
            steps_completed += 1
            if steps_completed % 20 == 0:
                # NEW: only the chief reports and checkpoints; every rank asks about preemption.
                if rank == 0:
                    logging.info(f"step {steps_completed}: loss {loss:.4f}")
                    core_context.train.report_training_metrics(
                        steps_completed=steps_completed, metrics={"loss": loss}
                    )
                    op.report_progress(steps_completed)
                    checkpoint(core_context, w, b, steps_completed)
                if core_context.preempt.should_preempt():
                    logging.info(f"preempted at step {steps_completed}")
                    return
        validation_loss, _, _ = distributed_loss_and_gradient(core_context, w, b, validation)
        if rank == 0:
            core_context.train.report_validation_metrics(
                steps_completed=steps_completed, metrics={"validation_loss": validation_loss}
            )
            if steps_completed % 20:
                checkpoint(core_context, w, b, steps_completed)
            op.report_completed(validation_loss)
    if rank == 0:
        logging.info(f"done: w={w:.3f} b={b:.3f} lr={learning_rate:g} on {size} ranks")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    latest_checkpoint = info.latest_checkpoint if info else None
    hparams = info.trial.hparams if info else {"learning_rate": 0.05}
    # NEW: the ranks, from the launcher's environment (None: a single process, no launcher).
    distributed = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        distributed = det.core.DistributedContext.from_torch_distributed()
    with det.core.init(distributed=distributed) as core_context:
        main(core_context, latest_checkpoint, learning_rate=hparams["learning_rate"])
