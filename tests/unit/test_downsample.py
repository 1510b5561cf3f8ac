"""Min/max downsampling keeps a curve's shape: its extremes, first and last points, in step order."""

from __future__ import annotations

import math
import random

from hypothesis import given
from hypothesis import strategies as st

from hpc_master.services.curves.downsample import MinMaxCurve, minmax_downsample


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
    assert a.buckets <= 128


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


def _reference(points: list[tuple[int, float]], max_buckets: int) -> list[tuple[int, float]]:
    """Min/max buckets the slow, obvious way: every point at the final width, each bucket's min and max
    (the smallest step at equal values), the first and the last point."""
    points = [(s, v) for s, v in points if math.isfinite(v) and s >= 0]
    if not points:
        return []
    width = 1
    while max(s for s, _ in points) // width >= 2 * max_buckets:
        width *= 2
    lows: dict[int, tuple[int, float]] = {}
    highs: dict[int, tuple[int, float]] = {}
    for s, v in points:
        b = s // width
        if b not in lows or v < lows[b][1] or (v == lows[b][1] and s < lows[b][0]):
            lows[b] = (s, v)
        if b not in highs or v > highs[b][1] or (v == highs[b][1] and s < highs[b][0]):
            highs[b] = (s, v)
    out: dict[int, float] = {}
    for b in sorted(lows):
        out.setdefault(*lows[b])
        out.setdefault(*highs[b])
    first = min(points, key=lambda p: p[0])
    last = max(reversed(points), key=lambda p: p[0])
    out[first[0]] = first[1]
    out[last[0]] = last[1]
    return sorted(out.items())


@given(
    st.lists(
        st.tuples(st.integers(-5, 5000), st.one_of(st.floats(-1e6, 1e6), st.just(float("nan")))),
        min_size=1,
        max_size=400,
    ),
    st.integers(1, 40),
    st.integers(1, 5),
)
def test_batches_fold_to_what_one_pass_over_every_point_gives(
    points: list[tuple[int, float]], max_buckets: int, batches: int
) -> None:
    """However the points arrive (in batches, read in between), the buckets are those of every point at once."""
    curve = MinMaxCurve(max_buckets=max_buckets)
    size = -(-len(points) // batches)
    for start in range(0, len(points), size):
        chunk = points[start : start + size]
        curve.add_many([s for s, _ in chunk], [v for _, v in chunk])
        curve.points()  # folds this batch
    assert curve.points() == _reference(points, max_buckets)
    assert curve.buckets <= 2 * max_buckets


def test_a_saved_curve_loads_and_grows_like_one_never_saved() -> None:
    rng = random.Random(11)
    points = [(i * 7, rng.gauss(0, 1)) for i in range(30_000)]
    kept = MinMaxCurve(max_buckets=64)
    saved = MinMaxCurve(max_buckets=64)
    for s, v in points[:10_000]:
        kept.add(s, v)
        saved.add(s, v)
    data = saved.to_bytes()
    loaded = MinMaxCurve.from_bytes(data)
    assert loaded.points() == kept.points() and loaded.count == kept.count
    assert len(data) < 64 + 40 * 128  # the buckets, not the points
    for s, v in points[10_000:]:
        kept.add(s, v)
        loaded.add(s, v)
    assert loaded.points(300) == kept.points(300)
    assert loaded.first == points[0] and loaded.last == points[-1]


def test_bytes_that_are_no_curve_are_refused() -> None:
    data = MinMaxCurve.from_points([1, 2, 3], [1.0, 2.0, 3.0]).to_bytes()
    for bad in (b"", b"MMC1", data[:-8], b"XXXX" + data[4:]):
        try:
            MinMaxCurve.from_bytes(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad[:8]!r}… was taken for a curve")
