"""Launch a script under torch.distributed on a Slurm allocation: one ``srun`` task per node, each a ``torchrun``.

    python3 -m launchers.torch_distributed [TORCHRUN_OVERRIDES... --] (--trial MODULE:CLASS | SCRIPT...)

From the batch script (or anywhere outside an ``srun`` step) it runs::

    srun --nodes=N --ntasks-per-node=1 --kill-on-bad-exit=1 [DET_SRUN_ARGS...] \\
        python3 -m launchers.torch_distributed --node [OVERRIDES... --] SCRIPT...

and on every node (``--node``, or when already inside an ``srun`` task, or off Slurm)::

    torchrun --nnodes N --node-rank $SLURM_NODEID --nproc-per-node SLOTS --rdzv-backend c10d \\
        --rdzv-endpoint FIRST_NODE_IP:PORT --max-restarts 0 [OVERRIDES...] \\
        --module launchers.wrap_rank RANK -- SCRIPT...

torchrun stops the other ranks of a node when one fails; ``srun --kill-on-bad-exit=1`` stops the other nodes.
The launcher exits with the exit code of the rank that failed first.

Slurm preemption sends SIGTERM to every process of the job's steps: the ranks checkpoint and exit 0, but
torchrun, signalled too, exits non-zero however cleanly its workers ended. A node whose ranks all recorded
exit code 0 after a stop signal therefore exits 0, so the job counts as preempted rather than failed.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping

from launchers._common import (
    STOP_SIGNALS,
    children_of,
    ensure_exit_dir,
    ignore_usr1,
    in_slurm_allocation,
    in_srun_step,
    node_ranks_exited_cleanly,
    run_and_report,
    split_launcher_args,
    srun_per_node_cmd,
)

C10D_PORT_BASE = 29400


def c10d_port() -> int:
    from harness.cluster_info import get_port_offset

    return C10D_PORT_BASE + get_port_offset()


def build_torchrun_cmd(
    *,
    nnodes: int,
    node_rank: int,
    nproc_per_node: int,
    rdzv_host: str,
    rdzv_port: int,
    override_args: list[str],
    script: list[str],
    torchrun: list[str] | None = None,
) -> list[str]:
    return [
        *(torchrun or ["torchrun"]),
        "--nnodes",
        str(nnodes),
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        str(nproc_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{rdzv_host}:{rdzv_port}",
        "--max-restarts",
        "0",
        *override_args,
        "--module",
        "launchers.wrap_rank",
        "RANK",
        "--",
        *script,
    ]


def build_srun_cmd(
    *,
    nnodes: int,
    override_args: list[str],
    script: list[str],
    python: str = "python3",
    extra_srun_args: list[str] | None = None,
) -> list[str]:
    return srun_per_node_cmd(
        module="launchers.torch_distributed", nnodes=nnodes, override_args=override_args, script=script, python=python,
        extra_srun_args=extra_srun_args,
    )  # fmt: skip


def parse_args(args: list[str]) -> tuple[bool, list[str], list[str]]:
    """(node_mode, torchrun overrides, script). ``--trial X`` becomes ``python -m harness.exec.run_trial X``."""
    node = False
    if args and args[0] == "--node":
        node, args = True, args[1:]
    overrides, args = split_launcher_args(
        args, "usage: python3 -m launchers.torch_distributed [OVERRIDES... --] (--trial T | SCRIPT...)"
    )
    return node, overrides, args


def node_facts() -> tuple[int, int, int, str]:
    """(nnodes, node_rank, slots on this node, rendezvous host) from cluster info, else Slurm, else 1 node.

    The rendezvous host is ``DET_CHIEF_IP``, else the cluster info's first address, else the first node of
    ``SLURM_JOB_NODELIST`` resolved (a bare ``sbatch`` job): never loopback for several nodes, where every
    node would rendezvous with itself.
    """
    from harness.cluster_info import get_chief_ip, get_cluster_info

    info = get_cluster_info()
    env = os.environ
    if info is not None:
        nnodes, slots = len(info.container_addrs), len(info.slot_ids)
    else:
        nnodes, slots = _slurm_sizes(env)
    node_rank = int(env.get("SLURM_NODEID") or (info.container_rank if info else 0))
    host = "127.0.0.1" if nnodes == 1 else (get_chief_ip() or _first_node_addr())
    return nnodes, node_rank, slots, host


def _slurm_sizes(env: Mapping[str, str]) -> tuple[int, int]:
    """(nnodes, slots on this node) from Slurm's variables, when there is no cluster info; 1 when unset."""
    nnodes = int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or 1)
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    slots = int(env.get("SLURM_GPUS_ON_NODE") or len(visible) or 1)
    return nnodes, slots


def _first_node_addr() -> str:
    """The first node of the Slurm allocation (where torchrun's c10d store runs), when no cluster info says."""
    from harness.exec.job_nodes import NodeListError, container_addrs

    try:
        return container_addrs(os.environ)[0]
    except (NodeListError, OSError, subprocess.SubprocessError) as e:
        raise SystemExit(f"error: cannot find the first node's address for the rendezvous: {e}") from None


def _torchrun() -> list[str]:
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


def run_node(overrides: list[str], script: list[str]) -> int:
    nnodes, node_rank, slots, host = node_facts()
    os.environ["DET_CHIEF_IP"] = host if nnodes > 1 else os.environ.get("DET_CHIEF_IP", "127.0.0.1")
    os.environ["USE_TORCH_DISTRIBUTED"] = "True"
    cmd = build_torchrun_cmd(
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=slots,
        rdzv_host=host,
        rdzv_port=c10d_port(),
        override_args=overrides,
        script=script,
        torchrun=_torchrun(),
    )
    exit_dir = ensure_exit_dir()

    def on_signal(proc: subprocess.Popen[bytes], signum: int) -> None:
        targets = children_of(proc.pid) if signum in (signal.SIGUSR1, signal.SIGUSR2) else [proc.pid]
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    seen: list[int] = []
    rc = run_and_report(cmd, exit_dir, on_signal=on_signal, preexec_fn=ignore_usr1, signals_seen=seen)
    stopped_by = [s for s in seen if s in STOP_SIGNALS]
    if rc != 0 and stopped_by and node_ranks_exited_cleanly(exit_dir, node_rank, slots):
        name = signal.Signals(stopped_by[0]).name
        print(
            f"[launcher] torchrun exited with code {rc} after {name}, but all {slots} ranks of node "
            f"{node_rank} exited 0: the node stopped cleanly",
            flush=True,
        )
        return 0
    return rc


def main(argv: list[str] | None = None) -> int:
    node, overrides, script = parse_args(list(sys.argv[1:] if argv is None else argv))
    if node or in_srun_step() or not in_slurm_allocation():
        return run_node(overrides, script)
    nnodes = node_facts()[0]
    cmd = build_srun_cmd(
        nnodes=nnodes,
        override_args=overrides,
        script=script,
        python=sys.executable,
        extra_srun_args=shlex.split(os.environ.get("DET_SRUN_ARGS", "")),
    )
    return run_and_report(cmd, ensure_exit_dir())


if __name__ == "__main__":
    sys.exit(main())
