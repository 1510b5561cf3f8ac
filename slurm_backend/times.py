"""Slurm's time syntax (sbatch(1) ``--time``, slurm.conf(5) ``MaxTime``/``DefaultTime``) in whole minutes.

Slurm's forms: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``; seconds round up to a minute, as
Slurm rounds a time limit. A partition's ``UNLIMITED`` (``INFINITE``) is no limit.
"""

from __future__ import annotations

import math
import re

_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
UNLIMITED = ("UNLIMITED", "INFINITE")


def time_to_minutes(value: str) -> int:
    """A Slurm time string in whole minutes, seconds rounded up; ValueError naming the forms otherwise."""
    m = _TIME_RE.match(value.strip())
    if not m:
        raise ValueError(
            f"expected minutes or a Slurm time such as '90', '1:30:00' or '2-00:00:00', got {value!r}"
        )
    days, a, b, c = m.groups()
    if days is not None:
        total_s = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # H:M:S
        total_s = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:  # M:S
        total_s = int(a) * 60 + int(b)
    else:  # M
        total_s = int(a) * 60
    return math.ceil(total_s / 60)


def limit_to_minutes(value: str | None) -> int | None:
    """A partition's or pool's time limit in minutes; None for none or ``UNLIMITED``."""
    if value is None or value.strip().upper() in UNLIMITED:
        return None
    return time_to_minutes(value)
