"""Hyperparameter spaces in Determined's shape: parsing, random sampling and grids.

Shape: a bare value or ``{type: const, val}`` is a constant; ``{type: int|double, minval, maxval,
count?}``, ``{type: log, minval, maxval, base, count?}`` (the value is ``base ** u``) and
``{type: categorical, vals}``; a mapping without ``type`` is a nested group. Samples are nested
dicts of the same shape. Keys are visited in sorted order, so a sample depends only on the seed.

Differences from Determined worth knowing:
* ``int`` samples uniformly from ``[minval, maxval]`` *inclusive*, as Determined documents (its Go
  code draws ``minval + Intn(maxval - minval)`` and so never returns ``maxval``).
* Grid points of ``int`` use Go's ``math.Round`` (half away from zero), not Python's ``round``.
* A grid over a space with no hyperparameters has one point (``{}``), not zero trials.
"""

from __future__ import annotations

import copy
import itertools
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from searcher.config import SearcherConfig


@dataclass(frozen=True)
class Const:
    val: Any


@dataclass(frozen=True)
class Int:
    minval: int
    maxval: int
    count: int | None = None


@dataclass(frozen=True)
class Double:
    minval: float
    maxval: float
    count: int | None = None


@dataclass(frozen=True)
class Log:
    minval: float
    maxval: float
    base: float
    count: int | None = None


@dataclass(frozen=True)
class Categorical:
    vals: tuple[Any, ...]


Param = Const | Int | Double | Log | Categorical
Space = Mapping[str, "Param | Space"]


def _num(raw: Mapping[str, Any], key: str, path: str, *, integer: bool = False) -> Any:
    value = raw.get(key)
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"hyperparameters.{path}.{key}: expected {kind}, got {value!r}")
    return value


def _count(raw: Mapping[str, Any], path: str) -> int | None:
    if raw.get("count") is None:
        return None
    count = _num(raw, "count", path, integer=True)
    if count < 1:
        raise ValueError(f"hyperparameters.{path}.count: expected ≥ 1, got {count}")
    return int(count)


def _parse_param(raw: Mapping[str, Any], path: str) -> Param:
    kind = raw["type"]
    if kind == "const":
        return Const(raw.get("val"))
    if kind == "categorical":
        return _categorical(raw, path)
    if kind not in ("int", "double", "log"):
        raise ValueError(f"hyperparameters.{path}.type: unknown type {kind!r}")
    integer = kind == "int"
    lo, hi = _num(raw, "minval", path, integer=integer), _num(raw, "maxval", path, integer=integer)
    if lo > hi:
        raise ValueError(f"hyperparameters.{path}: minval {lo} is greater than maxval {hi}")
    if kind == "int":
        return Int(int(lo), int(hi), _count(raw, path))
    if kind == "double":
        return Double(float(lo), float(hi), _count(raw, path))
    return _log(raw, path, lo, hi)


def _categorical(raw: Mapping[str, Any], path: str) -> Categorical:
    vals = raw.get("vals")
    if not isinstance(vals, list | tuple) or not vals:
        raise ValueError(f"hyperparameters.{path}.vals: expected a non-empty list, got {vals!r}")
    return Categorical(tuple(vals))


def _log(raw: Mapping[str, Any], path: str, lo: Any, hi: Any) -> Log:
    """A ``log`` parameter whose exponents `lo` and `hi` are already checked; ``base`` defaults to 10."""
    base = _num(raw, "base", path) if "base" in raw else 10.0
    if base <= 0:
        raise ValueError(f"hyperparameters.{path}.base: expected > 0, got {base}")
    return Log(float(lo), float(hi), float(base), _count(raw, path))


def parse_space(raw: Mapping[str, Any], prefix: str = "") -> dict[str, Param | Space]:
    """Parse a ``hyperparameters`` section; raises ``ValueError`` naming the offending path."""
    out: dict[str, Param | Space] = {}
    for name in sorted(raw):
        value, path = raw[name], f"{prefix}{name}"
        if isinstance(value, Mapping) and "type" in value:
            out[name] = _parse_param(value, path)
        elif isinstance(value, Mapping):
            out[name] = parse_space(value, f"{path}.")
        else:
            out[name] = Const(value)
    return out


def _leaves(space: Space, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Param]]:
    for name in sorted(space):
        node = space[name]
        if isinstance(node, Mapping):
            yield from _leaves(node, (*prefix, name))
        else:
            yield (*prefix, name), node


def _set(out: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        out = out.setdefault(key, {})
    out[path[-1]] = value


def _skeleton(space: Space) -> dict[str, Any]:
    """Empty groups stay as empty dicts, as in Determined."""
    return {k: _skeleton(v) for k, v in space.items() if isinstance(v, Mapping)}


def sample_one(param: Param, rng: random.Random) -> Any:
    if isinstance(param, Const):
        return copy.deepcopy(param.val)
    if isinstance(param, Int):
        return rng.randint(param.minval, param.maxval)
    if isinstance(param, Double):
        return rng.uniform(param.minval, param.maxval)
    if isinstance(param, Log):
        return float(param.base ** rng.uniform(param.minval, param.maxval))
    return copy.deepcopy(param.vals[rng.randrange(len(param.vals))])


def sample(space: Space, rng: random.Random) -> dict[str, Any]:
    out = _skeleton(space)
    for path, param in _leaves(space):
        _set(out, path, sample_one(param, rng))
    return out


def go_round(x: float) -> int:
    """Go's ``math.Round``: halves away from zero."""
    return math.floor(abs(x) + 0.5) * (1 if x >= 0 else -1)


def grid_values(param: Param, path: str = "?") -> list[Any]:
    """Determined's ``count`` semantics: evenly spaced values including both endpoints."""
    if isinstance(param, Const):
        return [param.val]
    if isinstance(param, Categorical):
        return list(param.vals)
    if param.count is None:
        raise ValueError(f"hyperparameters.{path}.count: grid search needs a count")
    if isinstance(param, Int):
        return _int_grid(param.minval, param.maxval, param.count)
    lo, hi, count = param.minval, param.maxval, param.count
    points = [(lo + hi) / 2.0] if count == 1 else [lo + i * (hi - lo) / (count - 1) for i in range(count)]
    if isinstance(param, Log):
        return [float(param.base**p) for p in points]
    return points


def _int_grid(lo: int, hi: int, count: int) -> list[int]:
    """`count` evenly spaced integers from `lo` to `hi` (fewer when the range holds fewer), rounded as Go does."""
    count = min(count, hi - lo + 1)
    if count == 1:
        return [go_round((lo + hi) / 2.0)]
    step = (hi - lo) / (count - 1)
    return [go_round(lo + i * step) for i in range(count)]


def grid(space: Space) -> list[dict[str, Any]]:
    """The cartesian product over every leaf, first key (sorted, depth-first) varying slowest."""
    axes = grid_axes(space)
    points = []
    for combo in itertools.product(*(values for _, values in axes)):
        out = _skeleton(space)
        for (path, _), value in zip(axes, combo, strict=True):
            _set(out, path, copy.deepcopy(value))
        points.append(out)
    return points


GridAxes = list[tuple[tuple[str, ...], list[Any]]]


def grid_axes(space: Space) -> GridAxes:
    """Every leaf's path and values, in ``grid``'s order."""
    return [(path, grid_values(param, ".".join(path))) for path, param in _leaves(space)]


def grid_point(space: Space, index: int, axes: GridAxes | None = None) -> dict[str, Any]:
    """``grid(space)[index]`` without enumerating the grid (mixed-radix decoding, last leaf fastest)."""
    out = _skeleton(space)
    for path, values in reversed(axes if axes is not None else grid_axes(space)):
        index, digit = divmod(index, len(values))
        _set(out, path, copy.deepcopy(values[digit]))
    if index:
        raise IndexError("grid point index out of range")
    return out


def grid_size(space: Space, axes: GridAxes | None = None) -> int:
    return math.prod(len(values) for _, values in (axes if axes is not None else grid_axes(space)))


def check_for_method(config: SearcherConfig, space: Space) -> None:
    """Raise early for spaces a method cannot use (grid needs counts)."""
    if config.name == "grid":
        for path, param in _leaves(space):
            grid_values(param, ".".join(path))


def leaves(space: Space) -> Iterator[tuple[tuple[str, ...], Param]]:
    """Every leaf's path and parameter, sorted depth-first (the order samples are drawn in)."""
    return _leaves(space)


def skeleton(space: Space) -> dict[str, Any]:
    """A sample's nested groups, empty."""
    return _skeleton(space)


def set_path(out: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    _set(out, path, value)
