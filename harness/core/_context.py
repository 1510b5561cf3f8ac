"""core.init() and the Context that bundles train/checkpoint/preempt/searcher/distributed."""

from __future__ import annotations

import logging
import os
import pathlib
import sys
import types
from typing import Any

from harness import cluster_info
from harness._http import MasterSession
from harness.core._checkpoint import CheckpointContext, DummyCheckpointContext
from harness.core._distributed import DistributedContext, DummyDistributedContext
from harness.core._metrics import MetricsShipper
from harness.core._preempt import DummyPreemptContext, PreemptContext, PreemptMode
from harness.core._searcher import DummySearcherContext, SearcherContext, parse_searcher_units
from harness.core._train import DummyTrainContext, EarlyExitReason, TrainContext

logger = logging.getLogger("harness.core")


class InvalidHP(Exception):
    """Raise from trial code to say "these hyperparameters are invalid": the trial exits early, cleanly."""


class Context:
    """``core.Context``: ``.train``, ``.checkpoint``, ``.preempt``, ``.searcher``, ``.distributed``, ``.info``."""

    def __init__(
        self,
        checkpoint: CheckpointContext,
        distributed: DistributedContext | None = None,
        preempt: PreemptContext | None = None,
        train: TrainContext | None = None,
        searcher: SearcherContext | None = None,
        info: cluster_info.ClusterInfo | None = None,
        _shipper: MetricsShipper | None = None,
        _session: MasterSession | None = None,
    ) -> None:
        self.checkpoint = checkpoint
        self.distributed = distributed or DummyDistributedContext()
        self.preempt = preempt or DummyPreemptContext(self.distributed)
        self.train = train or DummyTrainContext()
        self.searcher = searcher or DummySearcherContext(self.distributed)
        self.info = info
        preempt_ = self.preempt
        self.checkpoint._stopping = lambda: preempt_.answered_true
        train_ = self.train
        self.checkpoint._flush_metrics = lambda: train_.flush(timeout_s=60)
        self._shipper = _shipper
        self._session = _session
        self._started = False
        self._closed = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self.preempt.start()

    def __enter__(self) -> Context:
        self.start()
        return self

    def close(
        self,
        exc_type: type[BaseException] | None = None,
        exc_val: BaseException | None = None,
        exc_tb: types.TracebackType | None = None,
    ) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            try:
                self.checkpoint.close()  # an asynchronous save in flight is completed and registered
            except Exception:
                if exc_val is None:
                    raise
                logger.exception("while closing after %s", type(exc_val).__name__)
            self.train.close()
            if self._shipper is not None:
                self._shipper.close(float(os.environ.get("DET_METRICS_CLOSE_TIMEOUT_S") or 120))
        finally:
            self.preempt.close()
            self.distributed.close()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: types.TracebackType | None,
    ) -> None:
        if isinstance(exc_val, InvalidHP):
            self.train.report_early_exit(EarlyExitReason.INVALID_HP)
            self.close(exc_type, exc_val, exc_tb)
            logger.info("InvalidHP raised: the trial exits early (exit code 0)")
            sys.exit(0)
        self.close(exc_type, exc_val, exc_tb)


def _storage_path(
    checkpoint_storage: str | dict[str, Any] | None, config: dict[str, Any]
) -> pathlib.Path | None:
    if isinstance(checkpoint_storage, str):
        return pathlib.Path(checkpoint_storage)
    spec = checkpoint_storage if isinstance(checkpoint_storage, dict) else None
    if spec is None:
        root = cluster_info.get_storage_root()
        if root is not None:
            return root
        spec = config.get("checkpoint_storage")
    if isinstance(spec, dict):
        if spec.get("type", "shared_fs") != "shared_fs":
            raise ValueError(f"checkpoint storage type {spec.get('type')!r} is not supported; use shared_fs")
        host = spec.get("storage_path") or spec.get("host_path")
        if host:
            return pathlib.Path(host)
    return None


def _detect_distributed(info: cluster_info.ClusterInfo) -> DistributedContext:
    if "WORLD_SIZE" in os.environ and "LOCAL_WORLD_SIZE" in os.environ:
        return DistributedContext.from_torch_distributed()
    if len(info.container_addrs) > 1 or len(info.slot_ids) > 1:
        raise ValueError("you must provide a valid DistributedContext for a multi-slot task")
    return DummyDistributedContext()


def _dummy_init(
    *,
    distributed: DistributedContext | None = None,
    checkpoint_storage: str | dict[str, Any] | None = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    searcher_length: int = 1,
) -> Context:
    """A Context for off-cluster runs: metrics are logged, checkpoints go to a local directory."""
    distributed = distributed or DummyDistributedContext()
    base = _storage_path(checkpoint_storage, {}) or cluster_info.get_local_storage_root()
    logger.info("off-cluster: storing checkpoints in %s", base)
    return Context(
        checkpoint=DummyCheckpointContext(distributed, base),
        distributed=distributed,
        preempt=DummyPreemptContext(distributed, preempt_mode),
        train=DummyTrainContext(),
        searcher=DummySearcherContext(distributed, searcher_length),
    )


def init(
    *,
    distributed: DistributedContext | None = None,
    checkpoint_storage: str | dict[str, Any] | None = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: Any = None,
    async_checkpointing: bool = False,
    **_: Any,
) -> Context:
    """Build the Core API context. Use it as ``with core.init() as core_context: ...``.

    Off-cluster (no ``DET_CLUSTER_INFO``) it falls back to the ``Dummy*`` contexts. On a multi-slot task,
    ``distributed`` is taken from torchrun's environment when not given.
    """
    info = cluster_info.get_cluster_info()
    if info is None:
        return _dummy_init(
            distributed=distributed, checkpoint_storage=checkpoint_storage, preempt_mode=preempt_mode
        )
    distributed = distributed or _detect_distributed(info)
    session = MasterSession(info.master_url, info.session_token)
    trial = info.trial
    base = _storage_path(checkpoint_storage, trial.config)
    if base is None:
        raise ValueError("no checkpoint storage: set DET_STORAGE_ROOT or checkpoint_storage.host_path")
    shipper = MetricsShipper(session, trial.trial_id)
    train = TrainContext(session, trial.trial_id, trial.trial_run_id, trial.experiment_id, shipper)
    return Context(
        checkpoint=CheckpointContext(distributed, base, session, trial.trial_id, trial.trial_run_id),
        distributed=distributed,
        preempt=PreemptContext(
            session, info.allocation_id or f"{trial.trial_id}.{trial.trial_run_id}", distributed, preempt_mode
        ),
        train=train,
        searcher=SearcherContext(
            session, distributed, trial.trial_id, train, parse_searcher_units(trial.config)
        ),
        info=info,
        _shipper=shipper,
        _session=session,
    )
