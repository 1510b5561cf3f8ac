"""What the loop derives from experiment configs, decoded once per experiment and kept.

An experiment's config is written at create and never changed, but it is the largest column of the row (a
stored config from before the size bounds may be tens of MB) and decoding it is JSON plus validation. The
loop runs every few seconds over every active experiment while, on SQLite, holding the only connection, so
it reads experiment rows without the config (`LEAN_EXPERIMENT`) and goes through a `DerivedConfigs`, which
reads the column only the first time it needs an experiment's config.

Entries are keyed by (id, start_time): SQLite may give a deleted experiment's id to the next one.
"""

from __future__ import annotations

import datetime as dt
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from sqlalchemy.orm import defer

from hpc_master.db.models import ExperimentModel

T = TypeVar("T")
ConfigKey = tuple[int, dt.datetime]

LEAN_EXPERIMENT = (defer(ExperimentModel.config), defer(ExperimentModel.config_text))
"""Loader options for an experiment row without its config (read on first access, if ever)."""


def config_key(experiment: ExperimentModel) -> ConfigKey:
    return (experiment.id, experiment.start_time)


class DerivedConfigs(Generic[T]):
    """An LRU map (id, start_time) → `derive(config)`. Not thread-safe: one per loop thread."""

    def __init__(self, derive: Callable[[Mapping[str, Any]], T], max_entries: int = 256) -> None:
        self.derive = derive
        self.max_entries = max_entries
        self._entries: OrderedDict[ConfigKey, T] = OrderedDict()
        self.decodes = 0
        """How many configs were decoded and derived, i.e. cache misses (tests and logs)."""

    def peek(self, key: ConfigKey) -> T | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: ConfigKey, value: T) -> T:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return value

    def get(self, experiment: ExperimentModel) -> T:
        """The derived value, reading `experiment.config` (in the caller's session) only on a miss."""
        key = config_key(experiment)
        value = self.peek(key)
        if value is None:
            self.decodes += 1
            value = self.put(key, self.derive(experiment.config))
        return value

    def __len__(self) -> int:
        return len(self._entries)
