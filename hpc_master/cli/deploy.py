"""`det deploy local up|down|status`: a throwaway multi-node Slurm cluster on this machine (root only)."""

from __future__ import annotations

import argparse
import json
import socket
import time

from local_cluster.cluster import down, status, up
from local_cluster.spec import LocalClusterSpec, get_state_dir
from local_cluster.system import LocalClusterError

__all__ = ["LocalClusterError", "register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    deploy = sub.add_parser("deploy", help="deploy a cluster to try and test on")
    deploy_sub = deploy.add_subparsers(dest="target", metavar="TARGET", required=True)
    local = deploy_sub.add_parser(
        "local", help="a multi-node Slurm cluster on this machine (network namespaces)"
    )
    local_sub = local.add_subparsers(dest="action", metavar="ACTION", required=True)

    p_up = local_sub.add_parser("up", help="install and start munge, slurmctld and N slurmd")
    p_up.add_argument("--nodes", type=int, default=2, help="number of compute nodes (default 2)")
    p_up.add_argument("--gpus-per-node", type=int, default=2, help="fake GPUs per node (default 2)")
    p_up.add_argument(
        "--cpus-per-node", type=int, default=4, help="CPUs per node as Slurm sees them (default 4)"
    )
    p_up.add_argument(
        "--mem-per-node-mb", type=int, default=4096, help="memory per node in MB (default 4096)"
    )
    p_up.add_argument("--gpu-type", default="a100", help="GPU type name in gres (default a100)")
    p_up.add_argument("--no-install", action="store_true", help="do not apt-get install missing packages")
    p_up.add_argument(
        "--no-accounting", action="store_true",
        help="skip slurmdbd and its private MariaDB (then sacct knows no finished jobs)",
    )  # fmt: skip
    p_up.add_argument("--force", action="store_true", help="move an existing /etc/slurm configuration aside")
    p_up.add_argument(
        "--create-user", action="append", default=[], metavar="NAME",
        help="create a non-root account that can submit jobs (removed again by down, which keeps its home "
        "if the researcher put files there); repeatable",
    )  # fmt: skip
    p_up.set_defaults(func=_up)

    p_down = local_sub.add_parser(
        "down", help="stop everything and remove what up created (what others put there stays)"
    )
    p_down.set_defaults(func=_down)
    p_status = local_sub.add_parser("status", help="show whether the local cluster is up, and its nodes")
    p_status.add_argument("--json", action="store_true", help="machine-readable output")
    p_status.set_defaults(func=_status)


def _up(args: argparse.Namespace) -> int:
    spec = LocalClusterSpec(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        cpus_per_node=args.cpus_per_node,
        mem_per_node_mb=args.mem_per_node_mb,
        gpu_type=args.gpu_type,
        accounting=not args.no_accounting,
        controller_host=socket.gethostname().split(".")[0],
        state_dir=str(get_state_dir()),
    )
    started = time.monotonic()
    try:
        up(spec, install=not args.no_install, force=args.force, users=tuple(args.create_user))
    except ValueError as e:
        raise LocalClusterError(str(e)) from e
    took = time.monotonic() - started
    print(f"Local Slurm cluster up in {took:.1f} s: {spec.nodes} nodes ({spec.node_list}), "
          f"{spec.gpus_per_node} GPUs and {spec.cpus_per_node} CPUs each; partitions batch (default), "
          f"short ({spec.short_max_time_min} min limit), urgent (preempts batch).")  # fmt: skip
    print("Try: sinfo; srun -N2 hostname; det deploy local status")
    return 0


def _down(args: argparse.Namespace) -> int:
    kept = down()
    if kept is None:
        print("The local Slurm cluster is not up; nothing to do.")
        return 0
    print("Local Slurm cluster removed.")
    for k in kept:
        print(k)
    return 0


def _status(args: argparse.Namespace) -> int:
    info = status()
    # 0: up and able to run jobs; 1: not up; 3: up but stale (its daemons are not running).
    rc = 1 if not info["up"] else 0 if info["healthy"] else 3
    if args.json:
        print(json.dumps(info, indent=2))
        return rc
    if not info["up"]:
        print("The local Slurm cluster is not up. Start it (as root) with: det deploy local up")
        return 1
    for key, value in info.items():
        if key == "sinfo":
            print("sinfo:")
            for line in str(value).splitlines():
                print(f"  {line}")
        else:
            print(f"{key}: {value}")
    found = info["problems"]
    if rc and isinstance(found, list):
        print(
            f"The local Slurm cluster is stale: {'; '.join(found)}. `det deploy local up` removes it and starts it afresh."
        )
    return rc
