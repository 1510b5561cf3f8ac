"""Determined's Core API PyTorch tutorial (examples/tutorials/core_api_pytorch_mnist, the checkpoints and
adaptive stages), kept to its structure and API calls; only MNIST is replaced by a small synthetic data set
(the cluster has no network) and a batch may sleep `sleep_s` seconds so that a pause lands mid-training.

It reports training metrics every --log-interval batches and validation metrics every epoch, checkpoints every
epoch (the model and "epochs_completed,trial_id"), returns when should_preempt() is true and resumes from
info.latest_checkpoint.
"""

import argparse
import pathlib
import time

import determined as det
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR


class Net(nn.Module):
    def __init__(self, hparams):
        super().__init__()
        self.fc1 = nn.Linear(16, hparams["n_hidden"])
        self.dropout1 = nn.Dropout(hparams["dropout1"])
        self.fc2 = nn.Linear(hparams["n_hidden"], 4)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = self.dropout1(x)
        return F.log_softmax(self.fc2(x), dim=1)


def synthetic_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    y = (x[:, :4].argmax(dim=1)).long()
    return torch.utils.data.TensorDataset(x, y)


def train(args, model, device, train_loader, optimizer, core_context, epoch_idx, op, hparams):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        time.sleep(hparams.get("sleep_s", 0))
        if (batch_idx + 1) % args.log_interval == 0:
            print(f"Train Epoch: {epoch_idx} [{batch_idx + 1}/{len(train_loader)}]\tLoss: {loss.item():.6f}")
            core_context.train.report_training_metrics(
                steps_completed=(batch_idx + 1) + epoch_idx * len(train_loader),
                metrics={"train_loss": loss.item()},
            )
    op.report_progress(epoch_idx + 1)


def test(args, model, device, test_loader, core_context, steps_completed):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    print(f"Test set: Average loss: {test_loss:.4f}, Accuracy: {correct}/{len(test_loader.dataset)}")
    core_context.train.report_validation_metrics(
        steps_completed=steps_completed, metrics={"test_loss": test_loss}
    )
    return test_loss


def load_state(checkpoint_directory, trial_id):
    checkpoint_directory = pathlib.Path(checkpoint_directory)
    with checkpoint_directory.joinpath("checkpoint.pt").open("rb") as f:
        model = torch.load(f, weights_only=False)
    with checkpoint_directory.joinpath("state").open("r") as f:
        epochs_completed, ckpt_trial_id = (int(field) for field in f.read().split(","))
    if ckpt_trial_id != trial_id:
        epochs_completed = 0
    return model, epochs_completed


def main(core_context):
    parser = argparse.ArgumentParser(description="Core API tutorial, synthetic data")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--test-batch-size", type=int, default=64)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=1)
    args = parser.parse_args()

    info = det.get_cluster_info()
    assert info is not None, "this example only runs on-cluster"
    hparams = info.trial.hparams

    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    train_loader = torch.utils.data.DataLoader(synthetic_dataset(64, 0), batch_size=args.batch_size)
    test_loader = torch.utils.data.DataLoader(synthetic_dataset(64, 1), batch_size=args.test_batch_size)

    model = Net(hparams).to(device)
    latest_checkpoint = info.latest_checkpoint
    if latest_checkpoint is None:
        epochs_completed = 0
    else:
        with core_context.checkpoint.restore_path(latest_checkpoint) as path:
            state_dict, epochs_completed = load_state(path, info.trial.trial_id)
        model.load_state_dict(state_dict)
        print(f"resumed from {latest_checkpoint} at epoch {epochs_completed}", flush=True)

    optimizer = optim.Adadelta(model.parameters(), lr=hparams["learning_rate"])
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)

    epoch_idx = epochs_completed
    for op in core_context.searcher.operations():
        while epoch_idx < op.length:
            train(args, model, device, train_loader, optimizer, core_context, epoch_idx, op, hparams)
            epochs_completed = epoch_idx + 1
            steps_completed = epochs_completed * len(train_loader)
            test_loss = test(args, model, device, test_loader, core_context, steps_completed)
            scheduler.step()

            checkpoint_metadata_dict = {"steps_completed": steps_completed}
            with core_context.checkpoint.store_path(checkpoint_metadata_dict) as (path, storage_id):  # noqa: RUF059
                torch.save(model.state_dict(), path / "checkpoint.pt")
                with path.joinpath("state").open("w") as f:
                    f.write(f"{epochs_completed},{info.trial.trial_id}")
            epoch_idx += 1

            if core_context.preempt.should_preempt():
                print(f"preempted after epoch {epochs_completed}", flush=True)
                return

        op.report_completed(test_loss)


if __name__ == "__main__":
    torch.set_num_threads(1)
    with det.core.init() as core_context:
        main(core_context=core_context)
