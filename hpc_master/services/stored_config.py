"""A stored experiment's or task's config, typed: the one place the master reads (and edits) a stored config.

    config = experiment_config(experiment)     # ExperimentConfig; parsed once per experiment and content
    config = task_config(task)                 # TaskConfig, the same way
    config = edited_config(experiment, {"labels": [...]})   # PATCH: the edited dict, checked, to store

What is stored is the completed config that admission produced (`hpc_master.admission`), as its ``to_dict()``,
which round-trips through `parse_experiment_config`. Every reader goes through here, so a field has one
default and one meaning (``max_restarts``, ``resources.slots_per_trial``, the searcher's length and unit...);
``tests/unit/test_stored_config_reads.py`` fails on a raw ``.config[...]`` or ``.config.get(...)`` anywhere
else in the master.

Parsing costs about 0.1 ms, and the list and ingest routes read the same experiments again and again, so the
typed config is kept per (kind, id, start time) beside the raw config it came from; a hit costs a comparison of the
stored dict with the kept one (``PATCH`` changes it in place of the same row, and SQLite may give a deleted
experiment's id to the next one). The typed config is shared: callers must not change it.
"""

from __future__ import annotations

import copy
import datetime as dt
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from hpc_master.db.models import ExperimentModel, TaskModel
from hpc_master.errors import ClientError
from hpc_master.expconf import ExperimentConfig, ExperimentConfigError, parse_experiment_config
from hpc_master.expconf.tasks import TaskConfig, TaskType, parse_task_config

MAX_ENTRIES = 2048

_Key = tuple[str, int | str, dt.datetime | None]
_cache: OrderedDict[_Key, tuple[dict[str, Any], Any]] = OrderedDict()
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
    key = ("experiment", experiment.id, experiment.start_time) if experiment.id is not None else None
    return _cached(key, experiment.config or {}, f"experiment {experiment.id}", parse_experiment_config)


def task_config(task: TaskModel) -> TaskConfig:
    """The task's stored config, typed (shared: do not change it)."""
    task_type = TaskType(task.task_type)
    key = ("task", task.id, task.start_time) if task.id is not None else None
    return _cached(key, task.config or {}, f"task {task.id}", lambda raw: parse_task_config(raw, task_type))


def _cached(key: _Key | None, raw: dict[str, Any], what: str, parse: Callable[[dict[str, Any]], T]) -> T:
    if key is not None:
        with _lock:
            hit = _cache.get(key)
            if hit is not None and hit[0] == raw:
                _cache.move_to_end(key)
                stats["hits"] += 1
                return cast(T, hit[1])
    stats["parses"] += 1
    try:
        typed = parse(raw)
    except ExperimentConfigError as err:
        raise StoredConfigError(what, err) from None
    if key is not None:
        kept = copy.deepcopy(raw)
        with _lock:
            _cache[key] = (kept, typed)
            _cache.move_to_end(key)
            while len(_cache) > MAX_ENTRIES:
                _cache.popitem(last=False)
    return typed


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
