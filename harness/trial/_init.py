"""Entry points of the Trial API: ``run()`` (what ``model_def:TrialClass`` executes) and ``init()``."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any, TypedDict

from harness import core
from harness.trial._context import PyTorchTrialContext
from harness.trial._trainer import Trainer, build_trial
from harness.trial._trial import PyTorchTrial

logger = logging.getLogger("harness.trial")


def load_trial_class(entrypoint: str) -> type[PyTorchTrial]:
    """``"model_def:MyTrial"`` → the class, importing ``model_def`` from the working directory."""
    module_name, _, qualname = entrypoint.partition(":")
    if not qualname:
        raise ValueError(f"entrypoint {entrypoint!r} is not of the form module:TrialClass")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, PyTorchTrial)):
        raise TypeError(f"{entrypoint} is not a PyTorchTrial subclass")
    return obj


class _TrialNumbers(TypedDict):
    trial_seed: int
    trial_id: int
    experiment_id: int


def _trial_numbers(info: core.ClusterInfo | None) -> _TrialNumbers:
    """``trial_seed``, ``trial_id`` and ``experiment_id`` of the running trial; 0 off-cluster."""
    if info is None:
        return {"trial_seed": 0, "trial_id": 0, "experiment_id": 0}
    return {
        "trial_seed": info.trial.trial_seed,
        "trial_id": info.trial.trial_id,
        "experiment_id": info.trial.experiment_id,
    }


def _distributed() -> core.DistributedContext | None:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return core.DistributedContext.from_torch_distributed()
    return None


@contextlib.contextmanager
def init(
    *,
    hparams: dict[str, Any] | None = None,
    exp_conf: dict[str, Any] | None = None,
    distributed: core.DistributedContext | None = None,
    checkpoint_storage: str | None = None,
) -> Iterator[PyTorchTrialContext]:
    """Determined 0.38's ``det.pytorch.init()``: a PyTorchTrialContext for use with ``Trainer``."""
    with core.init(distributed=distributed or _distributed(), checkpoint_storage=checkpoint_storage) as ctx:
        info = ctx.info
        if info is not None:
            hparams = info.trial.hparams if hparams is None else hparams
            exp_conf = info.trial.config if exp_conf is None else exp_conf
        yield PyTorchTrialContext(
            ctx,
            hparams=hparams or {},
            config=exp_conf or {},
            **_trial_numbers(info),
        )


def run(
    entrypoint: str | type[PyTorchTrial],
    *,
    hparams: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    max_length: Any = None,
    latest_checkpoint: str | None = None,
    checkpoint_storage: str | None = None,
) -> int:
    """Train a PyTorchTrial to completion or preemption. Returns the process exit code (0 for both)."""
    trial_cls = load_trial_class(entrypoint) if isinstance(entrypoint, str) else entrypoint
    with core.init(distributed=_distributed(), checkpoint_storage=checkpoint_storage) as ctx:
        info = ctx.info
        if info is not None:
            hparams = info.trial.hparams if hparams is None else hparams
            config = info.trial.config if config is None else config
            latest_checkpoint = latest_checkpoint or info.latest_checkpoint
        trial, context = build_trial(
            trial_cls,
            ctx,
            hparams=hparams or {},
            config=config or {},
            **_trial_numbers(info),
        )
        trainer = Trainer(trial, context)
        done = trainer.fit(max_length=max_length, latest_checkpoint=latest_checkpoint)
        logger.info("trial %s after %d batches", "finished" if done else "preempted", trainer.batches_trained)
    return 0
