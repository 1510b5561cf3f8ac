"""Min/max downsampling keeps a curve's shape: its extremes, first and last points, in step order."""

from __future__ import annotations

import math
import random

from hypothesis import given
from hypothesis import strategies as st

from hpc_master.services.downsample import MinMaxCurve, minmax_downsample


def test_short_curves_are_kept_whole() -> None:
    points = [(i, float(i % 3)) for i in range(10)]
    assert minmax_downsample(points, 100) == points


def test_a_long_curve_keeps_its_spike_dip_and_ends() -> None:
    points = [(i, math.sin(i / 500)) for i in range(100_000)]
    points[31_337] = (31_337, 50.0)  # one spike in a hundred thousand points
    points[77_000] = (77_000, -50.0)
    out = minmax_downsample(points, 400)
    assert len(out) <= 400
    assert (31_337, 50.0) in out and (77_000, -50.0) in out
    assert out[0] == points[0] and out[-1] == points[-1]
    assert [s for s, _ in out] == sorted({s for s, _ in out})


def test_incremental_equals_one_shot_in_any_order() -> None:
    rng = random.Random(7)
    points = [(i * 3, rng.gauss(0, 1)) for i in range(20_000)]
    shuffled = points[:]
    rng.shuffle(shuffled)
    a, b = MinMaxCurve(max_buckets=64), MinMaxCurve(max_buckets=64)
    for s, v in points:
        a.add(s, v)
    for s, v in shuffled:
        b.add(s, v)
    assert a.points(200) == b.points(200)
    assert a.count == len(points)
    assert len(a.buckets) <= 128


def test_non_finite_values_are_skipped() -> None:
    curve = MinMaxCurve()
    for s, v in [(1, 1.0), (2, float("nan")), (3, float("inf")), (4, 2.0)]:
        curve.add(s, v)
    assert curve.points() == [(1, 1.0), (4, 2.0)]


@given(
    st.dictionaries(st.integers(0, 10**9), st.floats(-1e6, 1e6), min_size=1, max_size=300), st.integers(4, 60)
)
def test_bounded_and_extremes_kept(by_step: dict[int, float], max_points: int) -> None:
    """(One value per step: a later report at a step replaces an earlier one.)"""
    points = list(by_step.items())
    out = minmax_downsample(points, max_points)
    assert len(out) <= max_points
    values = [v for _, v in out]
    assert min(values) == min(v for _, v in points)
    assert max(values) == max(v for _, v in points)
    assert all(p in set(points) for p in out)


def test_from_points_builds_what_add_builds() -> None:
    """The first read's one-pass builder equals ``add()`` point by point (values without ties)."""
    rng = random.Random(7)
    for n, every in ((1, 1), (10, 3), (5000, 10), (20_000, 1)):
        steps = [(i + 1) * every for i in range(n)]
        rng.shuffle(steps)
        values = [rng.random() for _ in steps]
        values[n // 2] = float("nan")
        one_by_one = MinMaxCurve(max_buckets=64)
        for s, v in zip(steps, values, strict=True):
            one_by_one.add(s, v)
        bulk = MinMaxCurve.from_points(steps, values, 64)
        assert bulk.width == one_by_one.width and bulk.count == one_by_one.count
        assert bulk.first == one_by_one.first and bulk.last == one_by_one.last
        for max_points in (0, 50, 1000):
            assert bulk.points(max_points) == one_by_one.points(max_points)
