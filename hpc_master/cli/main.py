"""`det`: the researcher's command line. Each command group lives in its own module and registers itself."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence

from hpc_master.cli import (
    checkpoint,
    command,
    deploy,
    experiment,
    master,
    model,
    notebook,
    preview,
    resources,
    shell,
    tensorboard,
    trial,
    user,
)
from hpc_master.errors import ClientError, ConfigError, DetError

# Modules that add sub-commands: each has `register(subparsers)`.
COMMAND_MODULES: list[Callable[[argparse._SubParsersAction], None]] = [  # type: ignore[type-arg]
    deploy.register,
    experiment.register,
    trial.register,
    checkpoint.register,
    model.register,
    user.register,
    master.register,
    resources.register,
    preview.register,
    command.register,
    notebook.register,
    tensorboard.register,
    shell.register,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="det", description="Slurm-native training platform (Determined-style)."
    )
    parser.add_argument(
        "-m", "--master", default=os.environ.get("DET_MASTER", "localhost:8080"),
        help="master address (default: $DET_MASTER or localhost:8080)",
    )  # fmt: skip
    parser.add_argument("-u", "--user", default=os.environ.get("DET_USER"), help="user to act as")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in COMMAND_MODULES:
        register(sub)
    return parser


def _setup_logging() -> None:
    logging.basicConfig(
        level=logging.DEBUG if os.environ.get("DET_DEBUG") else logging.INFO, format="%(message)s"
    )
    if not os.environ.get("DET_DEBUG"):  # httpx logs every request at INFO: not for people at a terminal
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)


def _report_error(e: DetError | deploy.LocalClusterError) -> int:
    """Print a failed command's error (with its traceback under ``DET_DEBUG``); its exit status."""
    if os.environ.get("DET_DEBUG"):
        traceback.print_exc()
    print(f"Error: {e}", file=sys.stderr)
    if isinstance(e, ConfigError):
        return 2
    return 1 if isinstance(e, ClientError) or not isinstance(e, DetError) else 3


def main(argv: Sequence[str] | None = None) -> int:
    _setup_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `det ... | head`: the reader went away; that is not an error
        sys.stderr.close()
        return 0
    except (DetError, deploy.LocalClusterError) as e:
        return _report_error(e)


if __name__ == "__main__":
    sys.exit(main())
