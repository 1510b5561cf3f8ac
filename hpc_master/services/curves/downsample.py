"""Shape-keeping downsampling of learning curves (one small accumulator over numpy arrays).

A curve is a sequence of ``(step, value)`` points. It is cut into buckets of equal width in steps and each
bucket keeps its lowest and its highest point (min/max downsampling): every spike and every dip survives, so
the drawn line has the shape of the raw one, and a curve of any length becomes at most ``2 × buckets``
points. The first and the last point are always kept, so a curve starts and ends where the raw one does.

``MinMaxCurve`` keeps at most ``2 × max_buckets`` buckets however many points it saw: when a step falls
beyond the buckets' range the bucket width doubles and pairs of buckets merge (min/max merge exactly).
Points are taken in batches: ``add()`` only queues a point, and the queue is folded into the buckets, in one
vectorised pass, when the curve is next read (``points()``, ``to_bytes()``, ``count``...). Buckets are kept
sparse (only those that hold a point), as five arrays, so a curve is a few array operations to fold,
downsample further or serialise, and ``to_bytes()``/``from_bytes()`` copy no Python objects
(``services.curves.experiment`` saves them in the database).

Ties: at equal values a bucket keeps the point with the smallest step, however the points were batched (a
bucket merged from two keeps the lower one's, as one pass over every point would); the first point is the smallest step (the
first one given at that step), the last point the largest step (the last one given). Non-finite values (a
diverged loss) and negative steps are skipped: they have no place on a chart's axis.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

Point = tuple[int, float]
"""(steps completed, value)."""

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]

_EMPTY_I: Ints = np.zeros(0, dtype=np.int64)
_EMPTY_F: Floats = np.zeros(0, dtype=np.float64)
_HEADER = struct.Struct("<4sqqqBqdqdq")
"""magic, max_buckets, width, count, has_ends, first step/value, last step/value, buckets."""
_MAGIC = b"MMC1"


def minmax_downsample(points: Iterable[Point], max_points: int) -> list[Point]:
    """At most ``max_points`` (≥ 4) of ``points``, sorted by step, keeping each bucket's min and max."""
    steps, values = [], []
    for step, value in points:
        steps.append(step)
        values.append(value)
    return MinMaxCurve.from_points(steps, values, max(2, max_points // 2 - 1)).points(max_points)


def _firsts(keys: Ints) -> npt.NDArray[np.bool_]:
    """For sorted ``keys``: True where a run of equal keys starts."""
    starts = np.empty(len(keys), dtype=bool)
    if len(keys):
        starts[0] = True
        np.not_equal(keys[1:], keys[:-1], out=starts[1:])
    return starts


def _group_extreme(groups: Ints, steps: Ints, values: Floats, *, largest: bool) -> tuple[Ints, Ints, Floats]:
    """Per group: the group, the step and the value of its lowest (or ``largest``) value, the smallest step
    winning ties (then the earlier candidate: the same point)."""
    order = np.lexsort((np.arange(len(values)), steps, -values if largest else values, groups))
    keep = order[_firsts(groups[order])]
    return groups[keep], steps[keep], values[keep]


def _sorted_group_extreme(groups: Ints, steps: Ints, values: Floats, *, largest: bool) -> tuple[Ints, Floats]:
    """``_group_extreme`` for ``groups`` already ascending (merging a curve's buckets, whose steps ascend with
    them, so the first hit is the smallest step): no sort."""
    starts = np.flatnonzero(_firsts(groups))
    reduce = np.maximum if largest else np.minimum
    best = reduce.reduceat(values, starts)
    counts = np.diff(np.append(starts, len(values)))
    hits = np.flatnonzero(values == np.repeat(best, counts))
    group_of_hit = np.repeat(np.arange(len(starts)), counts)[hits]
    first_hits = hits[_firsts(group_of_hit)]
    return steps[first_hits], values[first_hits]


def downsample_many(curves: Sequence[MinMaxCurve], max_points: int = 0) -> list[tuple[Ints, Floats]]:
    """Each curve's ``arrays(max_points)``, computed for all of them in a few array passes (a page of 1,000
    trials costs what one curve would in a loop of numpy calls, not 1,000 times it)."""
    for curve in curves:
        curve._fold()
    if not curves:
        return []
    sizes = np.array([len(c.index) for c in curves], dtype=np.int64)
    curve_of = np.repeat(np.arange(len(curves), dtype=np.int64), sizes)
    factors = np.repeat(np.array([c._merge_factor(max_points) for c in curves], dtype=np.int64), sizes)
    span = 1 + max((int(c.index[-1]) for c in curves if len(c.index)), default=0)
    # Buckets merged: grouped by (curve, index // its factor), which is ascending as laid out.
    groups = curve_of * span + np.concatenate([c.index for c in curves]) // factors
    min_step, min_value = _sorted_group_extreme(
        groups,
        np.concatenate([c._min_step for c in curves]),
        np.concatenate([c._min_value for c in curves]),
        largest=False,
    )
    max_step, max_value = _sorted_group_extreme(
        groups,
        np.concatenate([c._max_step for c in curves]),
        np.concatenate([c._max_value for c in curves]),
        largest=True,
    )
    owner = groups[_firsts(groups)] // span
    # Candidates per curve: its last point, its first point, the mins, the maxes; at a shared step the
    # earlier candidate wins (so the ends always, then a bucket's min).
    ends = [(i, end) for i, c in enumerate(curves) for end in (c._last, c._first) if end is not None]
    cand_curve = np.concatenate((np.array([i for i, _ in ends], dtype=np.int64), owner, owner))
    cand_step = np.concatenate((np.array([e[0] for _, e in ends], dtype=np.int64), min_step, max_step))
    cand_value = np.concatenate((np.array([e[1] for _, e in ends], dtype=np.float64), min_value, max_value))
    order = np.lexsort((np.arange(len(cand_step)), cand_step, cand_curve))
    cand_curve, cand_step, cand_value = cand_curve[order], cand_step[order], cand_value[order]
    keep = np.ones(len(order), dtype=bool)
    if len(order):
        keep[1:] = (cand_curve[1:] != cand_curve[:-1]) | (cand_step[1:] != cand_step[:-1])
    cand_curve, cand_step, cand_value = cand_curve[keep], cand_step[keep], cand_value[keep]
    bounds = np.searchsorted(cand_curve, np.arange(len(curves) + 1, dtype=np.int64))
    return [(cand_step[a:b], cand_value[a:b]) for a, b in itertools.pairwise(bounds.tolist())]


class MinMaxCurve:
    """Min/max buckets over steps, merged pairwise as the step range grows."""

    __slots__ = (
        "_count",
        "_first",
        "_last",
        "_max_step",
        "_max_value",
        "_min_step",
        "_min_value",
        "_pending_steps",
        "_pending_values",
        "_width",
        "index",
        "max_buckets",
    )

    def __init__(self, max_buckets: int = 512) -> None:
        self.max_buckets = max(1, max_buckets)
        self._width = 1
        self.index: Ints = _EMPTY_I
        """The non-empty buckets, ascending: bucket ``i`` holds the steps ``[i × width, (i + 1) × width)``."""
        self._min_step: Ints = _EMPTY_I
        self._min_value: Floats = _EMPTY_F
        self._max_step: Ints = _EMPTY_I
        self._max_value: Floats = _EMPTY_F
        self._first: Point | None = None
        self._last: Point | None = None
        self._count = 0
        self._pending_steps: list[int] = []
        self._pending_values: list[float] = []

    @classmethod
    def from_points(
        cls, steps: Sequence[int], values: Sequence[float], max_buckets: int = 512
    ) -> MinMaxCurve:
        """The curve of these points (what ``add()`` one by one builds), folded at once."""
        curve = cls(max_buckets=max_buckets)
        curve.add_many(steps, values)
        curve._fold()
        return curve

    def add(self, step: int, value: float) -> None:
        self._pending_steps.append(step)
        self._pending_values.append(value)

    def add_many(self, steps: Sequence[int], values: Sequence[float]) -> None:
        if len(steps) != len(values):
            raise ValueError(f"{len(steps)} steps but {len(values)} values")
        self._pending_steps.extend(steps)
        self._pending_values.extend(values)

    # ------------------------------------------------------------------ reads (each folds the queue first)

    @property
    def width(self) -> int:
        self._fold()
        return self._width

    @property
    def count(self) -> int:
        """Points seen (finite ones at steps ≥ 0)."""
        self._fold()
        return self._count

    @property
    def first(self) -> Point | None:
        self._fold()
        return self._first

    @property
    def last(self) -> Point | None:
        self._fold()
        return self._last

    @property
    def buckets(self) -> int:
        """How many buckets hold a point."""
        self._fold()
        return len(self.index)

    def arrays(self, max_points: int = 0) -> tuple[Ints, Floats]:
        """The downsampled curve as (steps, values), sorted by step: at most ``max_points`` points (0: all the
        buckets hold). The first and last points always; then each bucket's min, then its max."""
        return downsample_many([self], max_points)[0]

    def _merge_factor(self, max_points: int) -> int:
        """The smallest power of two by which to merge buckets so that ``2 × buckets + 2 ≤ max_points``."""
        index = self.index
        if max_points <= 0 or 2 * len(index) + 2 <= max_points or len(index) <= 1:
            return 1
        factor = 2
        while True:
            distinct = int(np.count_nonzero(_firsts(index // factor)))
            if 2 * distinct + 2 <= max_points or distinct <= 1:
                return factor
            factor *= 2

    def points(self, max_points: int = 0) -> list[Point]:
        steps, values = self.arrays(max_points)
        return list(zip(steps.tolist(), values.tolist(), strict=True))

    # ------------------------------------------------------------------ saving

    def to_bytes(self) -> bytes:
        self._fold()
        first = self._first or (0, 0.0)
        last = self._last or (0, 0.0)
        header = _HEADER.pack(
            _MAGIC,
            self.max_buckets,
            self._width,
            self._count,
            self._first is not None,
            first[0],
            first[1],
            last[0],
            last[1],
            len(self.index),
        )
        arrays = (self.index, self._min_step, self._min_value, self._max_step, self._max_value)
        return header + b"".join(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes() for a in arrays)

    @classmethod
    def from_bytes(cls, data: bytes) -> MinMaxCurve:
        """A curve saved by ``to_bytes()``; ValueError if ``data`` is not one."""
        if len(data) < _HEADER.size:
            raise ValueError("not a saved curve: too short")
        magic, max_buckets, width, count, has_ends, f_step, f_value, l_step, l_value, n = _HEADER.unpack_from(
            data
        )
        if magic != _MAGIC or n < 0 or len(data) != _HEADER.size + 40 * n:
            raise ValueError("not a saved curve: bad header or length")
        curve = cls(max_buckets=max_buckets)
        curve._width, curve._count = width, count
        if has_ends:
            curve._first, curve._last = (f_step, f_value), (l_step, l_value)
        at = _HEADER.size

        def take(dtype: str) -> npt.NDArray[np.generic]:
            nonlocal at
            out = np.frombuffer(data, dtype=np.dtype(dtype), count=n, offset=at)
            at += 8 * n
            return out

        # Views of ``data`` (read-only; a fold builds new arrays): no copy on a little-endian machine.
        curve.index = take("<i8").astype(np.int64, copy=False)
        curve._min_step = take("<i8").astype(np.int64, copy=False)
        curve._min_value = take("<f8").astype(np.float64, copy=False)
        curve._max_step = take("<i8").astype(np.int64, copy=False)
        curve._max_value = take("<f8").astype(np.float64, copy=False)
        return curve

    # ------------------------------------------------------------------ folding the queue into the buckets

    def _fold(self) -> None:
        if not self._pending_steps:
            return
        steps = np.asarray(self._pending_steps, dtype=np.int64)
        values = np.asarray(self._pending_values, dtype=np.float64)
        self._pending_steps, self._pending_values = [], []
        ok = np.isfinite(values) & (steps >= 0)
        if not ok.all():
            steps, values = steps[ok], values[ok]
        if not len(steps):
            return
        self._count += len(steps)
        at = int(np.argmin(steps))
        if self._first is None or int(steps[at]) < self._first[0]:
            self._first = (int(steps[at]), float(values[at]))
        at = len(steps) - 1 - int(np.argmax(steps[::-1]))
        if self._last is None or int(steps[at]) >= self._last[0]:
            self._last = (int(steps[at]), float(values[at]))
        width = self._width
        largest = max(int(steps.max()), int(self._max_step.max()) if len(self._max_step) else 0)
        while largest // width >= 2 * self.max_buckets:
            width *= 2
        self._width = width
        # At equal values the smallest step wins (what a bucket held or a new point), as in one pass.
        min_steps = np.concatenate((self._min_step, steps))
        max_steps = np.concatenate((self._max_step, steps))
        groups_min = min_steps // width
        groups_max = max_steps // width
        index, self._min_step, self._min_value = _group_extreme(
            groups_min, min_steps, np.concatenate((self._min_value, values)), largest=False
        )
        index_max, self._max_step, self._max_value = _group_extreme(
            groups_max, max_steps, np.concatenate((self._max_value, values)), largest=True
        )
        assert np.array_equal(index, index_max)
        self.index = index
