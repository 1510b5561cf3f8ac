"""The Core API, source-compatible with Determined's ``determined.core``."""

from harness.cluster_info import ClusterInfo, TrialInfo, get_cluster_info
from harness.core._checkpoint import CheckpointContext, DownloadMode, DummyCheckpointContext
from harness.core._context import Context, InvalidHP, _dummy_init, init
from harness.core._distributed import DistributedContext, DummyDistributedContext
from harness.core._preempt import DummyPreemptContext, PreemptContext, PreemptMode
from harness.core._searcher import (
    DummySearcherContext,
    SearcherContext,
    SearcherMode,
    SearcherOperation,
    Unit,
)
from harness.core._train import DummyTrainContext, EarlyExitReason, TrainContext

__all__ = [
    "CheckpointContext",
    "ClusterInfo",
    "Context",
    "DistributedContext",
    "DownloadMode",
    "DummyCheckpointContext",
    "DummyDistributedContext",
    "DummyPreemptContext",
    "DummySearcherContext",
    "DummyTrainContext",
    "EarlyExitReason",
    "InvalidHP",
    "PreemptContext",
    "PreemptMode",
    "SearcherContext",
    "SearcherMode",
    "SearcherOperation",
    "TrainContext",
    "TrialInfo",
    "Unit",
    "_dummy_init",
    "get_cluster_info",
    "init",
]
