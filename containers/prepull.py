"""Pull images into a resource pool's cache ahead of time (on a login node, which can reach the registry):

    python -m containers.prepull [--config master.yaml] [--pool gpu] [--force] docker://pytorch/pytorch:2.3.0
    python -m containers.prepull --cache-dir /shared/images --runtime apptainer IMAGE...

Trials then find the image in the cache and start without pulling. Prints each cached image's path.
"""

from __future__ import annotations

import argparse
import os
import sys

from containers.images import ImageError, parse_image, pull_into_cache, runtime_puller
from containers.runtime import ContainerRuntime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m containers.prepull", description=__doc__.split("\n")[0])
    parser.add_argument("images", nargs="+", metavar="IMAGE")
    parser.add_argument("--config", help="master.yaml (for the pool's runtime and cache directory)")
    parser.add_argument("--pool", help="resource pool (default: the master's default pool)")
    parser.add_argument("--cache-dir", help="the cache directory (overrides the master config)")
    parser.add_argument(
        "--runtime", choices=("apptainer", "singularity"), help="(overrides the master config)"
    )
    parser.add_argument("--command", default="", help="the runtime's command, when not its name on PATH")
    parser.add_argument("--force", action="store_true", help="pull again even when cached")
    args = parser.parse_args(argv)

    runtime_name, cache_dir = args.runtime, args.cache_dir
    if not (runtime_name and cache_dir):
        from containers.settings import default_cache_dir, pool_container
        from hpc_master.errors import ConfigError
        from hpc_master.masterconf import load_master_config

        try:
            master = load_master_config(args.config)
            pool = pool_container(master, args.pool)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        runtime_name = runtime_name or pool.runtime
        cache_dir = cache_dir or pool.cache_dir or default_cache_dir(str(master.job_storage_dir()))
    if runtime_name == "none":
        print("error: the pool runs no container runtime (container.runtime: none)", file=sys.stderr)
        return 2
    runtime = ContainerRuntime(runtime_name, args.command)
    puller = runtime_puller(runtime)
    failed = 0
    for text in args.images:
        try:
            ref = parse_image(text)
            if ref.kind != "remote":
                print(f"{text}: a local image, nothing to pull", file=sys.stderr)
                continue
            path = pull_into_cache(
                ref,
                os.path.abspath(cache_dir),
                puller,
                force=args.force,
                log=lambda m: print(m, file=sys.stderr),
            )
        except (ImageError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            failed += 1
            continue
        print(path)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
