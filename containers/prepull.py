"""Pull images into an image cache ahead of time (on a login node, which can reach the registry):

    python -m containers.prepull --runtime apptainer --cache-dir /shared/images [--force] IMAGE...

Trials then find the image in the cache and start without pulling. Prints each cached image's path. To take the
runtime and cache directory from a resource pool of ``master.yaml``, use ``python -m hpc_master.prepull``, which
reads the master config and calls :func:`pull_images` (this room does not read the master's config).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable

from containers.images import ImageError, parse_image, pull_into_cache, runtime_puller
from containers.runtime import RUNTIMES, ContainerRuntime


def pull_images(
    images: Iterable[str], *, runtime_name: str, cache_dir: str, command: str = "", force: bool = False
) -> int:
    """Pull each remote image into ``cache_dir``; print its path. Returns the exit status (1 if any failed)."""
    if runtime_name == "none":
        print("error: the pool runs no container runtime (container.runtime: none)", file=sys.stderr)
        return 2
    name = next((r for r in RUNTIMES if r == runtime_name), None)
    if name is None:
        print(
            f"error: unknown container runtime {runtime_name!r} (one of {', '.join(RUNTIMES)})",
            file=sys.stderr,
        )
        return 2
    runtime = ContainerRuntime(name, command)
    puller = runtime_puller(runtime)
    failed = 0
    for text in images:
        try:
            ref = parse_image(text)
            if ref.kind != "remote":
                print(f"{text}: a local image, nothing to pull", file=sys.stderr)
                continue
            path = pull_into_cache(
                ref,
                os.path.abspath(cache_dir),
                puller,
                force=force,
                log=lambda m: print(m, file=sys.stderr),
            )
        except (ImageError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            failed += 1
            continue
        print(path)
    return 1 if failed else 0


def add_pull_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument("images", nargs="+", metavar="IMAGE")
    parser.add_argument("--cache-dir", required=required, help="the cache directory")
    parser.add_argument("--runtime", required=required, choices=RUNTIMES)
    parser.add_argument("--command", default="", help="the runtime's command, when not its name on PATH")
    parser.add_argument("--force", action="store_true", help="pull again even when cached")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m containers.prepull", description=__doc__.split("\n")[0])
    add_pull_arguments(parser, required=True)
    args = parser.parse_args(argv)
    return pull_images(
        args.images,
        runtime_name=args.runtime,
        cache_dir=args.cache_dir,
        command=args.command,
        force=args.force,
    )


if __name__ == "__main__":
    sys.exit(main())
