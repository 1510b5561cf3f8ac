"""Which runtime, default image and cache directory a resource pool uses (from ``master.yaml``).

A pool's ``container:`` section overrides the top-level ``container:`` key by key: only the keys it sets.
Without an ``image_cache_dir`` anywhere, pulled images go to ``<job_storage_root>/images``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpc_master.masterconf import MasterConfig

DEFAULT_CACHE_SUBDIR = "images"


@dataclass(frozen=True)
class PoolContainer:
    runtime: str  # apptainer | singularity | none
    image: str | None  # the pool's default image
    cache_dir: str | None  # None: default_cache_dir(job storage root)
    command: str | None = None  # the runtime's executable; None: the runtime's name on PATH


def default_cache_dir(job_storage_root: str) -> str:
    return os.path.join(job_storage_root, DEFAULT_CACHE_SUBDIR)


def pool_container(master: MasterConfig, pool_name: str | None = None) -> PoolContainer:
    name = pool_name or master.default_resource_pool
    pool = master.resource_pools.get(name)
    top = master.container
    own = pool.container if pool is not None else None
    chosen = own.model_fields_set if own is not None else set()

    def pick(key: str) -> object:
        return getattr(own, key) if own is not None and key in chosen else getattr(top, key)

    cache = pick("image_cache_dir")
    return PoolContainer(
        runtime=str(pick("runtime")),
        image=str(pick("image")) if pick("image") else None,
        command=str(pick("command")) if pick("command") else None,
        cache_dir=str(cache) if cache else None,
    )
