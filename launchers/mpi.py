"""Launch one rank per slot with ``srun --mpi=pmix`` (MPI and Horovod jobs).

    python3 -m launchers.mpi [SRUN_OVERRIDES... --] (--trial MODULE:CLASS | SCRIPT...)

runs ``srun --mpi=pmix --ntasks-per-node=SLOTS --kill-on-bad-exit=1 [OVERRIDES...] python3 -m launchers.wrap_rank
SLURM_PROCID,PMIX_RANK,OMPI_COMM_WORLD_RANK -- SCRIPT...``. srun forwards signals to every task, and stops the
others when one fails. Off Slurm it runs a single rank.
"""

from __future__ import annotations

import os
import shlex
import sys

from launchers._common import (
    ensure_exit_dir,
    in_slurm_allocation,
    in_srun_step,
    run_and_report,
    split_launcher_args,
)

RANK_VARS = "SLURM_PROCID,PMIX_RANK,OMPI_COMM_WORLD_RANK"


def build_srun_cmd(
    *, slots_per_node: int, script: list[str], override_args: list[str] | None = None, python: str = "python3"
) -> list[str]:
    return [
        "srun",
        "--mpi=pmix",
        f"--ntasks-per-node={slots_per_node}",
        "--kill-on-bad-exit=1",
        *(override_args or []),
        python,
        "-m",
        "launchers.wrap_rank",
        RANK_VARS,
        "--",
        *script,
    ]


def build_local_cmd(*, script: list[str], python: str = "python3", rank: str = "0") -> list[str]:
    return [python, "-m", "launchers.wrap_rank", rank, "--", *script]


def parse_args(args: list[str]) -> tuple[list[str], list[str]]:
    return split_launcher_args(
        args, "usage: python3 -m launchers.mpi [SRUN_OVERRIDES... --] (--trial T | SCRIPT...)"
    )


def slots_per_node() -> int:
    from harness.cluster_info import get_cluster_info

    info = get_cluster_info()
    if info is not None:
        return len(info.slot_ids)
    env = os.environ
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    return int(env.get("SLURM_GPUS_ON_NODE") or len(visible) or 1)


def main(argv: list[str] | None = None) -> int:
    overrides, script = parse_args(list(sys.argv[1:] if argv is None else argv))
    if in_srun_step() or not in_slurm_allocation():
        rank = RANK_VARS if in_srun_step() else "0"  # already one task per rank: do not nest srun
        cmd = build_local_cmd(script=script, python=sys.executable, rank=rank)
    else:
        overrides = [*shlex.split(os.environ.get("DET_SRUN_ARGS", "")), *overrides]
        cmd = build_srun_cmd(
            slots_per_node=slots_per_node(), script=script, override_args=overrides, python=sys.executable
        )
    return run_and_report(cmd, ensure_exit_dir())


if __name__ == "__main__":
    sys.exit(main())
