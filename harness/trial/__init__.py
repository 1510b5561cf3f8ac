"""The Trial API (PyTorchTrial and its trainer). Imports torch; ``import harness`` alone does not."""

from harness.trial._context import LRScheduler, PyTorchTrialContext
from harness.trial._data import DataLoader
from harness.trial._init import init, load_trial_class, run
from harness.trial._trainer import Batch, Epoch, Record, Trainer
from harness.trial._trial import PyTorchTrial

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
    "load_trial_class",
    "run",
]
