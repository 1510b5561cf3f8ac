"""Horovod jobs launch exactly like MPI jobs on Slurm: ``srun --mpi=pmix``, one rank per slot.

python3 -m launchers.horovod [SRUN_OVERRIDES... --] (--trial MODULE:CLASS | SCRIPT...)
"""

from __future__ import annotations

import sys

from launchers.mpi import build_local_cmd, build_srun_cmd, main, parse_args

__all__ = ["build_local_cmd", "build_srun_cmd", "main", "parse_args"]

if __name__ == "__main__":
    sys.exit(main())
