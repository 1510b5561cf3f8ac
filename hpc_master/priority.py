"""Determined's experiment ``resources.priority`` on Slurm (docs/priority.md).

Determined's priority runs from 1 (highest) to 99 (lowest), 42 when unset. Slurm orders pending jobs by their
priority, which ``--nice=N`` lowers by N; only an operator may raise it (a negative nice), and the master
submits as each researcher. So a job gets ``--nice=(priority - 1) * step``: priority 1 adds nothing, every step
down costs ``step`` (the pool's ``priority_nice_step``, ``master.yaml``). ``det e set priority`` changes the
experiment's config; the loop then re-nices its pending jobs (``scontrol update JobId=… Nice=…``).
"""

from __future__ import annotations

DEFAULT_PRIORITY = 42  # Determined's default for an experiment that sets none


def nice(priority: int | None, step: int) -> int | None:
    """The ``--nice`` of a job of an experiment with `priority`; None when the pool passes no priority."""
    if step <= 0:
        return None
    return ((priority or DEFAULT_PRIORITY) - 1) * step
