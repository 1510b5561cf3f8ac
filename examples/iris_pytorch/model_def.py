"""Iris species classification, the model of Determined's first walkthrough, as a PyTorchTrial.

Four measurements (sepal and petal length and width) in, one of three species out, through one hidden
dense layer of ``layer1_dense_size`` units; RMSprop with ``learning_rate`` decayed per batch by
``learning_rate_decay`` (Keras' ``lr / (1 + decay * iterations)``). The data is scikit-learn's copy of the
150 iris flowers (nothing is downloaded), split once into 120 for training and 30 for validation.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from determined.pytorch import DataLoader, LRScheduler, PyTorchTrial, PyTorchTrialContext
from torch import nn

NUM_CLASSES = 3
VALIDATION_SIZE = 30
SPLIT_SEED = 0

torch.set_num_threads(1)  # the local cluster's "GPUs" share two CPU cores


def load_split() -> tuple[torch.utils.data.TensorDataset, torch.utils.data.TensorDataset]:
    """(training, validation): a fixed permutation of the 150 flowers, so every trial sees the same split."""
    from sklearn.datasets import load_iris

    iris = load_iris()
    features = torch.tensor(iris.data, dtype=torch.float32)
    labels = torch.tensor(iris.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
    val, train = order[:VALIDATION_SIZE], order[VALIDATION_SIZE:]
    return (
        torch.utils.data.TensorDataset(features[train], labels[train]),
        torch.utils.data.TensorDataset(features[val], labels[val]),
    )


class IrisTrial(PyTorchTrial):
    def __init__(self, context: PyTorchTrialContext) -> None:
        self.context = context
        self.train_data, self.val_data = load_split()
        hidden = int(context.get_hparam("layer1_dense_size"))
        self.model = context.wrap_model(nn.Sequential(nn.Linear(4, hidden), nn.Linear(hidden, NUM_CLASSES)))
        self.optimizer = context.wrap_optimizer(
            torch.optim.RMSprop(self.model.parameters(), lr=float(context.get_hparam("learning_rate")))
        )
        decay = float(context.get_hparam("learning_rate_decay"))
        context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0 / (1.0 + decay * step)),
            LRScheduler.StepMode.STEP_EVERY_BATCH,
        )

    def build_training_data_loader(self) -> DataLoader:
        return DataLoader(
            self.train_data, batch_size=self.context.get_per_slot_batch_size(), shuffle=True, drop_last=True
        )

    def build_validation_data_loader(self) -> DataLoader:
        return DataLoader(self.val_data, batch_size=VALIDATION_SIZE)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        features, labels = batch
        loss = F.cross_entropy(self.model(features), labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        features, labels = batch
        logits = self.model(features)
        return {
            "validation_loss": F.cross_entropy(logits, labels).item(),
            "validation_accuracy": (logits.argmax(1) == labels).float().mean().item(),
        }
