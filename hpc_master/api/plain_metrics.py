"""The plain form of a metrics batch: what harness.core sends, parsed without pydantic models.

At 100 rows per batch, validating into ``MetricsBatchRequest`` models, converting them and encoding each
row's metrics again cost about as much as storing the rows. ``plain_training_rows`` accepts only a strict
subset of the valid bodies, the form the harness sends, and turns it straight into SQLite rows; the fast
path hands every other body to pydantic, which stays the judge of what is valid.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from typing import Any

from pydantic_core import from_json, to_json

from hpc_master.api.schemas import MAX_BATCH_ROWS
from hpc_master.db.models import utcnow
from hpc_master.services.metrics import sqlite_time

_PLAIN_KEYS = frozenset({"trialRunId", "stepsCompleted", "group", "metrics", "reportTime"})
_MINUTE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}")
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})"
)


def _plain_time(value: Any, now: str) -> str:
    """``reportTime`` as stored: absent → now; an RFC 3339 timestamp (what the harness sends) → UTC."""
    if value is None:
        return now
    if type(value) is not str:
        raise ValueError("not a plain timestamp")
    if (  # the harness's own form, "2026-11-23T02:50:00.123456+00:00": UTC, only the layout changes
        len(value) == 32
        and value.isascii()
        and value[16] == ":"
        and value[19] == "."
        and value.endswith("+00:00")
        and value[17:19].isdigit()
        and value[17:19] < "60"
        and value[20:26].isdigit()
        and _valid_minute(value[:16])
    ):
        return f"{value[:10]} {value[11:26]}"
    if not _RFC3339.fullmatch(value):
        raise ValueError("not a plain timestamp")
    return sqlite_time(dt.datetime.fromisoformat(value))  # ValueError for impossible dates


@functools.lru_cache(maxsize=64)
def _valid_minute(prefix: str) -> bool:
    """Whether "YYYY-MM-DDTHH:MM" is a real date and time (checked once per minute of reports)."""
    if not _MINUTE.fullmatch(prefix):
        return False
    try:
        dt.datetime.fromisoformat(prefix)
    except ValueError:
        return False
    return True


def plain_training_rows(body: bytes, trial_id: int) -> list[tuple[Any, ...]] | None:
    """The SQLite rows of a batch in the plain form harnesses send, or None for anything else.

    Plain: ``{"metrics": [...]}`` whose items have the camelCase keys ``trialRunId`` and ``stepsCompleted``
    (non-negative JSON integers), ``metrics`` (an object), and optionally ``group`` (1-64 characters, not
    ``validation``) and ``reportTime`` (an RFC 3339 timestamp, as the harness sends). Every such body is valid for
    ``MetricsBatchRequest`` and gives the same rows; anything else (snake_case names, numbers as strings,
    extra keys, validations, …) returns None and goes through pydantic. At 100 rows this costs about two
    thirds of validating into models and converting them.
    """
    try:
        data = from_json(body)  # the parser model_validate_json uses (jiter)
        if type(data) is not dict or data.keys() != {"metrics"}:
            return None
        items = data["metrics"]
        if type(items) is not list or len(items) > MAX_BATCH_ROWS:
            return None
        now = sqlite_time(utcnow())
        rows: list[tuple[Any, ...]] = []
        for item in items:
            if type(item) is not dict or not item.keys() <= _PLAIN_KEYS:
                return None
            run, steps, metrics = item["trialRunId"], item["stepsCompleted"], item["metrics"]
            group = item.get("group", "training")
            if (
                type(run) is not int
                or type(steps) is not int
                or run < 0
                or steps < 0
                or type(metrics) is not dict
                or type(group) is not str
                or not 0 < len(group) <= 64
                or group == "validation"
            ):
                return None
            report_time = _plain_time(item.get("reportTime"), now)
            rows.append((trial_id, run, group, steps, to_json(metrics).decode(), report_time))
        return rows
    except Exception:  # not JSON, a missing key, a value to_json cannot encode: pydantic decides
        return None
