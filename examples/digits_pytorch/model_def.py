"""Digits CNN as a PyTorchTrial (``entrypoint: model_def:DigitsTrial``).

The same data and model as ``train.py``, but the platform's trainer runs the loop: it shards the batches
across ranks, validates every ``min_validation_period``, checkpoints models, optimizer, RNG and data position,
answers the searcher and stops cleanly on preemption. Run it off the cluster with
``python3 -m harness.exec.run_trial model_def:DigitsTrial --config const_trial.yaml --max-length 200``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from data import build_model, load_split
from determined.pytorch import DataLoader, PyTorchTrial, PyTorchTrialContext

torch.set_num_threads(1)  # the local cluster's "GPUs" share two CPU cores


class DigitsTrial(PyTorchTrial):
    def __init__(self, context: PyTorchTrialContext) -> None:
        self.context = context
        self.train_data, self.val_data = load_split()
        model = build_model(int(context.get_hparam("n_filters")), float(context.get_hparam("dropout")))
        self.model = context.wrap_model(model)
        self.optimizer = context.wrap_optimizer(
            torch.optim.Adam(self.model.parameters(), lr=float(context.get_hparam("learning_rate")))
        )

    def build_training_data_loader(self) -> DataLoader:
        return DataLoader(
            self.train_data, batch_size=self.context.get_per_slot_batch_size(), shuffle=True, drop_last=True
        )

    def build_validation_data_loader(self) -> DataLoader:
        return DataLoader(self.val_data, batch_size=120)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        images, labels = batch
        loss = F.cross_entropy(self.model(images), labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        images, labels = batch
        logits = self.model(images)
        return {
            "validation_loss": F.cross_entropy(logits, labels).item(),
            "validation_accuracy": (logits.argmax(1) == labels).float().mean().item(),
        }
