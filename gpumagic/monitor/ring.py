"""A fixed-size ring of samples: the watcher's memory stays bounded by the window
however long the kernel lives (a day at 1 s is 86 400 samples; we keep ``window``'s worth).

Preallocated numpy arrays rather than a deque of dicts: pushing is one row copy, a
snapshot for the chart is two array copies, and the size is known up front
(``capacity * devices * metrics * 8`` bytes).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import numpy as np


def capacity_for(window: float, interval: float) -> int:
    """Slots for ``window`` seconds at ``interval``, plus slack for the extra sample taken
    when a cell ends (so a burst of short cells does not push the window's start out)."""
    return math.ceil(window / interval) + 16


class Ring:
    """Samples ``(time, block)`` where ``block`` is ``(devices, metrics)`` float64, NaN = missing."""

    def __init__(self, capacity: int, devices: int, metrics: int) -> None:
        if capacity < 1:
            raise ValueError(f"ring capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._times = np.full(capacity, np.nan)
        self._values = np.full((capacity, devices, metrics), np.nan)
        self._next = 0  # slot the next push writes
        self._count = 0  # samples held (<= capacity)
        self.pushed = 0  # samples ever pushed (a sequence number for change detection)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        return int(self._times.nbytes + self._values.nbytes)

    def push(self, t: float, block: np.ndarray) -> None:
        with self._lock:
            self._times[self._next] = t
            self._values[self._next] = block
            self._next = (self._next + 1) % self.capacity
            self._count = min(self._count + 1, self.capacity)
            self.pushed += 1

    def widen(self, positions: Sequence[int], devices: int) -> None:
        """More devices per sample (a source found one): row ``i`` of every sample held moves
        to ``positions[i]`` of ``devices`` rows; the new rows are NaN in the samples so far."""
        with self._lock:
            values = np.full((self.capacity, devices, self._values.shape[2]), np.nan)
            values[:, list(positions), :] = self._values
            self._values = values

    def _order(self, n: int) -> np.ndarray:
        start = (self._next - n) % self.capacity
        return (start + np.arange(n)) % self.capacity

    def tail(self, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the last ``n`` samples (all when None), oldest first."""
        with self._lock:
            k = self._count if n is None else max(0, min(n, self._count))
            idx = self._order(k)
            return self._times[idx], self._values[idx]

    def since(self, t0: float) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the samples taken at or after ``t0``, oldest first."""
        times, values = self.tail()
        keep = times >= t0
        return times[keep], values[keep]

    def last(self) -> tuple[float, np.ndarray] | None:
        with self._lock:
            if self._count == 0:
                return None
            i = (self._next - 1) % self.capacity
            return float(self._times[i]), self._values[i].copy()
