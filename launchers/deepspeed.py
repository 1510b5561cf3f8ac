"""Launch a script under DeepSpeed's launcher on a Slurm allocation: one ``srun`` task per node, no SSH.

    python3 -m launchers.deepspeed [DEEPSPEED_OVERRIDES... --] (--trial MODULE:CLASS | SCRIPT...)

From the batch script (or anywhere outside an ``srun`` step) it runs::

    srun --nodes=N --ntasks-per-node=1 --kill-on-bad-exit=1 [DET_SRUN_ARGS...] \\
        python3 -m launchers.deepspeed --node [OVERRIDES... --] SCRIPT...

and on every node (``--node``, or when already inside an ``srun`` task, or off Slurm) it writes the hostfile
(``ADDR slots=SLOTS``, one line per node of the allocation; ``localhost`` for one node) into the run directory
and runs::

    deepspeed --hostfile HOSTFILE --no_ssh --node_rank $SLURM_NODEID --master_addr FIRST_NODE_IP \\
        --master_port PORT [OVERRIDES...] --no_local_rank --module -- launchers.deepspeed --rank SCRIPT...

Why ``--no_ssh`` (DeepSpeed's runner since deepspeedai/DeepSpeed#5728, July 2024): DeepSpeed's default
multi-node path starts the other nodes with pdsh over passwordless SSH (Determined runs an sshd in every
container for it), which Slurm sites seldom allow. ``--launcher slurm`` needs no SSH but runs
``srun -n TOTAL python -u SCRIPT`` itself: a step nested in ours, ranks that are Slurm tasks without DeepSpeed's
``RANK``/``LOCAL_RANK``, ``--module`` ignored, ``sinfo`` required in the image. With ``--no_ssh --node_rank R``
each node's runner starts only its own ranks through ``deepspeed.launcher.launch`` (which sets ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_SIZE``, ``CROSS_RANK``, ``CROSS_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``),
inside the one ``srun`` step above, exactly as torchrun runs under ``launchers.torch_distributed``; every rank
inherits the job's whole environment, so no ``.deepspeed_env`` file is needed.

Each rank starts as ``launchers.deepspeed --rank``, which fills in the torchrun names the harness reads
(``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``), maps DeepSpeed's ``CUDA_VISIBLE_DEVICES=0,1,..``
(indices into the hostfile's slots) back onto the GPUs Slurm gave the node, and runs ``launchers.wrap_rank RANK``.

A stop signal (preemption) reaches every process of the step: DeepSpeed's runner dies at once while its
``launch`` child stops the ranks. A node whose ranks all recorded exit code 0 after a stop signal exits 0, so
the job counts as preempted rather than failed; the launcher waits up to ``STOP_WAIT_S`` for those records.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, MutableMapping

from launchers import wrap_rank
from launchers._common import (
    STOP_SIGNALS,
    children_of,
    ensure_exit_dir,
    first_failure,
    ignore_usr1,
    in_slurm_allocation,
    in_srun_step,
    node_ranks_exited_cleanly,
    run_and_report,
    split_launcher_args,
    srun_per_node_cmd,
)
from launchers.torch_distributed import node_facts

MASTER_PORT_BASE = 29500  # DeepSpeed's TORCH_DISTRIBUTED_DEFAULT_PORT
STOP_WAIT_S = 45.0  # deepspeed.launcher.launch gives its ranks 30 s after SIGTERM before SIGKILL
NODE_DEVICES_ENV = "DET_DEEPSPEED_NODE_DEVICES"
USAGE = "usage: python3 -m launchers.deepspeed [OVERRIDES... --] (--trial T | SCRIPT...)"
_OWNED = "is set by the launcher from the Slurm allocation"
UNSUPPORTED_OVERRIDES = {
    "--hostfile": _OWNED,
    "-H": _OWNED,
    "--no_ssh": _OWNED,
    "--node_rank": _OWNED,
    "--module": "is set by the launcher: ranks start as `python -m launchers.deepspeed --rank SCRIPT...`",
    "--no_python": "cannot be combined with the launcher's --module",
    "--launcher": "has no effect: every node runs its own DeepSpeed launcher (--no_ssh)",
    "--launcher_args": "has no effect: every node runs its own DeepSpeed launcher (--no_ssh)",
    "--autotuning": "is not supported: DeepSpeed's autotuner starts its experiments over ssh",
}


def build_hostfile_text(nodes: list[str], slots: int) -> str:
    """DeepSpeed's MPI-style hostfile: ``HOST slots=N`` per node, in node-rank order."""
    if len(set(nodes)) != len(nodes):
        raise ValueError(f"DeepSpeed's hostfile needs one distinct host per node, got {nodes}")
    return "".join(f"{host} slots={slots}\n" for host in nodes)


def build_deepspeed_cmd(
    *,
    hostfile: str,
    node_rank: int,
    master_addr: str,
    master_port: int,
    override_args: list[str],
    script: list[str],
    deepspeed: list[str] | None = None,
) -> list[str]:
    return [
        *(deepspeed or ["deepspeed"]),
        "--hostfile", hostfile, "--no_ssh", "--node_rank", str(node_rank),
        "--master_addr", master_addr, "--master_port", str(master_port),
        *override_args,
        "--no_local_rank", "--module",
        "--",  # all after it is the rank's command: DeepSpeed's argparse must not read the script's flags
        "launchers.deepspeed", "--rank", *script,
    ]  # fmt: skip


def build_srun_cmd(
    *,
    nnodes: int,
    override_args: list[str],
    script: list[str],
    python: str = "python3",
    extra_srun_args: list[str] | None = None,
) -> list[str]:
    return srun_per_node_cmd(
        module="launchers.deepspeed", nnodes=nnodes, override_args=override_args, script=script, python=python,
        extra_srun_args=extra_srun_args,
    )  # fmt: skip


def parse_args(args: list[str]) -> tuple[bool, list[str], list[str]]:
    """(node_mode, deepspeed overrides, script). ``--trial X`` becomes ``python -m harness.exec.run_trial X``."""
    node = False
    if args and args[0] == "--node":
        node, args = True, args[1:]
    overrides, script = split_launcher_args(args, USAGE)
    for arg in overrides:
        reason = UNSUPPORTED_OVERRIDES.get(arg.split("=", 1)[0])
        if reason:
            raise SystemExit(f"error: DeepSpeed's {arg.split('=', 1)[0]} {reason}")
    return node, overrides, script


def deepspeed_cmd() -> list[str]:
    """DeepSpeed's ``deepspeed`` runner next to this Python, else on PATH, else ``python -m`` its module."""
    exe = shutil.which("deepspeed", path=os.path.dirname(sys.executable)) or shutil.which("deepspeed")
    if exe:
        return [exe]
    if importlib.util.find_spec("deepspeed") is not None:
        return [sys.executable, "-m", "deepspeed.launcher.runner"]
    raise SystemExit(
        "error: DeepSpeed's `deepspeed` launcher was not found on PATH or next to "
        f"{sys.executable}: `pip install deepspeed` in the job's environment (or image)"
    )


def get_run_dir() -> pathlib.Path:
    """Where the hostfile goes: ``DET_RUN_DIR`` (the trial run's directory), else a new temporary directory."""
    raw = os.environ.get("DET_RUN_DIR")
    return pathlib.Path(raw) if raw else pathlib.Path(tempfile.mkdtemp(prefix="det-deepspeed-"))


def node_hosts(nnodes: int) -> list[str]:
    """One host per node for the hostfile: the cluster info's addresses, else the Slurm node list's."""
    if nnodes == 1:
        return ["localhost"]  # as Determined: DeepSpeed never contacts it, and it is always distinct
    from harness.cluster_info import get_cluster_info
    from harness.exec.job_nodes import NodeListError, container_addrs

    info = get_cluster_info()
    try:
        addrs = list(info.container_addrs) if info is not None else container_addrs(os.environ)
    except (NodeListError, OSError, subprocess.SubprocessError) as e:
        raise SystemExit(f"error: cannot list the nodes' addresses for DeepSpeed's hostfile: {e}") from None
    if len(addrs) != nnodes:
        raise SystemExit(f"error: {nnodes} nodes but {len(addrs)} node addresses ({addrs})")
    return addrs


def write_hostfile(run_dir: pathlib.Path, text: str, node_rank: int) -> pathlib.Path:
    """Every node writes the same text; each replaces the file atomically (a shared run directory)."""
    alloc = os.environ.get("DET_ALLOCATION_ID") or os.environ.get("SLURM_JOB_ID") or "local"
    path = run_dir / f"hostfile-{alloc}.txt"
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{path.name}.{node_rank}.{os.getpid()}.tmp"
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def signal_targets(
    runner: int, signum: int, children: Callable[[int], list[int]] = children_of
) -> tuple[list[int], int]:
    """(pids, signal) to forward ``signum`` to: runner → ``deepspeed.launcher.launch`` → ranks (wrap_rank)."""
    launches = children(runner)
    if signum in (signal.SIGUSR1, signal.SIGUSR2):  # DeepSpeed has no handler: straight to the ranks
        return [rank for launch in launches for rank in children(launch)], signum
    if signum in STOP_SIGNALS and launches:  # launch stops its ranks on SIGTERM (not on SIGHUP)
        return launches, signal.SIGTERM
    return [runner], signum


def node_stopped_cleanly(exit_dir: pathlib.Path, node: int, ranks: int, wait_s: float) -> bool:
    """Whether all ``ranks`` of ``node`` recorded exit 0, waiting up to ``wait_s`` while none failed."""
    deadline = time.monotonic() + wait_s
    while not node_ranks_exited_cleanly(exit_dir, node, ranks):
        if first_failure(exit_dir) is not None or time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def run_node(overrides: list[str], script: list[str]) -> int:
    deepspeed = deepspeed_cmd()
    nnodes, node_rank, slots, host = node_facts()
    try:
        text = build_hostfile_text(node_hosts(nnodes), slots)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    hostfile = write_hostfile(get_run_dir(), text, node_rank)
    _export_node_env(os.environ, host=host, nnodes=nnodes, hostfile=hostfile)
    from harness.cluster_info import get_port_offset

    cmd = build_deepspeed_cmd(
        hostfile=str(hostfile),
        node_rank=node_rank,
        master_addr=host,
        master_port=MASTER_PORT_BASE + get_port_offset(),
        override_args=overrides,
        script=script,
        deepspeed=deepspeed,
    )
    exit_dir = ensure_exit_dir()

    def on_signal(proc: subprocess.Popen[bytes], signum: int) -> None:
        pids, sig = signal_targets(proc.pid, signum)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    seen: list[int] = []
    rc = run_and_report(cmd, exit_dir, on_signal=on_signal, preexec_fn=ignore_usr1, signals_seen=seen)
    stopped_by = [s for s in seen if s in STOP_SIGNALS]
    if rc != 0 and stopped_by and node_stopped_cleanly(exit_dir, node_rank, slots, STOP_WAIT_S):
        name = signal.Signals(stopped_by[0]).name
        print(
            f"[launcher] deepspeed exited with code {rc} after {name}, but all {slots} ranks of node "
            f"{node_rank} exited 0: the node stopped cleanly",
            flush=True,
        )
        return 0
    return rc


def _export_node_env(
    env: MutableMapping[str, str], *, host: str, nnodes: int, hostfile: pathlib.Path
) -> None:
    """What DeepSpeed's runner passes on to this node's ranks: the chief's address, the hostfile, the node's own
    devices (for rank_env) and, when unset, NCCL's network interface."""
    env["DET_CHIEF_IP"] = host if nnodes > 1 else env.get("DET_CHIEF_IP", "127.0.0.1")
    env["USE_DEEPSPEED"] = "1"
    env["DET_DEEPSPEED_HOSTFILE_PATH"] = str(hostfile)
    if env.get("CUDA_VISIBLE_DEVICES", "").strip():
        env[NODE_DEVICES_ENV] = env["CUDA_VISIBLE_DEVICES"]
        if not env.get("NCCL_SOCKET_IFNAME", "").strip() and env.get("DET_INTER_NODE_NETWORK_INTERFACE"):
            env["NCCL_SOCKET_IFNAME"] = env["DET_INTER_NODE_NETWORK_INTERFACE"]


def remap_devices(deepspeed_devices: str, node_devices: str) -> str:
    """DeepSpeed's ``CUDA_VISIBLE_DEVICES`` (indices 0..slots-1) as the node's own devices (Slurm's list)."""
    node = [d.strip() for d in node_devices.split(",") if d.strip()]
    picked = [d.strip() for d in deepspeed_devices.split(",") if d.strip()]
    if not node or not all(d.isdigit() and int(d) < len(node) for d in picked):
        return deepspeed_devices
    return ",".join(node[int(d)] for d in picked)


def rank_env(env: MutableMapping[str, str]) -> None:
    """Give a DeepSpeed rank the torchrun variable names the harness reads, and the node's real GPUs."""
    for torchrun_name, deepspeed_name in (
        ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"),
        ("GROUP_RANK", "CROSS_RANK"),
        ("GROUP_WORLD_SIZE", "CROSS_SIZE"),
    ):
        if deepspeed_name in env and torchrun_name not in env:
            env[torchrun_name] = env[deepspeed_name]
    if env.get(NODE_DEVICES_ENV) and "CUDA_VISIBLE_DEVICES" in env:
        env["CUDA_VISIBLE_DEVICES"] = remap_devices(env["CUDA_VISIBLE_DEVICES"], env[NODE_DEVICES_ENV])


def run_rank(script: list[str]) -> int:
    """One rank, as DeepSpeed starts it: fix up the environment, then ``wrap_rank RANK -- SCRIPT...``."""
    if script[:1] == ["--"]:
        script = script[1:]
    rank_env(os.environ)
    return wrap_rank.main(["RANK", "--", *script])


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--rank"]:
        return run_rank(args[1:])
    node, overrides, script = parse_args(args)
    if node or in_srun_step() or not in_slurm_allocation():
        return run_node(overrides, script)
    deepspeed_cmd()  # fail before starting a step on every node
    cmd = build_srun_cmd(
        nnodes=node_facts()[0],
        override_args=overrides,
        script=script,
        python=sys.executable,
        extra_srun_args=shlex.split(os.environ.get("DET_SRUN_ARGS", "")),
    )
    return run_and_report(cmd, ensure_exit_dir())


if __name__ == "__main__":
    sys.exit(main())
