"""Bounded integers for the API: every integer a request carries fits the column or query it reaches.

Unbounded, an integer of 2**63 or more overflows SQLite's driver (``OverflowError``) and one beyond 2**31 - 1
fails PostgreSQL's ``INTEGER`` columns (``DataError``): both were 500s. Bounded here, they are 400s from
validation, and the OpenAPI document says the range. The same aliases serve path and query parameters and body
fields (``annotated_types`` constraints, which FastAPI and pydantic both apply); ``db/models.py`` has the
column types they follow: ids are ``Integer`` (int32 on PostgreSQL), steps and lengths ``BigInteger``.
Offsets and limits are int32 as in Determined's ``/api/v1``.
"""

from __future__ import annotations

from typing import Annotated

from annotated_types import Ge, Le
from pydantic import AfterValidator, Field

from hpc_master.db.widths import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN

__all__ = ["INT32_MAX", "INT32_MIN", "INT64_MAX", "INT64_MIN"]

Id = Annotated[int, Ge(1), Le(INT32_MAX)]
"""The id of a user, experiment or trial (``Integer`` primary keys)."""
OptionalId = Annotated[int, Ge(0), Le(INT32_MAX)]
"""An id where 0 means none (``parentId``)."""
Count32 = Annotated[int, Ge(0), Le(INT32_MAX)]
"""A non-negative number kept in an ``Integer`` column (``trialRunId``, a run number)."""
Count64 = Annotated[int, Ge(0), Le(INT64_MAX)]
"""A non-negative number kept in a ``BigInteger`` column (``stepsCompleted``, a searcher length)."""
Int32 = Annotated[int, Ge(INT32_MIN), Le(INT32_MAX)]
Int64 = Annotated[int, Ge(INT64_MIN), Le(INT64_MAX)]

Offset = Annotated[int, Ge(0), Le(INT32_MAX)]
Limit = Annotated[int, Ge(INT32_MIN), Le(INT32_MAX)]
"""A page size; 0 or less means no limit."""
TimeoutSeconds = Annotated[int, Ge(0), Le(INT32_MAX)]
"""A long poll's wait (the routes clamp it further)."""

Fraction = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
"""A finite number in [0, 1] (progress)."""


def _check_allocation_id(value: str) -> str:
    trial, _, run = value.partition(".")  # ASCII digits: the pattern checked them
    if not (1 <= int(trial) <= INT32_MAX and int(run) <= INT32_MAX):
        raise ValueError(f"an allocation id's numbers are at most {INT32_MAX}")
    return value


AllocationId = Annotated[
    str, Field(pattern=r"^[0-9]{1,10}\.[0-9]{1,10}$"), AfterValidator(_check_allocation_id)
]
"""``"{trialId}.{trialRunId}"``, both within the id columns' range."""
