"""Per-statement memory accounting: the probe that instrumented cells call.

``enter(i)`` is called when statement ``i`` starts. It reads memory once, closes the
statement that was running (its delta, its peak above its own start, its end state),
resets the peak counters and opens ``i``. One reading serves as the end of one
statement and the start of the next, so a boundary costs one device query.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpumagic.cell import Statement
from gpumagic.memory.probes import CudaMemory, HostMemory, Reading

# Breakdown into parameters / gradients / optimizer state costs a walk over the model's
# tensors (~35 µs for a small CNN); do it on each statement's first run, then at most once
# per this many nanoseconds, so a training loop pays well under 1% for it.
_BREAKDOWN_EVERY_NS = 200_000_000
# The timeline keeps at most this many points: past it, every other point is dropped and
# only every 2nd (4th, ...) boundary is recorded; peaks in between are folded in.
_TIMELINE_MAX = 4096


@dataclass(frozen=True)
class Device:
    """What a trace tracks: ``cuda:N`` through the allocator, or ``host`` RSS."""

    kind: str  # "cuda" or "host"
    label: str  # "cuda:0 (NVIDIA H200)" or "host RSS"
    why: str  # one sentence: why this device, and how peaks are measured
    index: int = -1


class MemoryTracer:
    """Accumulates per-statement numbers; implements :class:`gpumagic.cell.Probe`."""

    def __init__(
        self,
        statements: Sequence[Statement],
        device: Device,
        reader: CudaMemory | HostMemory,
        host: HostMemory,
        breakdown: Any = None,  # gpumagic.memory.holders.ModelMemory or None
        sync: Callable[[], bool] | None = None,
    ) -> None:
        n = len(statements)
        self.statements = list(statements)
        self.device = device
        self._reader = reader
        self._host = host
        self._separate_host = reader is not host
        self._breakdown = breakdown
        # --sync: waits for the device at each boundary (returns False when there was
        # nothing to wait for, CUDA not being initialised yet), so a statement's time
        # includes the GPU work it queued; what the waits took is kept to report its cost.
        self._sync = sync
        self.sync_requested = sync is not None
        self.syncs = 0
        self.sync_ns = 0
        self.sync_error = ""
        self.hits = [0] * n
        self.delta = [0] * n
        self.peak = [0] * n
        self.after = [0] * n
        self.reserved_after = [0] * n
        self.host_delta = [0] * n
        self.host_peak = [0] * n
        self.host_after = [0] * n
        self.time_ns = [0] * n
        self.parts: list[tuple[int, int, int] | None] = [None] * n  # params, grads, optimizer
        self._last_breakdown_ns = 0
        self.open = -1  # statement running now, -1 between statements
        # state at the start of the open statement
        self._start_ns = 0
        self._start_cur = 0
        self._start_host = 0
        # whole-cell numbers
        self.started_ns = time.perf_counter_ns()
        first = reader.read()
        first_host = host.read() if self._separate_host else first
        self.initial = first.current
        self.initial_reserved = first.reserved
        self.initial_host = first_host.current
        self.final = first.current
        self.final_reserved = first.reserved
        self.final_host = first_host.current
        self.cell_peak = first.current
        self.host_cell_peak = first_host.current
        self.boundaries = 0
        self.elapsed_ns = 0
        # timeline: (seconds since start, allocated, statement index, highest since last point)
        self.timeline: list[tuple[float, int, int, int]] = [(0.0, first.current, -1, first.current)]
        self._stride = 1
        self._pending_peak = first.current
        reader.reset_peak()
        if self._separate_host:
            host.reset_peak()

    # -- the probe ---------------------------------------------------------------------------
    def enter(self, index: int) -> None:
        if self._sync is not None:
            self._synchronize()
        now = time.perf_counter_ns()
        dev = self._reader.read()
        host = self._host.read() if self._separate_host else dev
        self._close(now, dev, host)
        self._reader.reset_peak()
        if self._separate_host:
            self._host.reset_peak()
        self.open = index
        self.hits[index] += 1
        self._start_ns = time.perf_counter_ns()
        self._start_cur = dev.current
        self._start_host = host.current

    def _synchronize(self) -> None:
        assert self._sync is not None
        t0 = time.perf_counter_ns()
        try:
            waited = self._sync()
        except Exception as exc:
            # A sticky CUDA error from the cell's own kernels: raising it here would move the
            # cell's exception to a statement boundary. Stop syncing; the cell's next own
            # synchronisation raises it as it would without the magic.
            self._sync = None
            first = str(exc).strip().splitlines()[:1]
            self.sync_error = f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__
            return
        if waited:
            self.syncs += 1
            self.sync_ns += time.perf_counter_ns() - t0

    def _close(self, now: int, dev: Reading, host: Reading) -> None:
        i = self.open
        self.final = dev.current
        self.final_reserved = dev.reserved
        self.final_host = host.current
        if dev.peak > self.cell_peak:
            self.cell_peak = dev.peak
        if host.peak > self.host_cell_peak:
            self.host_cell_peak = host.peak
        self.boundaries += 1
        if i < 0:
            return
        d = dev.current - self._start_cur
        self.delta[i] += d
        p = dev.peak - self._start_cur
        if p > self.peak[i]:
            self.peak[i] = p
        self.after[i] = dev.current
        self.reserved_after[i] = dev.reserved
        self.host_delta[i] += host.current - self._start_host
        hp = host.peak - self._start_host
        if hp > self.host_peak[i]:
            self.host_peak[i] = hp
        self.host_after[i] = host.current
        self.time_ns[i] += now - self._start_ns
        self._record(now, dev, i)
        if self._breakdown is not None and (
            self.hits[i] == 1 or now - self._last_breakdown_ns >= _BREAKDOWN_EVERY_NS
        ):
            self.parts[i] = self._breakdown.measure()
            self._last_breakdown_ns = time.perf_counter_ns()

    def _record(self, now: int, dev: Reading, index: int) -> None:
        if dev.peak > self._pending_peak:
            self._pending_peak = dev.peak
        if self.boundaries % self._stride:
            return
        self.timeline.append(
            ((now - self.started_ns) / 1e9, dev.current, index, self._pending_peak)
        )
        self._pending_peak = dev.current
        if len(self.timeline) > _TIMELINE_MAX:
            kept = self.timeline[::2]
            # fold the dropped points' peaks into the kept ones so no peak disappears
            for k in range(1, len(self.timeline), 2):
                j = (k - 1) // 2
                t, cur, idx, pk = kept[j]
                kept[j] = (t, cur, idx, max(pk, self.timeline[k][3]))
            self.timeline = kept
            self._stride *= 2

    # -- end of the cell -------------------------------------------------------------------
    def finish(self) -> int:
        """Close the statement still open (the failing one, after an error); return its index."""
        failing = self.open
        if self._sync is not None:
            self._synchronize()
        now = time.perf_counter_ns()
        dev = self._reader.read()
        host = self._host.read() if self._separate_host else dev
        self._close(now, dev, host)
        self.open = -1
        self.elapsed_ns = now - self.started_ns
        return failing

    def live_state(self) -> tuple[int, int, list[tuple[float, int, int, int]]]:
        """(statement running now, its hit count, timeline copy) for the live view; any thread."""
        i = self.open
        return i, (self.hits[i] if i >= 0 else 0), list(self.timeline)
