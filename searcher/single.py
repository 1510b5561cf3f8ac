"""``single``: one trial with the given hyperparameters, trained to ``max_length``, or, without one
(Determined 0.38: ``searcher: {name: single, metric: x}``), until its script ends: the trial gets no
``ValidateAfter``, and its exit closes the search.

As in Determined it is random search with ``max_trials: 1`` and ``max_concurrent_trials: 1``, except
that a trial exiting with ``INVALID_HP`` is not replaced (there is nothing else to try).
"""

from __future__ import annotations

from dataclasses import replace

from searcher.config import SearcherConfig
from searcher.random_search import RandomSearch


class SingleSearch(RandomSearch):
    name = "single"
    replace_invalid = False

    def __init__(self, config: SearcherConfig) -> None:
        super().__init__(replace(config, max_trials=1, max_concurrent_trials=1))
