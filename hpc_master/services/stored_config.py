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
the typed config is kept by id, beside the row's start time (SQLite may give a deleted experiment's id to the
next one) and the sections of the raw config that ``PATCH`` may change (`EDITABLE`): a hit compares those, not
the whole dict. After create, a stored config is written here only (`edited_config`; the writers are checked by
``tests/unit/test_stored_config_reads.py``); a task's never changes. The typed config is shared: callers must
not change it.
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from hpc_master.db.models import ExperimentModel, TaskModel
from hpc_master.errors import ClientError
from hpc_master.expconf import ExperimentConfig, ExperimentConfigError, parse_experiment_config
from hpc_master.expconf.tasks import TaskConfig, TaskType, parse_task_config

log = logging.getLogger(__name__)
MAX_ENTRIES = 512
"""Kept configs per kind (experiments, tasks); past it, the oldest kept is dropped. A kept config is about 40
objects that every full garbage collection walks: 512 of them are the active experiments of a busy master."""
EDITABLE = ("name", "description", "labels", "checkpoint_storage", "resources")
"""What `edited_config` (``PATCH``) changes in an experiment's stored config."""

T = TypeVar("T")
_Kept = tuple[dt.datetime | None, Any, Any, Any, Any, Any, T]
"""(start time, the `EDITABLE` sections as they were when parsed, the typed config)."""
_experiments: dict[int, _Kept[ExperimentConfig]] = {}
_tasks: dict[str, _Kept[TaskConfig]] = {}
_lock = threading.Lock()
"""Reads take no lock (a dict lookup is atomic); writes do. A read allocates nothing on a hit: on the list
routes it runs once per row, and every allocation brings the next full garbage collection nearer."""
_refused: set[int] = set()
"""Experiments whose refused config `shown_config` has logged."""
stats = {"parses": 0, "hits": 0}
"""How many stored configs were parsed, and how many reads were answered from the cache (tests, benches)."""


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
    hit = _experiments.get(experiment.id)
    if (
        hit is not None
        and hit[0] == experiment.start_time
        and hit[1] == raw.get("name")
        and hit[2] == raw.get("description")
        and hit[3] == raw.get("labels")
        and hit[4] == raw.get("checkpoint_storage")
        and hit[5] == raw.get("resources")
    ):
        stats["hits"] += 1
        return hit[6]
    typed = _parse(raw, f"experiment {experiment.id}", parse_experiment_config)
    _keep(_experiments, experiment.id, experiment.start_time, raw, typed)
    return typed


def shown_config(experiment: ExperimentModel) -> ExperimentConfig | None:
    """The typed config for what a listing shows of an experiment (its searcher, labels, workspace), or None
    when this master refuses the stored config: one such row (from an older master) must not fail a listing
    of everyone's experiments. Said once per experiment in the master's log; the experiment's own routes
    answer `StoredConfigError`."""
    try:
        return experiment_config(experiment)
    except StoredConfigError as err:
        if experiment.id not in _refused:
            _refused.add(experiment.id)
            log.warning("%s (shown without it in listings)", err.message)
        return None


def task_config(task: TaskModel) -> TaskConfig:
    """The task's stored config, typed (shared: do not change it; a task's config never changes)."""
    hit = _tasks.get(task.id)
    if hit is not None and hit[0] == task.start_time:
        stats["hits"] += 1
        return hit[6]
    task_type = TaskType(task.task_type)
    typed = _parse(task.config or {}, f"task {task.id}", lambda raw: parse_task_config(raw, task_type))
    _keep(_tasks, task.id, task.start_time, {}, typed)
    return typed


def _parse(raw: dict[str, Any], what: str, parse: Callable[[dict[str, Any]], T]) -> T:
    stats["parses"] += 1
    try:
        return parse(raw)
    except ExperimentConfigError as err:
        raise StoredConfigError(what, err) from None


def _keep(
    kept: dict[Any, _Kept[T]], key: Any, start: dt.datetime | None, raw: dict[str, Any], typed: T
) -> None:
    if key is None:  # a row not yet flushed has no id: nothing to keep it under
        return
    sections = copy.deepcopy([raw.get(k) for k in EDITABLE])
    with _lock:
        kept.pop(key, None)
        kept[key] = (start, *sections, typed)  # type: ignore[assignment]
        while len(kept) > MAX_ENTRIES:
            del kept[next(iter(kept))]


def forget() -> None:
    """Drop every kept config, as a new master process starts (tests that change stored rows behind the API)."""
    with _lock:
        _experiments.clear()
        _tasks.clear()
        _refused.clear()


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
