"""``determined.pytorch`` → ``harness.trial``."""

from harness.trial import (
    Batch,
    DataLoader,
    Epoch,
    LRScheduler,
    PyTorchTrial,
    PyTorchTrialContext,
    Record,
    Trainer,
    init,
)

__all__ = [
    "Batch",
    "DataLoader",
    "Epoch",
    "LRScheduler",
    "PyTorchTrial",
    "PyTorchTrialContext",
    "Record",
    "Trainer",
    "init",
]
