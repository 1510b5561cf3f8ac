"""`det tensorboard`: TensorBoard over experiments' trials, as a Slurm job reached through the master's proxy.

    det tensorboard start EXP_ID... [-t TRIAL_ID...] [--no-browser] [-d] [--config K=V]...

serves every trial's ``Determined/<metric>`` scalars (the harness writes them) and whatever the trials wrote
to ``get_tensorboard_path()``. It ends after ``tensorboard_timeout`` (master.yaml; 300 s) with no traffic
through the proxy, or the task's ``idle_timeout``.
"""

from __future__ import annotations

import argparse

from hpc_master.cli.command import add_common, add_launch_flags
from hpc_master.cli.notebook import open_task, start_task


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    tb = sub.add_parser("tensorboard", help="TensorBoard over experiments' trials, through the master")
    tb_sub = tb.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = tb_sub.add_parser("start", help="start TensorBoard as a Slurm job and open it")
    p.add_argument(
        "experiment_ids", metavar="EXP_ID", type=int, nargs="*", help="experiments whose trials to show"
    )
    p.add_argument(
        "-t", "--trial-ids", type=int, nargs="+", default=[], metavar="TRIAL_ID", help="trials to show"
    )
    add_launch_flags(p)
    p.add_argument("--no-browser", action="store_true", help="print the address only")
    p.set_defaults(func=_start_tb, plural="tensorboards", key="tensorboard", what="TensorBoard")
    p = tb_sub.add_parser("open", help="open a running TensorBoard in a browser")
    p.add_argument("task_id", metavar="ID")
    p.set_defaults(func=open_task, plural="tensorboards", key="tensorboard")
    add_common(tb_sub, "tensorboards", "tensorboard")


def _start_tb(args: argparse.Namespace) -> int:
    return start_task(args, extra={"experimentIds": args.experiment_ids, "trialIds": args.trial_ids})
