"""Determined's experiment ``resources.priority`` on Slurm (docs/priority.md).

Determined's priority runs from 1 (highest) to 99 (lowest), 42 when unset. Slurm orders pending jobs by their
priority, which ``--nice=N`` lowers by N; only an operator may raise it (a negative nice), and the master
submits as each researcher. So a job at the default priority competes as a plain ``sbatch`` of its user does
(no ``--nice``: nice 0), and each step below it costs ``step`` (the pool's ``priority_nice_step``,
``master.yaml``): ``--nice=(priority - 42) * step``. A priority above the default cannot rank a job above
other users' plain jobs without an operator's rights: it gets nice 0, as the default does, and ``det e
describe`` says so. ``det e set priority`` changes the experiment's config; the loop then re-nices its
pending jobs (``scontrol update JobId=… Nice=…``).
"""

from __future__ import annotations

DEFAULT_PRIORITY = 42  # Determined's default for an experiment that sets none


def nice(priority: int | None, step: int) -> int | None:
    """The ``--nice`` of a job of an experiment with `priority`; None when the pool passes no priority."""
    if step <= 0:
        return None
    return max(0, (priority or DEFAULT_PRIORITY) - DEFAULT_PRIORITY) * step


def describe(priority: int | None) -> str:
    """What the priority means for the experiment's Slurm jobs, for ``det e describe``."""
    value = priority or DEFAULT_PRIORITY
    if value == DEFAULT_PRIORITY:
        return f"{value} (Slurm: its jobs compete as plain sbatch jobs do, nice 0)"
    if value > DEFAULT_PRIORITY:
        return (
            f"{value} (Slurm: its jobs rank below plain sbatch jobs: nice ({value} - 42) x the pool's step)"
        )
    return (
        f"{value} (Slurm: as 42, nice 0; ranking a job above other users' plain sbatch jobs needs a Slurm "
        "operator's rights)"
    )
