"""PyTorchTrialContext: what a PyTorchTrial gets in ``__init__`` (Determined's names and semantics)."""

from __future__ import annotations

import atexit
import enum
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from harness import core

logger = logging.getLogger("harness.trial")


class LRScheduler:
    """Wraps a torch LR scheduler with when the trainer should step it."""

    class StepMode(enum.Enum):
        STEP_EVERY_EPOCH = 1
        STEP_EVERY_BATCH = 2
        MANUAL_STEP = 3
        STEP_EVERY_OPTIMIZER_STEP = 4

    def __init__(self, scheduler: Any, step_mode: LRScheduler.StepMode, frequency: int = 1) -> None:
        self.scheduler = scheduler
        self._step_mode = step_mode
        self._frequency = frequency

    def step(self, *args: Any, **kwargs: Any) -> None:
        self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        out: list[float] = self.scheduler.get_last_lr()
        return out

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = self.scheduler.state_dict()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state)


class _Experimental:
    def disable_dataset_reproducibility_checks(self) -> None:
        pass

    def use_amp(self) -> None:
        logger.warning("context.experimental.use_amp() is not supported; use torch.autocast + wrap_scaler")


class PyTorchTrialContext:
    def __init__(
        self,
        core_context: core.Context,
        *,
        hparams: dict[str, Any],
        config: dict[str, Any],
        trial_seed: int = 0,
        trial_id: int = 0,
        experiment_id: int = 0,
        device: torch.device | None = None,
    ) -> None:
        self._core = core_context
        self.distributed = core_context.distributed
        self._hparams = hparams
        self._config = config
        self._trial_seed = trial_seed
        self._trial_id = trial_id
        self._experiment_id = experiment_id
        self.device = device or _default_device(self.distributed.local_rank)
        self.models: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_schedulers: list[LRScheduler] = []
        self._scaler: Any = None
        self._current_batch = 0
        self._epoch_idx = 0
        self._epoch_len: int | None = None
        self._stop_requested = False
        self._tensorboard_writer: Any = None
        self.experimental = _Experimental()

    # -- hyperparameters & config ---------------------------------------------------------------------
    def get_hparams(self) -> dict[str, Any]:
        return self._hparams

    def get_hparam(self, name: str) -> Any:
        if name not in self._hparams:
            raise ValueError(f"hyperparameter {name!r} not found; have {sorted(self._hparams)}")
        return self._hparams[name]

    def get_global_batch_size(self) -> int:
        return int(self.get_hparam("global_batch_size"))

    def get_per_slot_batch_size(self) -> int:
        return max(1, self.get_global_batch_size() // self.distributed.size)

    def get_experiment_config(self) -> dict[str, Any]:
        return self._config

    def get_data_config(self) -> dict[str, Any]:
        return dict(self._config.get("data") or {})

    def get_experiment_id(self) -> int:
        return self._experiment_id

    def get_trial_id(self) -> int:
        return self._trial_id

    def get_trial_seed(self) -> int:
        return self._trial_seed

    def get_stop_requested(self) -> bool:
        return self._stop_requested

    def set_stop_requested(self, stop_requested: bool) -> None:
        self._stop_requested = stop_requested

    # -- progress ------------------------------------------------------------------------------------
    def current_train_batch(self) -> int:
        return self._current_batch

    def current_train_epoch(self) -> int:
        return self._epoch_idx

    def is_epoch_start(self) -> bool:
        return self._epoch_len is not None and self._current_batch % self._epoch_len == 0

    def is_epoch_end(self) -> bool:
        return self._epoch_len is not None and (self._current_batch + 1) % self._epoch_len == 0

    # -- wrapping ------------------------------------------------------------------------------------
    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.to(self.device)
        if self.distributed.size > 1:
            _ensure_process_group(self.device)
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        self.models.append(model)
        return model

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, *_: Any, **__: Any) -> torch.optim.Optimizer:
        self.optimizers.append(optimizer)
        return optimizer

    def wrap_lr_scheduler(
        self, lr_scheduler: Any, step_mode: LRScheduler.StepMode, frequency: int = 1
    ) -> LRScheduler:
        wrapped = LRScheduler(lr_scheduler, step_mode, frequency)
        self.lr_schedulers.append(wrapped)
        return wrapped

    def wrap_scaler(self, scaler: Any) -> Any:
        self._scaler = scaler
        return scaler

    def backward(
        self, loss: torch.Tensor, gradient: Any = None, retain_graph: bool = False, create_graph: bool = False
    ) -> None:
        if self._scaler is not None:
            loss = self._scaler.scale(loss)
        loss.backward(gradient=gradient, retain_graph=retain_graph, create_graph=create_graph)  # type: ignore[no-untyped-call]

    def step_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        clip_grads: Callable[[Iterator[torch.nn.Parameter]], None] | None = None,
        auto_zero_grads: bool = True,
        scaler: Any = None,
    ) -> None:
        scaler = scaler or self._scaler
        if clip_grads is not None:
            if scaler is not None:
                scaler.unscale_(optimizer)
            clip_grads(p for g in optimizer.param_groups for p in g["params"])
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        if auto_zero_grads:
            optimizer.zero_grad()
        for s in self.lr_schedulers:
            if s._step_mode == LRScheduler.StepMode.STEP_EVERY_OPTIMIZER_STEP:
                s.step()

    def to_device(self, data: Any) -> Any:
        if isinstance(data, torch.Tensor):
            return data.to(self.device, non_blocking=True)
        if isinstance(data, dict):
            return {k: self.to_device(v) for k, v in data.items()}
        if isinstance(data, tuple) and hasattr(data, "_fields"):
            return type(data)(*(self.to_device(v) for v in data))
        if isinstance(data, (list, tuple)):
            return type(data)(self.to_device(v) for v in data)
        return data

    def get_tensorboard_writer(self) -> Any:
        """A ``torch.utils.tensorboard.SummaryWriter`` on the trial's TensorBoard directory, or None.

        None off-cluster (no directory) or when the ``tensorboard`` package is missing. The writer is closed at
        exit; call its ``flush()`` to make what it holds visible sooner.
        """
        if self._tensorboard_writer is None:
            path = self._core.train.get_tensorboard_path()
            if path is None:
                return None
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                logger.warning("get_tensorboard_writer(): %s; install the tensorboard package", e)
                return None
            self._tensorboard_writer = SummaryWriter(log_dir=str(path))
            atexit.register(self._tensorboard_writer.close)
        return self._tensorboard_writer


def _default_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def _ensure_process_group(device: torch.device) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            raise RuntimeError("world size > 1 but no torch.distributed environment; launch with torchrun")
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            torch.cuda.set_device(device)
