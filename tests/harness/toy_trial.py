"""A tiny PyTorchTrial used by the trial tests (and by the torchrun test)."""

from __future__ import annotations

from typing import Any

import torch

from harness.trial import DataLoader, LRScheduler, PyTorchTrial, PyTorchTrialContext

SEEN: list[list[int]] = []


class ToyTrial(PyTorchTrial):
    def __init__(self, context: PyTorchTrialContext) -> None:
        self.context = context
        torch.manual_seed(0)
        self.model = context.wrap_model(
            torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
        )
        self.opt = context.wrap_optimizer(
            torch.optim.SGD(self.model.parameters(), lr=context.get_hparam("lr"))
        )
        self.sched = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(self.opt, step_size=7, gamma=0.9),
            LRScheduler.StepMode.STEP_EVERY_BATCH,
        )
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(40, 3, generator=g)
        self.y = self.x.sum(1, keepdim=True)

    def _data(self) -> Any:
        return torch.utils.data.TensorDataset(torch.arange(40), self.x, self.y)

    def build_training_data_loader(self) -> DataLoader:
        return DataLoader(self._data(), batch_size=self.context.get_per_slot_batch_size(), shuffle=True)

    def build_validation_data_loader(self) -> DataLoader:
        return DataLoader(self._data(), batch_size=8)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        idx, x, y = batch
        SEEN.append(idx.tolist())
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        if batch_idx + 1 == self.context.get_hparams().get("preempt_at"):
            self.context._core.preempt._trigger_local()
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        _, x, y = batch
        return {"val_loss": torch.nn.functional.mse_loss(self.model(x), y)}
