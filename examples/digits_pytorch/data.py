"""The data and the model shared by ``train.py`` (Core API) and ``model_def.py`` (PyTorchTrial).

scikit-learn's 8x8 handwritten digits (1,797 images, shipped with scikit-learn: nothing is downloaded), split
once into 1,437 training and 360 validation images by a fixed permutation, so every trial, rank and resumed
run sees the same split.
"""

from __future__ import annotations

import torch
from torch import nn

VALIDATION_SIZE = 360
SPLIT_SEED = 0


def load_split() -> tuple[torch.utils.data.TensorDataset, torch.utils.data.TensorDataset]:
    """(training, validation) datasets of (image [1, 8, 8] scaled to 0..1, label)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.data, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
    val, train = order[:VALIDATION_SIZE], order[VALIDATION_SIZE:]
    return (
        torch.utils.data.TensorDataset(images[train], labels[train]),
        torch.utils.data.TensorDataset(images[val], labels[val]),
    )


def build_model(n_filters: int, dropout: float) -> nn.Module:
    """Two 3x3 conv blocks (8x8 → 4x4 → 2x2) and a linear classifier: a few thousand parameters."""
    return nn.Sequential(
        nn.Conv2d(1, n_filters, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(n_filters, 2 * n_filters, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(2 * n_filters * 2 * 2, 10),
    )
