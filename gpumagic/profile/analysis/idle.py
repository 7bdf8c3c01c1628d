"""Why the GPU sat idle: Holistic Trace Analysis' idle-time breakdown, plus the gaps.

HTA (``TraceAnalysis.get_idle_time_breakdown``) looks at each stream on its own: the
gap before each kernel (or copy, or set) since the previous one on that stream ended is

* ``host_wait`` when the call that launched the kernel started only after the stream
  had gone idle: the CPU was not enqueueing work fast enough;
* ``kernel_wait`` when the gap is shorter than 30 µs (HTA's default
  ``consecutive_kernel_delay``): the ordinary cost of launching back-to-back kernels;
* ``other`` otherwise (the kernel waited on an event, another stream, a copy...).

The longest gaps are taken on the whole device (no stream busy), which is what costs
time, and each is listed with the CPU operators that ran meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpumagic.profile.analysis import intervals
from gpumagic.profile.trace.model import Trace

KERNEL_WAIT_US = 30.0  # HTA's consecutive_kernel_delay default
IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")


@dataclass
class StreamIdle:
    device: int
    stream: int
    events: int
    busy_us: float
    host_wait_us: float
    kernel_wait_us: float
    other_us: float

    @property
    def idle_us(self) -> float:
        return self.host_wait_us + self.kernel_wait_us + self.other_us


def classify(gap: np.ndarray, launch_ts: np.ndarray, idle_since: np.ndarray) -> np.ndarray:
    """0 host_wait, 1 kernel_wait, 2 other, per HTA's rules (NaN launch: not host_wait)."""
    with np.errstate(invalid="ignore"):
        host = launch_ts > idle_since
    return np.where(host, 0, np.where(gap < KERNEL_WAIT_US, 1, 2))


def stream_idle(trace: Trace, rows: np.ndarray, launch_ts: np.ndarray) -> list[StreamIdle]:
    """HTA's per-stream breakdown over the GPU events ``rows`` (``launch_ts`` per GPU event)."""
    gpu = trace.gpu
    out: list[StreamIdle] = []
    if len(rows) == 0:
        return out
    dev, strm = gpu.device[rows], gpu.stream[rows]
    key = dev * (1 << 32) + strm  # one sortable key per (device, stream)
    order = np.argsort(key, kind="stable")
    uniq, first = np.unique(key[order], return_index=True)
    bounds = np.append(first, len(order))
    for j in range(len(uniq)):
        r = rows[order[bounds[j] : bounds[j + 1]]]
        d, s = int(gpu.device[r[0]]), int(gpu.stream[r[0]])
        r = r[np.argsort(gpu.ts[r], kind="stable")]
        ts, end = gpu.ts[r], gpu.end[r]
        # HTA compares with the previous event's end, not the running maximum
        prev_end = end[:-1]
        gap = np.maximum(ts[1:] - prev_end, 0.0)  # same-stream events cannot overlap; clip rounding
        cat = classify(gap, launch_ts[r[1:]], prev_end)
        sums = np.bincount(cat, weights=gap, minlength=3)
        out.append(
            StreamIdle(
                device=int(d),
                stream=int(s),
                events=len(r),
                busy_us=intervals.total(ts, end),
                host_wait_us=float(sums[0]),
                kernel_wait_us=float(sums[1]),
                other_us=float(sums[2]),
            )
        )
    return out


@dataclass
class Gaps:
    """Device-wide gaps (no stream of the GPU busy), as columns."""

    device: np.ndarray
    start: np.ndarray
    end: np.ndarray
    category: np.ndarray  # index into IDLE_CATEGORIES
    closed: np.ndarray  # ended by GPU work (False: the stretch after the window's last event)

    @property
    def us(self) -> np.ndarray:
        return self.end - self.start

    def __len__(self) -> int:
        return len(self.start)

    def total_by_category(self, mask: np.ndarray | None = None) -> dict[str, float]:
        us = self.us if mask is None else np.where(mask, self.us, 0.0)
        sums = np.bincount(self.category, weights=us, minlength=len(IDLE_CATEGORIES))
        return {c: float(sums[k]) for k, c in enumerate(IDLE_CATEGORIES)}


def device_gaps(
    trace: Trace, rows: np.ndarray, launch_ts: np.ndarray, lo: float, hi: float
) -> Gaps:
    """Every device-wide gap inside ``[lo, hi]``, in time order per device."""
    gpu = trace.gpu
    parts: list[tuple[np.ndarray, ...]] = []
    for d in np.unique(gpu.device[rows]).tolist():
        r = rows[gpu.device[rows] == d]
        s, e = intervals.merge(gpu.ts[r], gpu.end[r])
        if len(s) == 0:
            continue
        g_start, g_end = e[:-1], s[1:]
        # the event that ends a gap is the earliest one starting at the gap's end
        first_at = r[np.argsort(gpu.ts[r], kind="stable")]
        nxt = first_at[np.searchsorted(gpu.ts[first_at], g_end, side="left")]
        cat = classify(g_end - g_start, launch_ts[nxt], g_start)
        # plus the stretches before the first and after the last event in the window
        first_launch = launch_ts[first_at[0]]
        lead = 0 if np.isfinite(first_launch) and first_launch > lo else 2
        starts = np.maximum(np.concatenate([[lo], g_start, [e[-1]]]), lo)
        ends = np.minimum(np.concatenate([[s[0]], g_end, [hi]]), hi)
        cats = np.concatenate([[lead], cat, [2]])
        closed = np.ones(len(starts), bool)
        closed[-1] = False
        keep = ends > starts
        parts.append(
            (np.full(int(keep.sum()), d), starts[keep], ends[keep], cats[keep], closed[keep])
        )
    if not parts:
        z = np.zeros(0)
        return Gaps(z.astype(np.int64), z, z, z.astype(np.int64), z.astype(bool))
    cols = [np.concatenate(c) for c in zip(*parts)]
    return Gaps(
        cols[0].astype(np.int64), cols[1], cols[2], cols[3].astype(np.int64), cols[4].astype(bool)
    )


def ops_during(
    trace: Trace, candidates: np.ndarray, start: float, end: float, limit: int = 3
) -> list[tuple[str, float]]:
    """The CPU operators that overlapped ``[start, end]`` the most.

    Wrappers that contain the whole gap and last far longer than it (``## forward ##``,
    the step itself) say nothing about it and are skipped.
    """
    host = trace.host
    ts, en = host.ts[candidates], host.end[candidates]
    overlap = np.minimum(en, end) - np.maximum(ts, start)
    gap = end - start
    wrapper = (ts <= start) & (en >= end) & ((en - ts) > 4 * gap)
    ok = (overlap > 0) & ~wrapper
    idx = np.flatnonzero(ok)
    if len(idx) == 0:
        return []
    # most overlap first; among equals the shorter (more specific) operator
    order = idx[np.lexsort(((en - ts)[idx], -overlap[idx]))]
    out: list[tuple[str, float]] = []
    seen: set[str] = set()
    for i in order.tolist():
        name = host.name.at(int(candidates[i]))
        if name in seen:
            continue
        seen.add(name)
        out.append((name, float(overlap[i])))
        if len(out) == limit:
            break
    return out
