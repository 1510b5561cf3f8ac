"""The installed hpc-det's version, as the master reports it (``/api/v1/master``, ``/info``, OpenAPI)."""

from __future__ import annotations

import importlib.metadata


def master_version() -> str:
    try:
        return importlib.metadata.version("hpc-det")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"
