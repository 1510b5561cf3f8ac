"""The training loop behind ``entrypoint: model_def:TrialClass``.

Length comes from the searcher (operations of ``searcher.max_length`` units) or, off-cluster, from the config
or ``fit(max_length=...)``. Validation and checkpoints follow ``min_validation_period`` /
``min_checkpoint_period``; training metrics are reported every ``scheduling_unit`` batches. Every rank calls
``should_preempt()`` after every batch; on preemption the trainer checkpoints and returns. A checkpoint holds
models, optimizers, LR schedulers, the scaler, every rank's RNG state and the data position (epoch, batch in
epoch, batches trained), so a resumed trial sees the same batches an uninterrupted one would.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import pickle
import random
import sys
from collections.abc import Iterator
from typing import Any

import torch

from harness import core
from harness.core._searcher import DummySearcherContext
from harness.trial._context import LRScheduler, PyTorchTrialContext
from harness.trial._data import DataLoader, ShardedBatches
from harness.trial._trial import PyTorchTrial

logger = logging.getLogger("harness.trial")
STATE_FILE = "state_dict.pth"


def length_to_batches(length: Any, global_batch_size: int, epoch_len: int) -> int:
    """``{"batches": n}`` / ``{"records": n}`` / ``{"epochs": n}`` / a bare int (batches) → batches."""
    if isinstance(length, (Batch, Epoch, Record)):
        length = {length.unit: length.value}
    if isinstance(length, dict):
        ((unit, n),) = length.items()
        unit = unit.lower()
        if unit == "records":
            return math.ceil(int(n) / global_batch_size)
        if unit == "epochs":
            return int(n) * epoch_len
        return int(n)
    return int(length)


class _Length:
    unit = "batches"

    def __init__(self, value: int) -> None:
        self.value = value


class Batch(_Length):
    unit = "batches"


class Epoch(_Length):
    unit = "epochs"


class Record(_Length):
    unit = "records"


def async_checkpoints_default() -> bool:
    """``DET_ASYNC_CHECKPOINTS``: ``1``/``true`` or ``0``/``false`` (the default, until the periodic overhead is
    measured on an idle machine: ``bench/results/checkpoint_stall.md``)."""
    raw = os.environ.get("DET_ASYNC_CHECKPOINTS", "0").strip().lower()
    if raw not in ("1", "0", "true", "false", "yes", "no"):
        raise ValueError(f"DET_ASYNC_CHECKPOINTS: {raw!r} is not one of 1, 0, true, false")
    return raw in ("1", "true", "yes")


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"random": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if "numpy" in sys.modules:
        state["numpy"] = sys.modules["numpy"].random.get_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["random"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])


class _Mean:
    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.count = 0

    def add(self, metrics: dict[str, Any]) -> None:
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v.item() if isinstance(v, torch.Tensor) else v)
        self.count += 1


def _reduce(parts: list[_Mean]) -> dict[str, float]:
    count = sum(p.count for p in parts)
    keys = {k for p in parts for k in p.sums}
    return {k: sum(p.sums.get(k, 0.0) for p in parts) / max(count, 1) for k in sorted(keys)}


class Trainer:
    def __init__(self, trial: PyTorchTrial, context: PyTorchTrialContext) -> None:
        self.trial = trial
        self.context = context
        self.core = context._core
        self.dist = context.distributed
        config = context.get_experiment_config()
        self.config = config
        self.batches_trained = 0
        self.epoch_idx = 0
        self.batch_in_epoch = 0
        self._last_val = -1
        self._last_val_metrics: dict[str, float] = {}
        self._last_ckpt = -1
        self._steps_at_restore = 0
        self.preempted = False
        self.async_checkpoints = async_checkpoints_default()

    # -- state ---------------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        c = self.context
        return {
            "models_state_dict": [getattr(m, "module", m).state_dict() for m in c.models],
            "optimizers_state_dict": [o.state_dict() for o in c.optimizers],
            "lr_schedulers_state_dict": [s.state_dict() for s in c.lr_schedulers],
            "scaler_state_dict": c._scaler.state_dict() if c._scaler is not None else None,
            "trial_state": {
                "batches_trained": self.batches_trained,
                "epoch_idx": self.epoch_idx,
                "batch_in_epoch": self.batch_in_epoch,
                "last_val": self._last_val,
            },
        }

    def checkpoint(self, *, final: bool = True) -> str:
        """Save the trial's state. A periodic save (``final=False``) is asynchronous when enabled."""
        rngs = self.dist.allgather(pickle.dumps(_rng_state()))
        sid: str | None = None
        if self.dist.rank == 0:
            md = {
                "steps_completed": self.batches_trained,
                "framework": f"torch-{torch.__version__}",
                "format": "pickle",
            }
            state = self._state()
            state["rng_states"] = rngs
            sid = self.core.checkpoint.save_state(
                state, md, asynchronous=self.async_checkpoints and not final, filename=STATE_FILE
            )
        sid = self.dist.broadcast(sid)
        self._last_ckpt = self.batches_trained
        assert sid is not None
        return sid

    def _checkpoint_durable(self) -> None:
        """Before returning from fit(): the asynchronous save still in flight is durable and registered."""
        if self.dist.rank == 0:
            self.core.checkpoint.wait()

    def restore(self, storage_id: str) -> None:
        with self.core.checkpoint.restore_path(storage_id) as path:
            state = torch.load(path / STATE_FILE, map_location=self.context.device, weights_only=False)
        c = self.context
        for m, sd in zip(c.models, state["models_state_dict"], strict=True):
            getattr(m, "module", m).load_state_dict(sd)
        for o, sd in zip(c.optimizers, state["optimizers_state_dict"], strict=True):
            o.load_state_dict(sd)
        for s, sd in zip(c.lr_schedulers, state["lr_schedulers_state_dict"], strict=True):
            s.load_state_dict(sd)
        if c._scaler is not None and state.get("scaler_state_dict") is not None:
            c._scaler.load_state_dict(state["scaler_state_dict"])
        ts = state["trial_state"]
        self.batches_trained, self.epoch_idx = ts["batches_trained"], ts["epoch_idx"]
        self.batch_in_epoch, self._last_val = ts["batch_in_epoch"], ts.get("last_val", -1)
        self._last_ckpt = self._steps_at_restore = self.batches_trained
        rngs = state.get("rng_states") or []
        if self.dist.rank < len(rngs):
            _set_rng_state(pickle.loads(rngs[self.dist.rank]))
        logger.info(
            "resumed from %s at batch %d (epoch %d)", storage_id, self.batches_trained, self.epoch_idx
        )

    # -- loaders -------------------------------------------------------------------------------------
    def _loader(self, spec: Any, training: bool) -> tuple[Any, ShardedBatches | None]:
        if isinstance(spec, DataLoader):
            return spec.get_data_loader(
                rank=self.dist.rank,
                size=self.dist.size,
                seed=self.context.get_trial_seed(),
                training=training,
            )
        logger.warning(
            "a plain torch DataLoader cannot be sharded or resumed cheaply; use det.pytorch.DataLoader"
        )
        return spec, None

    def _train_batches(self, loader: Any, batches: ShardedBatches | None) -> Iterator[Any]:
        while True:
            skip = self.batch_in_epoch
            if batches is not None:
                batches.set_epoch(self.epoch_idx)
                batches.skip(skip)
                it = iter(loader)
            else:
                it = iter(loader)
                for _ in range(skip):
                    next(it, None)
            yielded = False
            for batch in it:
                yielded = True
                yield batch
            if not yielded and skip == 0:
                raise RuntimeError("the training data loader is empty")
            self.epoch_idx += 1
            self.batch_in_epoch = 0
            for s in self.context.lr_schedulers:
                if s._step_mode == LRScheduler.StepMode.STEP_EVERY_EPOCH:
                    s.step()

    # -- validation ----------------------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        c = self.context
        for m in c.models:
            m.eval()
        loader, _ = self._loader(self.trial.build_validation_data_loader(), training=False)
        with torch.no_grad():
            if type(self.trial).evaluate_full_dataset is not PyTorchTrial.evaluate_full_dataset:
                metrics = self.trial.evaluate_full_dataset(loader)
                mean = _Mean()
                mean.add(metrics)
                parts = [mean]
            else:
                evaluate: Any = self.trial.evaluate_batch  # user code may omit batch_idx, as in Determined
                takes_idx = len(inspect.signature(evaluate).parameters) >= 2
                mean = _Mean()
                for i, batch in enumerate(loader):
                    batch = c.to_device(batch)
                    mean.add(evaluate(batch, i) if takes_idx else evaluate(batch))
                parts = self.dist.allgather(mean)
        for m in c.models:
            m.train()
        metrics_out = _reduce(parts)
        if self.dist.rank == 0:
            self.core.train.report_validation_metrics(self.batches_trained, metrics_out)
        self._last_val = self.batches_trained
        self._last_val_metrics = metrics_out
        return metrics_out

    # -- the loop ------------------------------------------------------------------------------------
    def _period(self, key: str, epoch_len: int, override: Any = None) -> int | None:
        value = override if override is not None else self.config.get(key)
        if not value:
            return None
        n = length_to_batches(value, self.context.get_global_batch_size(), epoch_len)
        return n if n > 0 else None

    def _searcher_metric(self, metrics: dict[str, float]) -> float:
        name = (self.config.get("searcher") or {}).get("metric")
        if name in metrics:
            return metrics[name]
        return next(iter(metrics.values()), 0.0)

    def fit(
        self,
        max_length: Any = None,
        latest_checkpoint: str | None = None,
        checkpoint_period: Any = None,
        validation_period: Any = None,
        reporting_period: Any = None,
        *,
        async_checkpoints: bool | None = None,
    ) -> bool:
        """Train; True when the trial finished, False when it stopped for preemption.

        ``async_checkpoints`` (ours, not Determined's): periodic checkpoints are staged in memory and written in
        the background (``CheckpointContext.save_state(asynchronous=True)``); the final checkpoint of a
        preemption, a pause or the end is synchronous. Default: ``DET_ASYNC_CHECKPOINTS`` (``0``).
        """
        c = self.context
        if async_checkpoints is not None:
            self.async_checkpoints = bool(async_checkpoints)
        if latest_checkpoint:
            self.restore(latest_checkpoint)
        loader, batches = self._loader(self.trial.build_training_data_loader(), training=True)
        epoch_len = len(batches) if batches is not None else len(loader)
        c._epoch_len = epoch_len
        gbs = c.get_global_batch_size()
        val_period = self._period("min_validation_period", epoch_len, validation_period)
        ckpt_period = self._period("min_checkpoint_period", epoch_len, checkpoint_period)
        report_every = self._period("scheduling_unit", epoch_len, reporting_period) or 100
        searcher = self.core.searcher
        if max_length is not None or self.core.info is None:
            length = (
                max_length
                if max_length is not None
                else (self.config.get("searcher") or {}).get("max_length")
            )
            if length is None:
                raise ValueError("no training length: set searcher.max_length or pass max_length")
            searcher = DummySearcherContext(self.dist, length_to_batches(length, gbs, epoch_len))
            unit = "batches"
        else:
            units = searcher.get_configured_units()
            unit = units.value.lower() if units is not None else "batches"

        def to_batches(n: int) -> int:
            return length_to_batches({unit: n}, gbs, epoch_len)

        data = self._train_batches(loader, batches)
        mean, batch_metrics = _Mean(), []
        for op in searcher.operations():
            target = to_batches(op.length)
            while self.batches_trained < target:
                c._current_batch, c._epoch_idx = self.batches_trained, self.epoch_idx
                batch = c.to_device(next(data))
                out = self.trial.train_batch(batch, self.epoch_idx, self.batches_trained)
                self.batches_trained += 1
                self.batch_in_epoch += 1
                for s in c.lr_schedulers:
                    if s._step_mode == LRScheduler.StepMode.STEP_EVERY_BATCH:
                        s.step()
                out = {"loss": out} if isinstance(out, torch.Tensor) else dict(out)
                mean.add(out)
                batch_metrics.append(
                    {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in out.items()}
                )
                if self.batches_trained % report_every == 0 or self.batches_trained == target:
                    self._report_training(mean, batch_metrics)
                    mean, batch_metrics = _Mean(), []
                    if self.dist.rank == 0:
                        op.report_progress(op.length * self.batches_trained / max(target, 1))
                if val_period and self.batches_trained % val_period == 0:
                    self.validate()
                if ckpt_period and self.batches_trained % ckpt_period == 0:
                    self.checkpoint(final=False)
                stop = self.core.preempt.should_preempt()
                if stop or self._stop_requested():
                    if mean.count:
                        self._report_training(mean, batch_metrics)
                    if self._last_ckpt != self.batches_trained:
                        self.checkpoint()
                    self._checkpoint_durable()
                    if stop:
                        self.preempted = True
                        return False
                    self.core.train.report_early_exit(core.EarlyExitReason.USER_REQUESTED_STOP)
                    return True
            metrics = self.validate() if self._last_val != self.batches_trained else self._last_metrics()
            if self.dist.rank == 0:
                op.report_completed(self._searcher_metric(metrics))
        if self._last_ckpt != self.batches_trained:
            self.checkpoint()
        self._checkpoint_durable()
        return True

    def _last_metrics(self) -> dict[str, float]:
        return self._last_val_metrics or self.validate()

    def _stop_requested(self) -> bool:
        return (
            any(self.dist.allgather(self.context.get_stop_requested()))
            if self.dist.size > 1
            else self.context.get_stop_requested()
        )

    def _report_training(self, mean: _Mean, batch_metrics: list[dict[str, Any]]) -> None:
        parts = self.dist.allgather(mean) if self.dist.size > 1 else [mean]
        if self.dist.rank == 0:
            self.core.train.report_training_metrics(
                self.batches_trained, _reduce(parts), batch_metrics=batch_metrics
            )


def build_trial(
    trial_cls: type[PyTorchTrial],
    core_context: core.Context,
    *,
    hparams: dict[str, Any],
    config: dict[str, Any],
    trial_seed: int = 0,
    trial_id: int = 0,
    experiment_id: int = 0,
) -> tuple[PyTorchTrial, PyTorchTrialContext]:
    random.seed(trial_seed)
    torch.manual_seed(trial_seed)
    ctx_cls = getattr(trial_cls, "trial_context_class", PyTorchTrialContext)
    context = ctx_cls(
        core_context,
        hparams=hparams,
        config=config,
        trial_seed=trial_seed,
        trial_id=trial_id,
        experiment_id=experiment_id,
    )
    return trial_cls(context), context
