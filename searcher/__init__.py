"""Pure, deterministic hyperparameter search methods: events in, actions out.

Standard library and numpy only; no IO. The master builds a method with ``make_search_method`` and drives it::

    method = make_search_method(searcher_cfg, hyperparameters, seed=experiment_seed)
    actions = method.initial_actions()                  # Create(...) ×N
    method.on_trial_created(request_id, trial_id)       # -> [ValidateAfter(trial_id, length)]
    method.on_validation_completed(trial_id, metric, units_completed)  # -> ValidateAfter | Pause | Stop, ...
    method.on_trial_exited_early(trial_id, ExitedReason.ERRORED)
    method.on_trial_closed(trial_id)                    # -> maybe Create(...), finally Shutdown(...)
    method.progress()                                   # 0.0 … 1.0
    state = method.snapshot(); method.restore(state)    # JSON-compatible dict, RNG included

See ``searcher.actions`` for the per-trial contract. Methods: ``single``, ``random``, ``grid``,
``async_halving`` and ``adaptive_asha``. ASHA's ``promotion`` is ``"pause"`` by default
(Determined's ``stop_once: false``: unpromoted trials are paused and may be resumed) or
``"continue"`` (``stop_once: true``: unpromoted trials stop for good); see ``searcher.asha``. Our key
``proposals: model`` (ASHA only) proposes new trials with a TPE model instead of sampling them at random;
see ``searcher.proposals``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from searcher import hparams
from searcher.actions import (
    Action,
    Create,
    ExitedReason,
    Pause,
    Resume,
    Shutdown,
    Stop,
    ValidateAfter,
    action_from_dict,
    action_to_dict,
)
from searcher.adaptive_asha import AdaptiveASHA
from searcher.asha import AsyncHalving
from searcher.base import Algorithm, SearchMethod
from searcher.config import SearcherConfig, parse_searcher_config
from searcher.grid import GridSearch
from searcher.random_search import RandomSearch
from searcher.single import SingleSearch

__all__ = [
    "Action",
    "Create",
    "ExitedReason",
    "Pause",
    "Resume",
    "SearchMethod",
    "SearcherConfig",
    "Shutdown",
    "Stop",
    "ValidateAfter",
    "action_from_dict",
    "action_to_dict",
    "make_algorithm",
    "make_search_method",
    "parse_searcher_config",
]


def make_algorithm(config: SearcherConfig, space: hparams.Space) -> Algorithm:
    hparams.check_for_method(config, space)
    if config.name == "single":
        return SingleSearch(config)
    if config.name == "random":
        return RandomSearch(config)
    if config.name == "grid":
        return GridSearch(config, space)
    if config.name == "async_halving":
        return AsyncHalving(config, space=space)
    return AdaptiveASHA(config, space)


def make_search_method(
    searcher_cfg: Mapping[str, Any], hyperparameters: Mapping[str, Any], seed: int
) -> SearchMethod:
    """Build a search method from Determined-shaped dicts; raises ``ValueError`` on bad input."""
    config = parse_searcher_config(searcher_cfg)
    space = hparams.parse_space(hyperparameters)
    return SearchMethod(config, space, make_algorithm(config, space), seed)
