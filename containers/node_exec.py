"""One task of a trial's ``srun`` step entering the image: ``python -m containers.node_exec --spec FILE -- ARGV``.

It runs on the host of each task (the platform's interpreter, standard library only), reads the ``container.json``
the job entry wrote (``containers.job``) and replaces itself with ``apptainer exec … IMAGE ARGV``, passing in this
task's own environment (its ``SLURM_NODEID``, ``SLURM_PROCID``, ``CUDA_VISIBLE_DEVICES``…). Being an ``exec``,
the runtime receives the signals srun forwards to the task and passes them into the container.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from containers.job import JobContainer

NOT_STARTED = 127


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m containers.node_exec", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--spec", required=True, help="the run directory's container.json")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- ARGV to run in the image")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("nothing to run: give -- ARGV")
    try:
        with open(args.spec, encoding="utf-8") as f:
            box = JobContainer.from_json(json.load(f))
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"[container] cannot read {args.spec}: {e}", file=sys.stderr, flush=True)
        return NOT_STARTED
    full, env = box.command(command, os.environ)
    try:
        os.execve(full[0], full, env)
    except OSError as e:
        print(f"[container] cannot start {full[0]}: {e.strerror}", file=sys.stderr, flush=True)
    return NOT_STARTED


if __name__ == "__main__":
    sys.exit(main())
