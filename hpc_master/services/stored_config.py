"""A stored experiment's or task's config, typed: the one place the master reads (and edits) a stored config.

    config = experiment_config(experiment)     # ExperimentConfig; parsed once per experiment and content
    config = task_config(task)                 # TaskConfig, the same way
    config = edited_config(experiment, {"labels": [...]})   # PATCH: the edited dict, checked, to store

What is stored is the completed config that admission produced (`hpc_master.admission`), as its ``to_dict()``,
which round-trips through `parse_experiment_config`. Every reader goes through here, so a field has one
default and one meaning (``max_restarts``, ``resources.slots_per_trial``, the searcher's length and unit...);
``tests/unit/test_stored_config_reads.py`` fails on a raw ``.config[...]`` or ``.config.get(...)`` anywhere
else in the master.

Parsing costs 0.1 to 0.8 ms, and the list and ingest routes read the same experiments again and again, so
the typed config is kept per (kind, id, start time; SQLite may give a deleted experiment's id to the next one)
beside the sections of the raw config that ``PATCH`` may change (`EDITABLE`): a hit compares those, not the
whole dict. After create, a stored config is written here only (`edited_config`; the writers are checked by
``tests/unit/test_stored_config_reads.py``); a task's never changes. The typed config is shared: callers must
not change it.
"""

from __future__ import annotations

import copy
import datetime as dt
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from hpc_master.db.models import ExperimentModel, TaskModel
from hpc_master.errors import ClientError
from hpc_master.expconf import ExperimentConfig, ExperimentConfigError, parse_experiment_config
from hpc_master.expconf.tasks import TaskConfig, TaskType, parse_task_config

MAX_ENTRIES = 2048

EDITABLE = ("name", "description", "labels", "checkpoint_storage", "resources")
"""What `edited_config` (``PATCH``) changes in an experiment's stored config."""
_Key = tuple[str, int | str, dt.datetime | None]
_cache: dict[_Key, tuple[tuple[Any, ...], Any]] = {}
"""Key → (the `EDITABLE` sections of the raw dict it was parsed from, its typed config). Reads take no lock (a dict lookup is atomic);
writes do, and evict the oldest entries (insertion order) past `MAX_ENTRIES`."""
_lock = threading.Lock()
stats = {"parses": 0, "hits": 0}
"""How many stored configs were parsed, and how many reads were answered from the cache (tests, benches)."""
T = TypeVar("T")


class StoredConfigError(ClientError):
    """A stored config that this master's model refuses (written by an older master, or by hand)."""

    def __init__(self, what: str, err: ExperimentConfigError) -> None:
        super().__init__(
            f"{what}'s stored config is not valid for this master: {err.message}",
            code="invalid_stored_config",
            field=err.field,
        )


def experiment_config(experiment: ExperimentModel) -> ExperimentConfig:
    """The experiment's stored config, typed (shared: do not change it)."""
    raw = experiment.config or {}
    key = ("experiment", experiment.id, experiment.start_time)
    hit = _cache.get(key)
    if hit is not None and hit[0] == tuple(raw.get(k) for k in EDITABLE):
        stats["hits"] += 1
        return cast(ExperimentConfig, hit[1])
    return _parse(key, raw, "experiment", parse_experiment_config)


def task_config(task: TaskModel) -> TaskConfig:
    """The task's stored config, typed (shared: do not change it)."""
    raw = task.config or {}
    key = ("task", task.id, task.start_time)
    hit = _cache.get(key)
    if hit is not None:
        stats["hits"] += 1
        return cast(TaskConfig, hit[1])
    task_type = TaskType(task.task_type)
    return _parse(key, raw, "task", lambda config: parse_task_config(config, task_type))


def _parse(key: _Key, raw: dict[str, Any], kind: str, parse: Callable[[dict[str, Any]], T]) -> T:
    stats["parses"] += 1
    try:
        typed = parse(raw)
    except ExperimentConfigError as err:
        raise StoredConfigError(f"{kind} {key[1]}", err) from None
    if key[1] is not None:  # a row not yet flushed has no id: nothing to keep it under
        kept = copy.deepcopy(tuple(raw.get(k) for k in EDITABLE))
        with _lock:
            _cache.pop(key, None)
            _cache[key] = (kept, typed)
            while len(_cache) > MAX_ENTRIES:
                del _cache[next(iter(_cache))]
    return typed


def forget() -> None:
    """Drop every kept config, as a new master process starts (tests that change stored rows behind the API)."""
    with _lock:
        _cache.clear()


def edited_config(
    experiment: ExperimentModel,
    values: Mapping[str, Any] | None = None,
    merged: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The experiment's stored config with top-level `values` set and `merged` sections updated key by key
    (``checkpoint_storage``'s GC policy, ``resources``' knobs), checked by the typed model before anything is
    written: the dict to store. The caller writes it."""
    config = copy.deepcopy(experiment.config or {})
    config.update(values or {})
    for section, update in (merged or {}).items():
        current = config.get(section)
        config[section] = {**(current if isinstance(current, dict) else {}), **update}
    parse_experiment_config(config)  # an `ExperimentConfigError` naming the field, before anything is written
    return config


def stored_labels(experiment: ExperimentModel) -> list[str]:
    return list(experiment_config(experiment).labels)
