"""A ``determined`` package for jobs: scripts written against Determined's public Core API run unmodified.

The job script puts ``determined_compat/`` on ``PYTHONPATH`` for the job only; it is never installed globally.
This room is a facade over ``harness`` (Core API, Trial API, cluster info) and ``launchers``
(``determined.launch.*``); neither imports it.
"""

from __future__ import annotations

import importlib
from typing import Any

from harness import core
from harness.cluster_info import LOG_FORMAT, ClusterInfo, TrialInfo, get_cluster_info
from harness.core import InvalidHP

__version__ = "0.37.0+hpcdet"

__all__ = ["LOG_FORMAT", "ClusterInfo", "InvalidHP", "TrialInfo", "core", "get_cluster_info"]


def __getattr__(name: str) -> Any:
    # ``det.pytorch`` / ``det.launch`` without an explicit import, as some scripts do; loaded lazily (torch).
    if name in ("pytorch", "launch"):
        return importlib.import_module(f"determined.{name}")
    raise AttributeError(f"module 'determined' has no attribute {name!r}")
