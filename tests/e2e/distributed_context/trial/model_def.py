"""A small PyTorchTrial (`entrypoint: model_def:MyTrial`): regression with dropout on a synthetic data set, so
that a resume which lost the RNG state, the data position or the optimizer state would end differently."""

import time

import determined as det
import torch
from torch import nn


class MyTrial(det.pytorch.PyTorchTrial):
    def __init__(self, context: det.pytorch.PyTorchTrialContext) -> None:
        torch.set_num_threads(1)
        self.context = context
        self.model = context.wrap_model(
            nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
        )
        self.opt = context.wrap_optimizer(
            torch.optim.SGD(self.model.parameters(), lr=context.get_hparam("lr"), momentum=0.9)
        )
        g = torch.Generator().manual_seed(3)
        self.x = torch.randn(96, 8, generator=g)
        self.y = self.x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(96, 1, generator=g)

    def build_training_data_loader(self) -> det.pytorch.DataLoader:
        data = torch.utils.data.TensorDataset(self.x, self.y)
        return det.pytorch.DataLoader(data, batch_size=self.context.get_per_slot_batch_size(), shuffle=True)

    def build_validation_data_loader(self) -> det.pytorch.DataLoader:
        data = torch.utils.data.TensorDataset(self.x[:32], self.y[:32])
        return det.pytorch.DataLoader(data, batch_size=8)

    def train_batch(self, batch, epoch_idx, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        time.sleep(self.context.get_hparam("sleep_s"))
        return {"loss": loss}

    def evaluate_batch(self, batch):
        x, y = batch
        return {"val_loss": nn.functional.mse_loss(self.model(x), y)}
