"""Shape-keeping downsampling of learning curves (pure functions and one small accumulator).

A curve is a sequence of ``(step, value)`` points. It is cut into buckets of equal width in steps and each
bucket keeps its lowest and its highest point (min/max downsampling): every spike and every dip survives, so
the drawn line has the shape of the raw one, and a curve of any length becomes at most ``2 × buckets``
points. The first and the last point are always kept, so a curve starts and ends where the raw one does.

``MinMaxCurve`` is the same thing, built incrementally: points arrive in any order; when a new step falls
beyond the buckets' range the bucket width doubles and pairs of buckets merge (min/max merge exactly), so
the accumulator never holds more than ``2 × max_buckets`` buckets however many points it saw. The master
keeps one per (trial, group, metric) and reads each metric row from the database once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

Point = tuple[int, float]
"""(steps completed, value)."""


_INFINITIES = (math.inf, -math.inf)


def _finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))


def minmax_downsample(points: Iterable[Point], max_points: int) -> list[Point]:
    """At most ``max_points`` (≥ 4) of ``points``, sorted by step, keeping each bucket's min and max."""
    curve = MinMaxCurve(max_buckets=max(2, max_points // 2 - 1))
    for step, value in points:
        curve.add(step, value)
    return curve.points(max_points)


@dataclass
class _Bucket:
    min_step: int
    min_value: float
    max_step: int
    max_value: float

    def add(self, step: int, value: float) -> None:
        if value < self.min_value:
            self.min_step, self.min_value = step, value
        if value > self.max_value:
            self.max_step, self.max_value = step, value

    def merge(self, other: _Bucket) -> None:
        self.add(other.min_step, other.min_value)
        self.add(other.max_step, other.max_value)


@dataclass
class MinMaxCurve:
    """Min/max buckets over steps, merged pairwise as the step range grows. Non-finite values (a diverged
    loss) are skipped: they have no place on a chart's axis."""

    max_buckets: int = 512
    width: int = 1
    buckets: dict[int, _Bucket] = field(default_factory=dict)
    first: Point | None = None
    last: Point | None = None
    count: int = 0
    """Points seen (finite ones)."""

    @classmethod
    def from_points(
        cls, steps: Sequence[int], values: Sequence[float], max_buckets: int = 512
    ) -> MinMaxCurve:
        """The curve ``add()`` would build from these points in this order (ties aside), in one pass: the final
        bucket width is known from the largest step, so no bucket is ever merged. For a first read of many
        rows (``services.curves``), about three times faster than ``add()`` point by point."""
        curve = cls(max_buckets=max_buckets)
        limit = 2 * max_buckets
        largest = max(steps, default=0)
        width = 1
        while largest // width >= limit:
            width *= 2
        buckets: dict[int, _Bucket] = {}
        first: Point | None = None
        last: Point | None = None
        count = 0
        for step, value in zip(steps, values, strict=True):
            if value != value or value in _INFINITIES:  # NaN or ±inf
                continue
            count += 1
            if first is None or step < first[0]:
                first = (step, value)
            if last is None or step >= last[0]:
                last = (step, value)
            index = step // width
            b = buckets.get(index)
            if b is None:
                buckets[index] = _Bucket(step, value, step, value)
            else:
                if value < b.min_value:
                    b.min_step, b.min_value = step, value
                if value > b.max_value:
                    b.max_step, b.max_value = step, value
        curve.width, curve.buckets, curve.first, curve.last, curve.count = width, buckets, first, last, count
        return curve

    def add(self, step: int, value: float) -> None:
        if not _finite(value):
            return
        self.count += 1
        if self.first is None or step < self.first[0]:
            self.first = (step, value)
        if self.last is None or step >= self.last[0]:
            self.last = (step, value)
        while step // self.width >= 2 * self.max_buckets:
            self._double()
        index = step // self.width
        bucket = self.buckets.get(index)
        if bucket is None:
            self.buckets[index] = _Bucket(step, value, step, value)
        else:
            bucket.add(step, value)

    def _double(self) -> None:
        self.width *= 2
        merged: dict[int, _Bucket] = {}
        for index in sorted(self.buckets):
            bucket = self.buckets[index]
            into = merged.get(index // 2)
            if into is None:
                merged[index // 2] = bucket
            else:
                into.merge(bucket)
        self.buckets = merged

    def points(self, max_points: int = 0) -> list[Point]:
        """The downsampled curve, sorted by step: at most ``max_points`` points (0: all the buckets hold)."""
        buckets = self.buckets
        width = self.width
        if max_points > 0:
            while 2 * len(buckets) + 2 > max_points and len(buckets) > 1:
                width *= 2
                merged: dict[int, _Bucket] = {}
                for index in sorted(buckets):
                    b = buckets[index]
                    into = merged.get(index // 2)
                    if into is None:
                        merged[index // 2] = _Bucket(b.min_step, b.min_value, b.max_step, b.max_value)
                    else:
                        into.merge(b)
                buckets = merged
        out: dict[int, float] = {}
        for b in buckets.values():
            out.setdefault(b.min_step, b.min_value)
            out.setdefault(b.max_step, b.max_value)
        for end in (self.first, self.last):
            if end is not None:
                out[end[0]] = end[1]
        return sorted(out.items())
