"""A family of synthetic multi-fidelity problems for HPO benchmarks (searcher-agnostic).

Hyperparameters: ``x0 … x{d-1}``, doubles in [0, 1] (Determined shape, see ``hyperparameters``).
The final loss ``f(x)`` is a rotated, ill-conditioned quadratic plus a cosine ripple around a
random optimum. The loss at ``u`` of ``max_length`` units moves from an early-phase loss ``h(x)``
to ``f(x)`` as ``sqrt(u / max_length)``; ``h`` is ``f`` mixed with an unrelated function so that
``corr(h, f) ≈ rank_correlation`` (how well short runs predict long ones). Observations get
Gaussian noise (``noise`` × the spread of ``f``) and trials run at heterogeneous speeds
(``runtime_spread``, log-normal, and slower for larger ``x0``, like a wider model).

``regret(x)`` is normalised: 0 at the optimum, 1 at the mean loss of a random configuration.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def _unit(*parts: Any) -> float:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


@dataclass
class _Quadratic:
    center: list[float]
    scales: list[float]
    rotation: list[list[float]]
    ripple: float

    @classmethod
    def draw(cls, rng: random.Random, dims: int) -> _Quadratic:
        # A random orthogonal matrix by Gram-Schmidt.
        vectors: list[list[float]] = []
        while len(vectors) < dims:
            v = [rng.gauss(0, 1) for _ in range(dims)]
            for w in vectors:
                dot = sum(a * b for a, b in zip(v, w, strict=True))
                v = [a - dot * b for a, b in zip(v, w, strict=True)]
            norm = math.sqrt(sum(a * a for a in v))
            if norm > 1e-6:
                vectors.append([a / norm for a in v])
        return cls(
            center=[rng.uniform(0.15, 0.85) for _ in range(dims)],
            scales=[10 ** rng.uniform(-0.5, 1.0) for _ in range(dims)],
            rotation=vectors,
            ripple=0.15,
        )

    def __call__(self, x: list[float]) -> float:
        d = [a - c for a, c in zip(x, self.center, strict=True)]
        y = [sum(r * v for r, v in zip(row, d, strict=True)) for row in self.rotation]
        quad = sum(s * v * v for s, v in zip(self.scales, y, strict=True))
        return quad + self.ripple * sum(1 - math.cos(6 * math.pi * v) for v in d) / len(d)


@dataclass
class CurveProblem:
    dims: int = 4
    max_length: int = 81
    rank_correlation: float = 0.8
    noise: float = 0.05
    runtime_spread: float = 0.4
    seed: int = 0
    name: str = ""
    _f: _Quadratic = field(init=False, repr=False)
    _g: _Quadratic = field(init=False, repr=False)
    _f_opt: float = field(init=False)
    _f_mean: float = field(init=False)
    _f_std: float = field(init=False)
    _g_mean: float = field(init=False)
    _g_std: float = field(init=False)

    def __post_init__(self) -> None:
        rng = random.Random(f"curves/{self.seed}")
        self._f = _Quadratic.draw(rng, self.dims)
        self._g = _Quadratic.draw(rng, self.dims)
        sample = [[rng.random() for _ in range(self.dims)] for _ in range(4096)]
        fs = [self._f(x) for x in sample]
        gs = [self._g(x) for x in sample]
        self._f_opt = self._f(self._f.center)
        self._f_mean, self._f_std = _mean_std(fs)
        self._g_mean, self._g_std = _mean_std(gs)
        self.name = self.name or f"curves(rho={self.rank_correlation}, noise={self.noise})"

    @property
    def hyperparameters(self) -> dict[str, Any]:
        return {f"x{i}": {"type": "double", "minval": 0.0, "maxval": 1.0} for i in range(self.dims)}

    def _x(self, hparams: Mapping[str, Any]) -> list[float]:
        return [float(hparams[f"x{i}"]) for i in range(self.dims)]

    def final(self, hparams: Mapping[str, Any]) -> float:
        return self._f(self._x(hparams))

    def regret(self, hparams: Mapping[str, Any]) -> float:
        return (self.final(hparams) - self._f_opt) / (self._f_mean - self._f_opt)

    def _early(self, x: list[float]) -> float:
        zf = (self._f(x) - self._f_mean) / self._f_std
        zg = (self._g(x) - self._g_mean) / self._g_std
        rho = self.rank_correlation
        return self._f_mean + 0.5 * self._f_std + self._f_std * (rho * zf + math.sqrt(1 - rho * rho) * zg)

    def metric(self, hparams: Mapping[str, Any], trial_seed: int, units: int) -> float:
        x = self._x(hparams)
        s = math.sqrt(min(1.0, units / self.max_length))
        z = random.Random(_unit(self.seed, trial_seed, units)).gauss(0.0, 1.0)
        return s * self._f(x) + (1 - s) * self._early(x) + self.noise * self._f_std * z

    def seconds_per_unit(self, hparams: Mapping[str, Any], trial_seed: int) -> float:
        z = random.Random(_unit(self.seed, "speed", trial_seed)).gauss(0.0, 1.0)
        return math.exp(self.runtime_spread * z + 0.5 * (self._x(hparams)[0] - 0.5))


def _mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
