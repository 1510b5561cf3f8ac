"""Pull images into a resource pool's cache ahead of time, on a login node that can reach the registry:

    python -m hpc_master.prepull [--config master.yaml] [--pool gpu] [--force] docker://pytorch/pytorch:2.3.0

The pool's runtime, runtime command and cache directory come from ``master.yaml`` (``--runtime``, ``--command``
and ``--cache-dir`` override them); the pulling itself is ``containers.prepull``.
"""

from __future__ import annotations

import argparse
import sys

from containers.images import default_cache_dir
from containers.prepull import add_pull_arguments, pull_images
from hpc_master.errors import ConfigError
from hpc_master.masterconf import load_master_config, pool_container


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpc_master.prepull", description=__doc__.split("\n")[0])
    add_pull_arguments(parser, required=False)
    parser.add_argument("--config", help="master.yaml (for the pool's runtime and cache directory)")
    parser.add_argument("--pool", help="resource pool (default: the master's default pool)")
    args = parser.parse_args(argv)

    runtime_name, cache_dir, command = args.runtime, args.cache_dir, args.command
    if not (runtime_name and cache_dir):
        try:
            master = load_master_config(args.config)
            pool = pool_container(master, args.pool)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        runtime_name = runtime_name or pool.runtime
        cache_dir = cache_dir or pool.cache_dir or default_cache_dir(str(master.job_storage_dir()))
        if not args.runtime:  # the pool's own runtime: its configured executable too
            command = command or pool.command or ""
    return pull_images(
        args.images, runtime_name=runtime_name, cache_dir=cache_dir, command=command, force=args.force
    )


if __name__ == "__main__":
    sys.exit(main())
