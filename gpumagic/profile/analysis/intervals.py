"""Vectorised interval arithmetic on ``(starts, ends)`` arrays, in microseconds.

Everything the breakdown, utilisation, idle and communication analyses need reduces to
a few operations on sets of half-open intervals: merge overlapping ones, clip them to a
window, ask which of a set of elementary segments they cover, intersect or subtract two
sets, and measure how much of a set lies inside each of many windows. All are sorts,
cumulative sums and ``searchsorted`` calls, so 100k events cost milliseconds.
"""

from __future__ import annotations

import numpy as np


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as disjoint, sorted intervals (touching ones are joined)."""
    if len(starts) == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    # a new run starts where an interval begins after everything before it has ended
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(s)) - 1
    return s[first], reach[last]


def clip(
    starts: np.ndarray, ends: np.ndarray, lo: float, hi: float
) -> tuple[np.ndarray, np.ndarray]:
    """Intervals cut to ``[lo, hi]``; the ones left empty are dropped."""
    s = np.maximum(starts, lo)
    e = np.minimum(ends, hi)
    keep = e > s
    return s[keep], e[keep]


def total(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of the intervals."""
    s, e = merge(starts, ends)
    return float((e - s).sum())


def covered(points: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each segment ``[points[j], points[j+1])``, whether any interval covers it.

    ``points`` must be sorted and contain every start and end (so no interval begins or
    ends inside a segment).
    """
    m = len(points)
    if m < 2:
        return np.zeros(0, bool)
    if len(starts) == 0:
        return np.zeros(m - 1, bool)
    delta = np.bincount(np.searchsorted(points, starts), minlength=m + 1)[:m].astype(np.int64)
    delta -= np.bincount(np.searchsorted(points, ends), minlength=m + 1)[:m]
    return np.cumsum(delta)[:-1] > 0


def weighted_cover(
    points: np.ndarray, starts: np.ndarray, ends: np.ndarray, weights: np.ndarray
) -> np.ndarray:
    """For each elementary segment, the sum of ``weights`` of the intervals covering it."""
    m = len(points)
    if m < 2:
        return np.zeros(0)
    delta = np.bincount(np.searchsorted(points, starts), weights=weights, minlength=m + 1)[:m]
    delta -= np.bincount(np.searchsorted(points, ends), weights=weights, minlength=m + 1)[:m]
    return np.cumsum(delta)[:-1]


def cumulative(starts: np.ndarray, ends: np.ndarray, x: np.ndarray) -> np.ndarray:
    """How much of the union of the intervals lies before each point of ``x``.

    ``cumulative(s, e, b) - cumulative(s, e, a)`` is the covered length inside ``[a, b]``.
    """
    s, e = merge(starts, ends)
    x = np.asarray(x, float)
    if len(s) == 0:
        return np.zeros(x.shape)
    length = e - s
    before = np.concatenate([[0.0], np.cumsum(length)])
    k = np.searchsorted(s, x, side="right") - 1
    kc = np.maximum(k, 0)
    return np.where(k >= 0, before[kc] + np.minimum(x - s[kc], length[kc]), 0.0)


def length_in(starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Covered length of the union of the intervals inside each window ``[lo[i], hi[i]]``."""
    if len(starts) == 0:
        return np.zeros(len(lo))
    return cumulative(starts, ends, hi) - cumulative(starts, ends, lo)


Intervals = tuple[np.ndarray, np.ndarray]  # (starts, ends)


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """The intersection of two sets of intervals, as disjoint sorted intervals."""
    (s1, e1), (s2, e2) = a, b
    if len(s1) == 0 or len(s2) == 0:
        return np.zeros(0), np.zeros(0)
    points = np.unique(np.concatenate([s1, e1, s2, e2]))
    both = covered(points, s1, e1) & covered(points, s2, e2)
    return merge(points[:-1][both], points[1:][both])


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """``a`` less ``b``, as disjoint sorted intervals."""
    (s1, e1), (s2, e2) = a, b
    if len(s1) == 0 or len(s2) == 0:
        return merge(s1, e1)
    points = np.unique(np.concatenate([s1, e1, s2, e2]))
    keep = covered(points, s1, e1) & ~covered(points, s2, e2)
    return merge(points[:-1][keep], points[1:][keep])
