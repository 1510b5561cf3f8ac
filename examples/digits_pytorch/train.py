"""Digits CNN with the Core API: metrics, checkpoints, preemption, the searcher and distributed training.

On the cluster (``det e create const.yaml .``) the searcher decides how many batches to train: each operation
says "train until N batches, then validate and report the searcher metric". Every validation is followed by a
checkpoint (``steps_completed`` in its metadata); a resumed run (pause, preemption, time limit, restart)
starts from ``latest_checkpoint`` and trains on exactly the batches an uninterrupted run would have seen.

With ``slots_per_trial > 1`` the platform starts it under ``python3 -m determined.launch.torch_distributed``:
one process per slot across nodes, torch DDP (gloo on CPU), each rank training on its share of every global
batch. Only the chief (rank 0) reports metrics and writes checkpoints; every rank asks ``should_preempt()``.

Off the cluster ``python3 train.py`` trains the const.yaml hyperparameters for 300 batches and prints metrics.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import determined as det
import torch
import torch.distributed as dist
import torch.nn.functional as F
from data import build_model, load_split
from torch import nn

OFF_CLUSTER_HPARAMS = {"learning_rate": 0.01, "n_filters": 16, "dropout": 0.25, "global_batch_size": 32}
OFF_CLUSTER_BATCHES = 300
REPORT_EVERY = 10  # batches between training-metric reports (and preemption checks)


def batch_order(n_records: int, batch_size: int, seed: int, epoch: int) -> list[torch.Tensor]:
    """The global batches of one epoch: a permutation seeded by (seed, epoch), the short tail dropped."""
    order = torch.randperm(n_records, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return [order[i : i + batch_size] for i in range(0, n_records - batch_size + 1, batch_size)]


def evaluate(model: nn.Module, data: torch.utils.data.TensorDataset) -> dict[str, float]:
    """Loss and accuracy on the whole validation set (every rank computes it; it is 360 images)."""
    model = getattr(model, "module", model)  # the plain module under DDP: no collective in eval
    images, labels = data.tensors
    model.eval()
    with torch.no_grad():
        logits = model(images)
    model.train()
    return {
        "validation_loss": F.cross_entropy(logits, labels).item(),
        "validation_accuracy": (logits.argmax(1) == labels).float().mean().item(),
    }


class Job:
    """One trial's training state: the model, the optimizer and how many batches it has trained."""

    def __init__(self, core_context: Any, hparams: dict[str, Any], seed: int) -> None:
        self.core = core_context
        self.rank = core_context.distributed.rank
        self.size = core_context.distributed.size
        self.seed = seed
        self.batch_size = int(hparams["global_batch_size"])
        self.train_data, self.val_data = load_split()
        torch.manual_seed(seed)
        model = build_model(int(hparams["n_filters"]), float(hparams["dropout"]))
        self.model: nn.Module = nn.parallel.DistributedDataParallel(model) if self.size > 1 else model
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=float(hparams["learning_rate"]))
        self.steps = 0
        self.last_checkpoint = -1
        self.epoch_len = len(self.train_data) // self.batch_size

    # -- checkpoints -----------------------------------------------------------------------------------
    def save(self) -> None:
        if self.rank == 0:
            with self.core.checkpoint.store_path({"steps_completed": self.steps}) as (path, storage_id):
                state = {
                    "model": getattr(self.model, "module", self.model).state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "steps": self.steps,
                    "rng": torch.get_rng_state(),
                }
                torch.save(state, Path(path) / "state.pt")
            logging.info("checkpoint %s at batch %d", storage_id, self.steps)
        self.last_checkpoint = self.steps

    def load(self, storage_id: str) -> None:
        with self.core.checkpoint.restore_path(storage_id) as path:
            state = torch.load(Path(path) / "state.pt", weights_only=False)
        getattr(self.model, "module", self.model).load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        self.steps = self.last_checkpoint = int(state["steps"])
        print(f"resumed from checkpoint {storage_id} at batch {self.steps}", flush=True)

    # -- training ----------------------------------------------------------------------------------------
    def train_batch(self) -> float:
        epoch, index = divmod(self.steps, self.epoch_len)
        global_batch = batch_order(len(self.train_data), self.batch_size, self.seed, epoch)[index]
        images, labels = self.train_data[global_batch[self.rank :: self.size]]
        loss = F.cross_entropy(self.model(images), labels)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        return float(loss.item())

    def train_until(self, target: int, op: Any) -> bool:
        """Train until ``target`` batches; False when preempted (after a checkpoint)."""
        losses: list[float] = []
        while self.steps < target:
            losses.append(self.train_batch())
            if self.steps % self.epoch_len == 0 and self.steps != target:
                self.validate()  # one learning-curve point per epoch; the searcher's comes at the op's end
            if self.steps % REPORT_EVERY == 0 or self.steps == target:
                mean = sum(losses) / len(losses)
                losses = []
                if self.rank == 0:
                    self.core.train.report_training_metrics(
                        steps_completed=self.steps,
                        metrics={"loss": mean, "epoch": self.steps / self.epoch_len},
                    )
                    if op is not None:
                        op.report_progress(self.steps)
                if self.core.preempt.should_preempt():  # every rank asks; the answer is the same everywhere
                    if self.last_checkpoint != self.steps:
                        self.save()
                    print(f"preempted at batch {self.steps}", flush=True)
                    return False
        return True

    def validate(self) -> dict[str, float]:
        metrics = evaluate(self.model, self.val_data)
        if self.rank == 0:
            self.core.train.report_validation_metrics(steps_completed=self.steps, metrics=metrics)
        return metrics


def operations(core_context: Any, on_cluster: bool) -> Iterator[tuple[int, Any]]:
    """(target batches, searcher operation) pairs: the master's operations, or one fixed length off-cluster."""
    if not on_cluster:
        yield OFF_CLUSTER_BATCHES, None
        return
    for op in core_context.searcher.operations():
        yield op.length, op


def main(core_context: Any) -> None:
    info = det.get_cluster_info()
    hparams = info.trial.hparams if info else OFF_CLUSTER_HPARAMS
    searcher = (info.trial.config.get("searcher") or {}) if info else {}
    metric_name = searcher.get("metric", "validation_loss")
    job = Job(core_context, hparams, seed=info.trial.trial_seed if info else 0)
    if info and info.latest_checkpoint:
        job.load(info.latest_checkpoint)
    print(
        f"[{socket.gethostname()}] rank {job.rank}/{job.size} hparams={hparams} "
        f"train={len(job.train_data)} val={len(job.val_data)}",
        flush=True,
    )
    metrics: dict[str, float] = {}
    for target, op in operations(core_context, info is not None):
        if not job.train_until(target, op):
            return
        metrics = job.validate()
        if job.last_checkpoint != job.steps:
            job.save()
        if op is not None and job.rank == 0:
            op.report_completed(metrics[metric_name])
    if job.rank == 0:
        print(f"done after {job.steps} batches: {metrics}", flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    torch.set_num_threads(1)  # the local cluster's "GPUs" share two CPU cores
    distributed = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
        distributed = det.core.DistributedContext.from_torch_distributed()
    with det.core.init(distributed=distributed) as core_context:
        main(core_context)
    if dist.is_initialized():
        dist.destroy_process_group()
