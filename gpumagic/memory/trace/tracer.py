"""Per-statement memory accounting: the probe that instrumented cells call.

``enter(i)`` is called when statement ``i`` starts. It reads memory once, closes the
statement that was running (its delta, its peak above its own start, its end state),
resets the peak counters and opens ``i``. One reading serves as the end of one
statement and the start of the next, so a boundary costs one device query.

With a tensor census (:class:`gpumagic.memory.census.tracker.TensorTracker`), each boundary also
settles the statement that ended: its bytes by category after it, and at its peak
(:mod:`gpumagic.memory.census.categories`). On CUDA the allocator's counters stay the totals and
"other" is what no tensor accounts for; on the CPU the census is the total.

When the cell ends, :meth:`MemoryTracer.stop` closes the last statement and hands out
the numbers as a frozen :class:`TraceTotals`; what comes after (the out-of-memory
post-mortem, the result) works on that, never on the tracer's fields.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpumagic.cell import Statement, error_text
from gpumagic.memory.census.categories import OTHER
from gpumagic.memory.census.ledger import Settled
from gpumagic.memory.trace.readers import HostMemory, Reader, Reading, TensorMemory
from gpumagic.tracebacks import hidden_hook

# The timeline keeps at most this many points: past it, every other point is dropped and
# only every 2nd (4th, ...) boundary is recorded; peaks in between are folded in.
_TIMELINE_MAX = 4096
# The host's RSS is read at a boundary only when this long has passed since it was last read
# (a reading, a pread of /proc/self/status, costs 8-40 us: many times a cheap statement).
# What statements inside that window did to the RSS lands on the first statement after it
# that reads, nothing lost: the peak is a high-water mark the kernel keeps until it is read
# and reset. 1 ms is the resolution of the sampled fallback (readers.HostMemory) too. The
# cell's own figures (its start, end and peak) are always read.
_HOST_GAP_NS = 1_000_000


Categories = tuple[int, ...]  # bytes by category, in gpumagic.memory.census.categories' order
# (seconds since start, allocated, statement index, highest since the previous point,
#  bytes by category after the statement or None, by category at that highest or None)
Point = tuple[float, int, int, int, "Categories | None", "Categories | None"]
Timeline = tuple[Point, ...]


class Census(Protocol):
    """What the tracer needs of a tensor census: end a statement, open the next."""

    def settle(self, statement: int) -> Settled: ...

    def settle_quiet(self, statement: int) -> Settled | None: ...


@dataclass(frozen=True)
class PeakMoment:
    """The cell's highest moment: which statement (its index and hit), the bytes then, by
    category, and the activations by module token (names: the census's)."""

    statement: int
    hit: int
    total: int
    categories: Categories
    modules: dict[int, int]


@dataclass(frozen=True)
class TraceTotals:
    """What a traced cell measured, per statement (indexed like ``statements``) and whole.

    Bytes of the traced device unless named ``host_``; ``time_ns`` is host time per
    statement. ``timeline``: (seconds since start, allocated, statement index, highest since
    the previous point).
    """

    statements: tuple[Statement, ...]
    hits: tuple[int, ...]
    delta: tuple[int, ...]
    peak: tuple[int, ...]
    after: tuple[int, ...]
    reserved_after: tuple[int, ...]
    host_delta: tuple[int, ...]
    host_peak: tuple[int, ...]
    host_after: tuple[int, ...]
    time_ns: tuple[int, ...]
    categories: tuple[Categories | None, ...]  # by category after the last hit
    peak_categories: tuple[Categories | None, ...]  # by category at the highest hit's peak
    at_peak: PeakMoment | None
    approximate: tuple[int, ...]  # statements whose peak's categories are as known then
    initial: int
    final: int
    final_reserved: int
    cell_peak: int
    initial_host: int
    final_host: int
    host_cell_peak: int
    elapsed_ns: int
    timeline: Timeline
    failing: int  # the statement open when the cell ended: the failing one after an error
    sync_requested: bool
    syncs: int  # boundaries that waited for the device
    sync_ns: int  # what those waits took, all together
    sync_error: str  # why --sync stopped ("" when it did not)

    def after_release(self, current: int, reserved: int) -> TraceTotals:
        """The totals with the cell's end state read again after the failed call's frames
        were released (an out-of-memory error): the net change is what the cell keeps."""
        return dataclasses.replace(self, final=current, final_reserved=reserved)


class MemoryTracer:
    """Accumulates per-statement numbers; implements :class:`gpumagic.cell.Probe`."""

    def __init__(
        self,
        statements: Sequence[Statement],
        reader: Reader,
        host: HostMemory,
        sync: Callable[[], bool] | None = None,
        census: Census | None = None,
    ) -> None:
        n = len(statements)
        self.statements = list(statements)
        self._reader = reader
        self._host = host
        self._separate_host = reader is not host
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
        self._census = census
        # The census's own total is the traced device's (the CPU with the census on): a
        # boundary where the census saw nothing happen needs no reading at all (enter()).
        self._quiet_census = (
            census if isinstance(reader, TensorMemory) and reader.tracker is census else None
        )
        self._quiet_from: Settled | None = None  # the settlement _quiet_cats derive from
        self._quiet_cats: Categories = ()
        self.categories: list[Categories | None] = [None] * n
        self.peak_categories: list[Categories | None] = [None] * n
        self.at_peak: PeakMoment | None = None
        self.approximate: set[int] = set()
        self.open = -1  # statement running now, -1 between statements
        # state at the start of the open statement
        self._start_ns = 0
        self._start_cur = 0
        self._start_host = 0
        self._host_read_ns = 0  # when the host was last read
        self._host_last = Reading(0, 0, 0)
        # whole-cell numbers
        self.started_ns = time.perf_counter_ns()
        first = reader.read()
        first_host = host.read() if self._separate_host else first
        self._host_last = first_host
        self._host_read_ns = self.started_ns
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
        self.timeline: list[Point] = [(0.0, first.current, -1, first.current, None, None)]
        self._stride = 1
        self._pending_peak = first.current
        self._pending_cats: Categories | None = None
        self._totals: TraceTotals | None = None
        reader.reset_peak()
        if self._separate_host:
            host.reset_peak()

    # -- the probe ---------------------------------------------------------------------------
    @hidden_hook
    def enter(self, index: int) -> None:
        census = self._quiet_census
        if census is not None and self._sync is None:
            now = time.perf_counter_ns()
            if now - self._host_read_ns < _HOST_GAP_NS and self.open >= 0:
                settled = census.settle_quiet(index)
                if settled is not None:
                    self._pass(now, index, settled)
                    return
        if self._sync is not None:
            self._synchronize()
        now = time.perf_counter_ns()
        dev = self._reader.read()
        host = self._read_host(now, dev)
        self._close(now, dev, host, index)
        self._reader.reset_peak()
        if self._separate_host and self._host_read_ns == now:
            self._host.reset_peak()
        self.open = index
        self.hits[index] += 1
        self._start_ns = time.perf_counter_ns()
        self._start_cur = dev.current
        self._start_host = host.current

    def _read_host(self, now: int, dev: Reading) -> Reading:
        """The host at this boundary: read when :data:`_HOST_GAP_NS` has passed since the last
        reading; otherwise the last reading's state, with no peak above it (the kernel's
        high-water mark keeps whatever happens until the next reading, which reports it)."""
        if not self._separate_host:
            return dev
        if now - self._host_read_ns >= _HOST_GAP_NS:
            self._host_read_ns = now
            self._host_last = self._host.read()
            return self._host_last
        rss = self._host_last.current
        return Reading(rss, rss, rss)

    def _pass(self, now: int, index: int, settled: Settled) -> None:
        """A boundary after a statement that made, freed and moved nothing, the host's last
        reading recent: what :meth:`_close` and :meth:`enter` do with readings equal to the
        statement's start (its delta and peak 0, its categories those of the last
        settlement), without reading anything. A cheap Python statement costs this."""
        i = self.open
        cur = self._start_cur
        if settled is not self._quiet_from:
            self._quiet_from = settled
            self._quiet_cats = _complete(settled.after, cur)
        self.boundaries += 1
        self.after[i] = cur
        self.reserved_after[i] = cur
        self.host_after[i] = self._start_host
        self.time_ns[i] += now - self._start_ns
        self.categories[i] = self._quiet_cats
        if self.boundaries % self._stride or cur > self._pending_peak:
            self._record(now, cur, cur, i, self._quiet_cats, None)
        else:  # _record's common case, inline
            self.timeline.append(
                ((now - self.started_ns) / 1e9, cur, i, self._pending_peak, self._quiet_cats, self._pending_cats)
            )
            self._pending_peak = cur
            self._pending_cats = self._quiet_cats
            if len(self.timeline) > _TIMELINE_MAX:
                self._thin()
        self.open = index
        self.hits[index] += 1
        self._start_ns = time.perf_counter_ns()

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
            self.sync_error = error_text(exc)
            return
        if waited:
            self.syncs += 1
            self.sync_ns += time.perf_counter_ns() - t0

    def _close(self, now: int, dev: Reading, host: Reading, following: int) -> None:
        i = self.open
        settled = self._census.settle(following) if self._census is not None else None
        self.final = dev.current
        self.final_reserved = dev.reserved
        self.final_host = host.current
        if dev.peak > self.cell_peak:
            self.cell_peak = dev.peak
        if host.peak > self.host_cell_peak:
            self.host_cell_peak = host.peak
        self.boundaries += 1
        if i < 0:
            if settled is not None and len(self.timeline) == 1:  # the cell's starting state
                t, cur, idx, pk, _, _ = self.timeline[0]
                start = _complete(settled.after, cur)
                self.timeline[0] = (t, cur, idx, pk, start, start)
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
        after = at_peak = None
        if settled is not None:
            after, at_peak = self._categorise(i, settled, dev)
        self._record(now, dev.current, dev.peak, i, after, at_peak)

    def _categorise(
        self, i: int, settled: Settled, dev: Reading
    ) -> tuple[Categories, Categories | None]:
        """Bytes by category after statement ``i`` and at its peak. "Other" is what the
        categories leave of the traced total: on CUDA the allocator's bytes no tensor
        accounts for join the census's own "other"."""
        after = _complete(settled.after, dev.current)
        self.categories[i] = after
        at_peak = None
        if settled.at_peak is not None:
            at_peak = _complete(settled.at_peak, dev.peak)
            if dev.peak - self._start_cur >= self.peak[i]:
                self.peak_categories[i] = at_peak
            if settled.approximate:
                self.approximate.add(i)
            if self.at_peak is None or dev.peak > self.at_peak.total:
                self.at_peak = PeakMoment(
                    i, self.hits[i], dev.peak, at_peak, dict(settled.modules_at_peak or {})
                )
        return after, at_peak

    def _record(
        self,
        now: int,
        current: int,
        peak: int,
        index: int,
        after: Categories | None,
        at_peak: Categories | None,
    ) -> None:
        if peak > self._pending_peak:
            self._pending_peak = peak
            self._pending_cats = at_peak if at_peak is not None else after
        if self.boundaries % self._stride:
            return
        self.timeline.append(
            (
                (now - self.started_ns) / 1e9,
                current,
                index,
                self._pending_peak,
                after,
                self._pending_cats,
            )
        )
        self._pending_peak = current
        self._pending_cats = after
        if len(self.timeline) > _TIMELINE_MAX:
            self._thin()

    def _thin(self) -> None:
        """Keep every other point of the timeline, and record every other boundary from now on."""
        kept = self.timeline[::2]
        # fold the dropped points' peaks into the kept ones so no peak disappears
        for k in range(1, len(self.timeline), 2):
            j = (k - 1) // 2
            t, cur, idx, pk, cats, pk_cats = kept[j]
            dropped = self.timeline[k]
            if dropped[3] > pk:
                pk, pk_cats = dropped[3], dropped[5]
            kept[j] = (t, cur, idx, pk, cats, pk_cats)
        self.timeline = kept
        self._stride *= 2

    # -- end of the cell -------------------------------------------------------------------
    def stop(self) -> TraceTotals:
        """Stop measuring: close the statement still open (the failing one, after an error)
        and hand out the numbers. A second call hands out the same numbers. (The run's own
        ``stop`` calls it: one lifecycle, :class:`gpumagic.cell.MeasuredRun`'s words.)"""
        if self._totals is not None:
            return self._totals
        failing = self.open
        if self._sync is not None:
            self._synchronize()
        now = time.perf_counter_ns()
        dev = self._reader.read()
        host = self._host.read() if self._separate_host else dev
        self._close(now, dev, host, -1)
        self.open = -1
        self.elapsed_ns = now - self.started_ns
        self._totals = TraceTotals(
            statements=tuple(self.statements),
            hits=tuple(self.hits),
            delta=tuple(self.delta),
            peak=tuple(self.peak),
            after=tuple(self.after),
            reserved_after=tuple(self.reserved_after),
            host_delta=tuple(self.host_delta),
            host_peak=tuple(self.host_peak),
            host_after=tuple(self.host_after),
            time_ns=tuple(self.time_ns),
            categories=tuple(self.categories),
            peak_categories=tuple(self.peak_categories),
            at_peak=self.at_peak,
            approximate=tuple(sorted(self.approximate)),
            initial=self.initial,
            final=self.final,
            final_reserved=self.final_reserved,
            cell_peak=self.cell_peak,
            initial_host=self.initial_host,
            final_host=self.final_host,
            host_cell_peak=self.host_cell_peak,
            elapsed_ns=self.elapsed_ns,
            timeline=tuple(self.timeline),
            failing=failing,
            sync_requested=self.sync_requested,
            syncs=self.syncs,
            sync_ns=self.sync_ns,
            sync_error=self.sync_error,
        )
        return self._totals

    def live_state(self) -> tuple[int, int, list[Point]]:
        """(statement running now, its hit count, timeline copy) for the live view; any thread."""
        i = self.open
        return i, (self.hits[i] if i >= 0 else 0), list(self.timeline)


def _complete(categories: Categories, total: int) -> Categories:
    """``categories`` with "other" set so that they add up to ``total`` (the traced device's
    allocated bytes): on the CPU that is the census's own "other"."""
    rest = sum(categories) - categories[OTHER]
    out = list(categories)
    out[OTHER] = total - rest
    return tuple(out)
