"""PyTorchTrial: the class a model_def:TrialClass entrypoint names (Determined's interface)."""

from __future__ import annotations

import abc
from typing import Any

import torch

from harness.trial._context import PyTorchTrialContext
from harness.trial._data import DataLoader


class PyTorchTrial(abc.ABC):
    trial_context_class = PyTorchTrialContext

    @abc.abstractmethod
    def __init__(self, context: PyTorchTrialContext) -> None:
        pass

    @abc.abstractmethod
    def build_training_data_loader(self) -> DataLoader | torch.utils.data.DataLoader[Any]:
        pass

    @abc.abstractmethod
    def build_validation_data_loader(self) -> DataLoader | torch.utils.data.DataLoader[Any]:
        pass

    @abc.abstractmethod
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor | dict[str, Any]:
        """One optimisation step. Return the loss or a dict of metrics."""

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        """Metrics of one validation batch (averaged over batches and ranks)."""
        raise NotImplementedError("implement evaluate_batch() or evaluate_full_dataset()")

    def evaluate_full_dataset(self, data_loader: torch.utils.data.DataLoader[Any]) -> dict[str, Any]:
        raise NotImplementedError

    def get_batch_length(self, batch: Any) -> int:
        if isinstance(batch, torch.Tensor):
            return int(batch.shape[0])
        if isinstance(batch, (list, tuple)) and batch:
            return self.get_batch_length(batch[0])
        if isinstance(batch, dict) and batch:
            return self.get_batch_length(next(iter(batch.values())))
        return 1
