"""A multivariate TPE density model over a hyperparameter space (pure functions, numpy).

The space's leaves (``int``, ``double``, ``log``, ``categorical``; constants are skipped) are encoded
in a unit cube: ``double`` linearly, ``log`` linearly in the exponent, ``int`` as the centre of its
value's cell (``(v - lo + 0.5) / (hi - lo + 1)``), and ``categorical`` as the index of its value.

``propose`` is the Tree-structured Parzen Estimator of Bergstra et al. (2011) in its multivariate
form (Falkner et al., 2018, BOHB; Optuna's ``TPESampler(multivariate=True)``): the observations are
split into the best ``good_count(n)`` and the rest; each side is a mixture of product kernels, one
per observation, plus a uniform prior component of weight one. Continuous dimensions use Gaussians
truncated to [0, 1] with Scott's bandwidth (``std · n^(-1/(d+4))``, at least ``MIN_BANDWIDTH``);
categorical ones an Aitchison-Aitken kernel. ``N_CANDIDATES`` points are drawn from the good
density ``l`` with its continuous bandwidths widened ``SAMPLE_BANDWIDTH_FACTOR`` (3) times, as in
BOHB, and the one with the largest ``log l(x) - log g(x)`` (unwidened) is returned. Extra points in
``liars`` join the bad side (a constant liar); ``searcher.proposals`` passes none (see there why).

Everything random comes from the ``numpy.random.Generator`` passed in, so a proposal is a function
of the observations and that generator's seed.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from searcher import hparams

Array = npt.NDArray[np.float64]

N_CANDIDATES = 24  # Optuna's n_ei_candidates (BOHB's 64 was no better on the tuning seeds)
MIN_BANDWIDTH = 0.03
MAX_GOOD = 25
GOOD_FRACTION = 0.15
SAMPLE_BANDWIDTH_FACTOR = 3.0  # candidates are drawn from l with its bandwidths × 3, as in BOHB


@dataclass(frozen=True)
class Dim:
    """One encoded leaf: ``path`` in the nested sample, its parameter, and ``k`` categories (0: continuous)."""

    path: tuple[str, ...]
    param: hparams.Param
    k: int


def dimensions(space: hparams.Space) -> list[Dim]:
    """The leaves a model can move, in ``hparams``' order (sorted, depth-first); constants are left out."""
    out = []
    for path, param in hparams.leaves(space):
        if isinstance(param, hparams.Const):
            continue
        out.append(Dim(path, param, len(param.vals) if isinstance(param, hparams.Categorical) else 0))
    return out


def _index_of(vals: Sequence[Any], value: Any) -> int:
    for i, v in enumerate(vals):
        if v == value:
            return i
    raise ValueError(f"{value!r} is not one of the categorical values {list(vals)!r}")


def encode_one(dim: Dim, value: Any) -> float:
    p = dim.param
    if isinstance(p, hparams.Categorical):
        return float(_index_of(p.vals, value))
    if isinstance(p, hparams.Int):
        return (float(value) - p.minval + 0.5) / (p.maxval - p.minval + 1)
    if isinstance(p, hparams.Double):
        return 0.5 if p.maxval == p.minval else (float(value) - p.minval) / (p.maxval - p.minval)
    assert isinstance(p, hparams.Log)
    if p.maxval == p.minval:
        return 0.5
    return (math.log(float(value)) / math.log(p.base) - p.minval) / (p.maxval - p.minval)


def decode_one(dim: Dim, x: float) -> Any:
    p = dim.param
    if isinstance(p, hparams.Categorical):
        return copy.deepcopy(p.vals[int(x)])
    x = min(1.0, max(0.0, float(x)))
    if isinstance(p, hparams.Int):
        return min(p.maxval, p.minval + math.floor(x * (p.maxval - p.minval + 1)))
    if isinstance(p, hparams.Double):
        return p.minval + x * (p.maxval - p.minval)
    assert isinstance(p, hparams.Log)
    return float(p.base ** (p.minval + x * (p.maxval - p.minval)))


def encode(dims: Sequence[Dim], sample: Mapping[str, Any]) -> list[float]:
    out = []
    for dim in dims:
        node: Any = sample
        for key in dim.path:
            node = node[key]
        out.append(encode_one(dim, node))
    return out


def decode(space: hparams.Space, dims: Sequence[Dim], x: Sequence[float]) -> dict[str, Any]:
    """A full sample: constants from the space, every other leaf decoded from ``x``."""
    out = hparams.skeleton(space)
    by_path = {dim.path: decode_one(dim, v) for dim, v in zip(dims, x, strict=True)}
    for path, param in hparams.leaves(space):
        value = by_path[path] if path in by_path else copy.deepcopy(getattr(param, "val", None))
        hparams.set_path(out, path, value)
    return out


def good_count(n: int) -> int:
    """How many of ``n`` observations form the good density (at least 1, at most ``MAX_GOOD``)."""
    return max(1, min(math.ceil(GOOD_FRACTION * n), MAX_GOOD))


def _erf(x: Array) -> Array:
    # Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): numpy has no erf and scipy is not a dependency.
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    result: Array = sign * (1.0 - poly * np.exp(-a * a))
    return result


def _cdf(z: Array) -> Array:
    result: Array = 0.5 * (1.0 + _erf(z / math.sqrt(2.0)))
    return result


@dataclass(frozen=True)
class _Mixture:
    """Kernels centred on ``centers`` (n × d) plus a uniform prior component of weight one."""

    centers: Array
    sigma: Array  # (d,) bandwidth of each continuous dimension
    cat_keep: Array  # (d,) probability that a categorical kernel keeps its centre's category
    offset: Array  # (n,) each kernel's log normaliser, summed over the continuous dimensions


def _widened(mix: _Mixture, factor: float) -> _Mixture:
    if factor == 1.0:
        return mix
    return _Mixture(mix.centers, np.minimum(mix.sigma * factor, 1.0), mix.cat_keep, mix.offset)


def _mixture(centers: Array, ks: Sequence[int]) -> _Mixture:
    n, d = centers.shape
    factor = max(n, 1) ** (-1.0 / (d + 4))
    spread = centers.std(axis=0) if n > 1 else np.full(d, 0.5)
    sigma = np.maximum(spread * factor, MIN_BANDWIDTH)
    sigma = np.minimum(sigma, 1.0)
    karr = np.array([max(k, 1) for k in ks], dtype=float)
    eps = np.clip(factor, 0.05, 1.0) * (karr - 1) / karr
    cat_keep = 1.0 - eps
    offset = np.zeros(n)
    for j, k in enumerate(ks):
        if k == 0:  # log of the truncated Gaussian's mass inside [0, 1], and of its scale
            c = centers[:, j]
            mass = _cdf((1.0 - c) / sigma[j]) - _cdf(-c / sigma[j])
            offset -= np.log(np.maximum(mass, 1e-300)) + math.log(sigma[j] * math.sqrt(2.0 * math.pi))
    return _Mixture(centers, sigma, cat_keep, offset)


def _log_density(mix: _Mixture, ks: Sequence[int], x: Array) -> Array:
    """log of the mixture density at each row of ``x`` (m × d).

    Accumulated one dimension at a time on one (m × n) array, in place and elementwise only (no
    BLAS, whose summation order may depend on threads), so the result is the same on every run."""
    n = mix.centers.shape[0]
    acc = np.empty((x.shape[0], n))
    acc[:] = mix.offset
    diff = np.empty_like(acc)
    log_prior = 0.0
    for j, k in enumerate(ks):
        if k == 0:
            scale = 1.0 / (mix.sigma[j] * math.sqrt(2.0))  # 0.5 z² = (x·scale - c·scale)²
            np.subtract((x[:, j] * scale)[:, None], (mix.centers[:, j] * scale)[None, :], out=diff)
            np.square(diff, out=diff)
            acc -= diff
        elif k > 1:
            keep = float(mix.cat_keep[j])
            move, stay = math.log((1.0 - keep) / (k - 1)), math.log(keep)
            acc += move
            acc += np.equal(x[:, j, None], mix.centers[None, :, j]) * (stay - move)
            log_prior -= math.log(k)
    top = np.maximum(acc.max(axis=1, initial=-math.inf), log_prior)
    acc -= top[:, None]
    np.exp(acc, out=acc)
    total = acc.sum(axis=1) + np.exp(log_prior - top)
    result: Array = top + np.log(total) - math.log(n + 1)
    return result


def _sample(mix: _Mixture, ks: Sequence[int], count: int, gen: np.random.Generator) -> Array:
    n, d = mix.centers.shape
    karr = np.array([max(k, 1) for k in ks])
    cont = np.array([k == 0 for k in ks])
    which = gen.integers(0, n + 1, size=count)  # n: the prior
    prior = gen.random((count, d))
    prior_cat = np.floor(prior * karr)
    out = np.where(cont, prior, prior_cat)
    from_kernel = which < n
    centers = mix.centers[np.minimum(which, max(n - 1, 0))] if n else np.zeros((count, d))
    # continuous: truncated normal by rejection (a few rounds), then clipped
    draw = centers + gen.standard_normal((count, d)) * mix.sigma
    for _ in range(8):
        bad = (draw < 0.0) | (draw > 1.0)
        if not bad.any():
            break
        redraw = centers + gen.standard_normal((count, d)) * mix.sigma
        draw = np.where(bad, redraw, draw)
    draw = np.clip(draw, 0.0, 1.0)
    # categorical: keep the centre's category, or move to one of the others uniformly
    keep = gen.random((count, d)) < mix.cat_keep
    shift = np.floor(gen.random((count, d)) * np.maximum(karr - 1, 1)) + 1
    moved = np.mod(centers + shift, np.maximum(karr, 1))
    cat = np.where(keep | (karr <= 1), centers, moved)
    kernel = np.where(cont, draw, cat)
    result: Array = np.where(from_kernel[:, None], kernel, out)
    return result


def propose(
    ks: Sequence[int],
    points: Array,
    values: Array,
    liars: Array,
    gen: np.random.Generator,
    n_candidates: int | None = None,
) -> Array:
    """The candidate (a row of the unit cube) with the best ``log l - log g`` under the model.

    ``points`` (n × d) with ``values`` (n,; smaller is better) are the observations; ``liars``
    (m × d) are added to the bad side. ``ks[j]`` is dimension j's number of categories (0:
    continuous)."""
    n_candidates = N_CANDIDATES if n_candidates is None else n_candidates
    order = np.argsort(values, kind="stable")
    n_good = good_count(len(values))
    good = points[order[:n_good]]
    bad = np.concatenate([points[order[n_good:]], liars], axis=0)
    l_mix = _mixture(good, ks)
    g_mix = _mixture(bad, ks)
    candidates = _sample(_widened(l_mix, SAMPLE_BANDWIDTH_FACTOR), ks, n_candidates, gen)
    score = _log_density(l_mix, ks, candidates) - _log_density(g_mix, ks, candidates)
    result: Array = candidates[int(np.argmax(score))]
    return result
