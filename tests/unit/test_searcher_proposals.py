"""``proposals: model`` (issue 40): the TPE proposal model inside ASHA.

What must hold: the key is validated with a clear error; without it (or with ``random``) a search is
exactly what it was; with it, trials are proposed by the model once a rung has enough results, the
proposals learn (they land nearer the optimum than random samples do), and a search restored from a
snapshot at any event proposes exactly what the uninterrupted one does, whatever the process.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from searcher import Action, Create, SearchMethod, make_search_method
from searcher.base import config_digest
from searcher.config import parse_searcher_config
from searcher.hparams import parse_space, sample
from searcher.proposals import ModelProposals
from searcher.simulate import SimConfig, simulate
from searcher.tpe import decode, dimensions, encode, propose

REPO = Path(__file__).resolve().parents[2]

SPACE = {
    "lr": {"type": "log", "minval": -5, "maxval": -1, "base": 10},
    "layers": {"type": "int", "minval": 1, "maxval": 8},
    "opt": {"type": "categorical", "vals": ["sgd", "adam", "rmsprop"]},
    "head": {"dropout": {"type": "double", "minval": 0.0, "maxval": 0.5}, "width": 64},
}


def asha(proposals: str | None = None, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "name": "adaptive_asha",
        "metric": "loss",
        "max_length": {"batches": 81},
        "max_trials": 60,
        "divisor": 3,
        "max_concurrent_trials": 6,
        **extra,
    }
    if proposals is not None:
        cfg["proposals"] = proposals
    return cfg


class Bowl:
    """Loss (smaller is better) with its optimum at lr=1e-3, layers=6, opt=adam, dropout=0.1; longer
    training lowers every loss alike, so short runs rank configurations as long ones do."""

    def target(self, hp: Mapping[str, Any]) -> float:
        x = (math.log10(hp["lr"]) + 3) / 4
        return (
            x * x
            + ((hp["layers"] - 6) / 7) ** 2
            + (0.0 if hp["opt"] == "adam" else 0.3)
            + ((hp["head"]["dropout"] - 0.1) / 0.5) ** 2
        )

    def metric(self, hparams: Mapping[str, Any], trial_seed: int, units: int) -> float:
        return self.target(hparams) + 1.0 / math.sqrt(units)

    def seconds_per_unit(self, hparams: Mapping[str, Any], trial_seed: int) -> float:
        return 0.5 + random.Random(trial_seed).random()


class Recording:
    def __init__(self, method: SearchMethod) -> None:
        self.method = method
        self.actions: list[Action] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> list[Action]:
            out: list[Action] = getattr(self.method, name)(*args)
            self.actions += out
            return out

        return call


def run(cfg: dict[str, Any], seed: int = 7, workers: int = 6) -> list[Action]:
    rec = Recording(make_search_method(cfg, SPACE, seed))
    simulate(rec, Bowl(), SimConfig(workers=workers, seed=seed, final_length=81))  # type: ignore[arg-type]
    return rec.actions


# ---- the key --------------------------------------------------------------------------------------


def test_proposals_must_be_random_or_model() -> None:
    with pytest.raises(ValueError) as err:
        parse_searcher_config(asha("bayesian"))
    assert "searcher.proposals" in str(err.value)
    assert "'random', 'model'" in str(err.value) and "'bayesian'" in str(err.value)
    cfg = {"name": "random", "metric": "loss", "max_trials": 3, "proposals": "model"}
    with pytest.raises(
        ValueError, match=r"searcher\.proposals: 'model' needs adaptive_asha or async_halving"
    ):
        parse_searcher_config(cfg)
    assert parse_searcher_config(asha()).proposals == "random"
    assert parse_searcher_config(asha("model")).proposals == "model"


def test_without_the_key_a_search_is_what_it_was() -> None:
    base = run(asha())
    assert run(asha("random")) == base
    creates = [a for a in base if isinstance(a, Create)]
    assert creates and all(c.proposal == "random" for c in creates)
    space = parse_space(SPACE)
    # The digest that guards restores is unchanged for configs without the key (old snapshots restore).
    assert config_digest(parse_searcher_config(asha("random")), space) == config_digest(
        parse_searcher_config(asha()), space
    )
    assert config_digest(parse_searcher_config(asha("model")), space) != config_digest(
        parse_searcher_config(asha()), space
    )


def test_the_master_config_accepts_proposals_for_asha_only() -> None:
    from hpc_master.expconf.searcher import AdaptiveASHASearcher, searcher_to_dict

    parsed = AdaptiveASHASearcher.model_validate({**asha("model")})
    assert searcher_to_dict(parsed)["proposals"] == "model"
    assert "proposals" not in searcher_to_dict(AdaptiveASHASearcher.model_validate(asha()))


# ---- the model ------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["adaptive_asha", "async_halving"])
def test_model_proposals_start_once_a_rung_has_enough_results(method: str) -> None:
    cfg = asha("model", name=method, **({"num_rungs": 3} if method == "async_halving" else {}))
    creates = [a for a in run(cfg) if isinstance(a, Create)]
    kinds = [c.proposal for c in creates]
    assert set(kinds) == {"random", "model"}
    assert kinds[:6] == ["random"] * 6  # nothing to learn from before the first results
    assert kinds.count("model") > len(kinds) // 2
    for c in creates:  # every proposal lies in the space
        assert 1e-5 <= c.hparams["lr"] <= 1e-1 and 1 <= c.hparams["layers"] <= 8
        assert isinstance(c.hparams["layers"], int) and c.hparams["opt"] in ("sgd", "adam", "rmsprop")
        assert 0.0 <= c.hparams["head"]["dropout"] <= 0.5 and c.hparams["head"]["width"] == 64


def test_model_proposals_learn() -> None:
    """Over several seeds, model proposals land nearer the optimum than random samples do (a third of
    a model search's later trials are random on purpose: they are left out of the comparison), and
    the model search's later trials as a whole do too."""
    bowl = Bowl()
    model, mixed, rand = [], [], []
    for seed in range(4):
        for proposals, out in (("model", mixed), ("random", rand)):
            creates = [a for a in run(asha(proposals), seed=seed) if isinstance(a, Create)]
            out += [bowl.target(c.hparams) for c in creates[20:]]
            if proposals == "model":
                model += [bowl.target(c.hparams) for c in creates[20:] if c.proposal == "model"]
    assert np.mean(model) < 0.7 * np.mean(rand)
    assert np.mean(mixed) < 0.85 * np.mean(rand)


def test_encode_decode_round_trip() -> None:
    space = parse_space(SPACE)
    dims = dimensions(space)
    assert [d.path for d in dims] == [("head", "dropout"), ("layers",), ("lr",), ("opt",)]
    rng = random.Random(3)
    for _ in range(200):
        hp = sample(space, rng)
        x = encode(dims, hp)
        assert all(0.0 <= v <= 1.0 for v in x[:3]) and x[3] in (0.0, 1.0, 2.0)
        back = decode(space, dims, x)
        assert back["layers"] == hp["layers"] and back["opt"] == hp["opt"]
        assert back["head"]["width"] == 64
        assert math.isclose(back["lr"], hp["lr"], rel_tol=1e-9)
        assert math.isclose(back["head"]["dropout"], hp["head"]["dropout"], abs_tol=1e-12)


def test_liars_push_proposals_away_from_trials_in_flight() -> None:
    """One continuous dimension, good results near 0.3 and 0.7: trials running near 0.3 (no result
    yet) make the model propose near 0.7 instead."""
    points = np.array([[0.3], [0.7], [0.05], [0.95], [0.5], [0.1], [0.9], [0.45], [0.55]])
    values = np.array([0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    liars = np.full((12, 1), 0.3) + np.linspace(-0.02, 0.02, 12)[:, None]
    free = [propose([0], points, values, np.zeros((0, 1)), np.random.default_rng(s))[0] for s in range(40)]
    lied = [propose([0], points, values, liars, np.random.default_rng(s))[0] for s in range(40)]
    near_03 = lambda xs: sum(abs(x - 0.3) < 0.1 for x in xs)  # noqa: E731
    assert near_03(lied) < near_03(free) / 2
    assert sum(abs(x - 0.7) < 0.1 for x in lied) > len(lied) // 2


def test_the_model_fits_the_longest_rung_with_enough_results_and_no_liars() -> None:
    """Trials in flight are not lied about: with ``promotion: pause`` nearly every trial is paused at
    some lower rung, and as liars they swamped the real results (issue 40's diagnosis)."""
    method = make_search_method(asha("model", mode="aggressive"), SPACE, 1)
    seen: list[Any] = []

    class Probe(Recording):
        def on_trial_closed(self, trial_id: int) -> list[Action]:
            model: ModelProposals = method.algorithm.model  # type: ignore[attr-defined]
            data = model.fit_data()
            if data is not None:
                lengths = {}
                for source in model.sources:
                    for length, _, _ in source.model_results():
                        lengths[length] = lengths.get(length, 0) + 1
                longest = max(n for n, c in lengths.items() if c >= model.min_results)
                seen.append((len(data[0]), len(data[1]), lengths[longest]))
            return self.method.on_trial_closed(trial_id)

    simulate(Probe(method), Bowl(), SimConfig(workers=6, seed=1, final_length=81))  # type: ignore[arg-type]
    assert seen
    for n_points, n_values, at_longest in seen:
        assert n_points == n_values == at_longest >= 6


# ---- snapshots ------------------------------------------------------------------------------------


class Forking:
    """The uninterrupted search (``a``), and from event ``k`` on a copy restored from ``a``'s JSON
    snapshot (``b``): both get every later event and must answer identically."""

    def __init__(self, cfg: dict[str, Any], seed: int, k: int) -> None:
        self.cfg, self.seed, self.k, self.n = cfg, seed, k, 0
        self.a = make_search_method(cfg, SPACE, seed)
        self.b: SearchMethod | None = None
        self.compared: list[Action] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> list[Action]:
            if self.n == self.k:
                snap = json.loads(json.dumps(self.a.snapshot(), allow_nan=False))
                self.b = make_search_method(self.cfg, SPACE, self.seed)
                self.b.restore(snap)
            self.n += 1
            out: list[Action] = getattr(self.a, name)(*args)
            if self.b is not None:
                assert getattr(self.b, name)(*args) == out, f"event {self.n} ({name}) differs"
                self.compared += out
            return out

        return call


@pytest.mark.parametrize("promotion", ["pause", "continue"])
@pytest.mark.parametrize("k", [5, 40, 90, 150])
def test_a_restored_search_makes_every_later_proposal_the_same(promotion: str, k: int) -> None:
    fork = Forking(asha("model", promotion=promotion), seed=11, k=k)
    simulate(fork, Bowl(), SimConfig(workers=6, seed=11, final_length=81, error_rate=0.05))  # type: ignore[arg-type]
    later = [a for a in fork.compared if isinstance(a, Create)]
    assert fork.b is not None
    if k >= 40:
        assert any(c.proposal == "model" for c in later)  # the model was in use after the restore


_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from tests.unit.test_searcher_proposals import asha, run
from searcher import action_to_dict
print(json.dumps([action_to_dict(a) for a in run(asha("model"), seed=5)]))
"""


def test_the_same_search_in_processes_with_different_hash_seeds() -> None:
    """Sets of request ids are iterated in hash order; the model must not depend on it."""
    outs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(REPO)], env=env, capture_output=True, text=True, check=True
        )
        outs.append(proc.stdout)
    assert outs[0] == outs[1]
    assert '"proposal": "model"' in outs[0]
