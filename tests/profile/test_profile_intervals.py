"""The interval and call-tree helpers the analyses share, against plain Python on a grid.

Intervals are drawn on whole microseconds so a set of them is exactly the set of unit cells
it covers; the vectorised answers must equal what counting those cells gives.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpumagic.profile.analysis import intervals, tree


def _random_intervals(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    s = rng.integers(0, 100, n).astype(float)
    return s, s + rng.integers(1, 15, n)


def _cells(s: np.ndarray, e: np.ndarray) -> set[int]:
    return {c for a, b in zip(s.tolist(), e.tolist()) for c in range(int(a), int(b))}


def _as_set(pair: tuple[np.ndarray, np.ndarray]) -> set[int]:
    s, e = pair
    assert (np.diff(s) > 0).all() and (s[1:] > e[:-1]).all(), "disjoint, sorted, not touching"
    return _cells(s, e)


@pytest.mark.parametrize("seed", range(20))
def test_intersect_subtract_and_length_in_count_the_covered_cells(seed):
    rng = np.random.default_rng(seed)
    a = _random_intervals(rng, int(rng.integers(0, 12)))
    b = _random_intervals(rng, int(rng.integers(0, 12)))
    ca, cb = _cells(*a), _cells(*b)
    assert _as_set(intervals.intersect(a, b)) == ca & cb
    assert _as_set(intervals.subtract(a, b)) == ca - cb
    lo = rng.integers(0, 110, 6).astype(float)
    hi = lo + rng.integers(0, 40, 6)
    want = [len({c for c in ca if lo_ <= c < hi_}) for lo_, hi_ in zip(lo, hi)]
    assert intervals.length_in(*a, lo, hi).tolist() == pytest.approx(want)


def test_interval_sets_with_nothing_on_one_side():
    empty = (np.zeros(0), np.zeros(0))
    some = (np.array([5.0, 1.0, 2.0]), np.array([7.0, 3.0, 4.0]))
    assert len(intervals.intersect(some, empty)[0]) == 0
    s, e = intervals.subtract(some, empty)
    assert s.tolist() == [1.0, 5.0] and e.tolist() == [4.0, 7.0]
    assert intervals.length_in(*empty, np.array([0.0, 2.0]), np.array([1.0, 9.0])).tolist() == [
        0.0,
        0.0,
    ]


# 0 ─┬─ 1 ─┬─ 2 ── 3
#    │     └─ 4
#    └─ 5          6 (a root of its own)
PARENT = np.array([-1, 0, 1, 2, 1, 0, -1])


def test_ancestors_of_marks_every_strict_ancestor_once():
    assert np.flatnonzero(tree.ancestors_of(PARENT, np.array([3]))).tolist() == [0, 1, 2]
    assert np.flatnonzero(tree.ancestors_of(PARENT, np.array([4, 5, 6]))).tolist() == [0, 1]
    assert not tree.ancestors_of(PARENT, np.array([0, 6])).any()


def test_nearest_flagged_is_the_row_itself_or_its_closest_flagged_ancestor():
    flag = np.zeros(7, bool)
    flag[[1, 3]] = True
    rows = np.array([3, 2, 4, 1, 5, 0, 6, -1])
    assert tree.nearest_flagged(PARENT, flag, rows).tolist() == [3, 1, 1, 1, -1, -1, -1, -1]


def test_the_call_tree_orders_spans_as_lexsort_does():
    # tree.parents sorts by thread, start, longest first without np.lexsort (issue 27):
    # the same order on random spans with ties in every key, missing ends and starts
    from gpumagic.profile.analysis.tree import _by_thread_start_longest

    rng = np.random.default_rng(27)
    for trial in range(2000):
        n = int(rng.integers(1, 60))
        ts = rng.integers(0, 8, n).astype(float)
        end = ts + rng.integers(0, 4, n)
        thread = rng.integers(0, 3, n)
        if trial % 7 == 0:
            ts[rng.integers(0, n)] = np.nan
        if trial % 11 == 0:
            end[rng.integers(0, n)] = np.nan
        expected = np.lexsort((-end, ts, thread))
        assert _by_thread_start_longest(ts, end, thread).tolist() == expected.tolist()
