"""The ``%%memtrace`` result, :class:`MemTrace`: what a traced cell measured, and the ways to
read it: per-statement rows as a DataFrame (:mod:`.lines`), memory over time by category and
what was alive at the peak (:mod:`.timeline`), a matplotlib chart (:mod:`.plot`), an export
for PyTorch's memory visualiser (:mod:`gpumagic.memory.census.viz`), and the report
(``_repr_mimebundle_``: :mod:`gpumagic.render.memtrace`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpumagic.cell import Statement
from gpumagic.device_kinds import CUDA
from gpumagic.memory.census.ledger import EventLog
from gpumagic.memory.trace.device import TracedDevice
from gpumagic.memory.trace.lines import MEASURED, lines_frame
from gpumagic.memory.trace.oom.model import OomReport
from gpumagic.memory.trace.plot import plot_memory
from gpumagic.memory.trace.timeline import AtPeak, at_peak_of, timeline_frame
from gpumagic.render.html import Rendered
from gpumagic.units import fmt_count, fmt_us

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.memory.trace.tracer import Categories, PeakMoment, Point, TraceTotals
    from gpumagic.render.sections import Report

# How many statements the table highlights as the heaviest.
HOT_ROWS = 3


@dataclass(repr=False, eq=False)
class MemTrace(Rendered):
    """What ``%%memtrace`` measured. ``lines`` is the per-statement DataFrame, ``timeline``
    memory over the cell by category, ``at_peak`` what was alive at its highest moment.

    A statement that ran more than once (a loop's body) has one row: ``hits`` is how often it
    ran, ``delta_bytes`` its change summed over the hits (``delta_per_hit_bytes`` per hit),
    ``peak_bytes`` the highest any hit reached above its own start, and the after-columns
    (``allocated_bytes``, the categories) are from its last hit.
    """

    statements: list[Statement]
    device: TracedDevice
    hits: list[int]
    delta: list[int]
    peak: list[int]
    after: list[int]
    reserved_after: list[int]
    host_delta: list[int]
    host_peak: list[int]
    host_after: list[int]
    time_ns: list[int]
    initial: int
    final: int
    cell_peak: int
    final_reserved: int
    host_initial: int
    host_final: int
    host_cell_peak: int
    elapsed_ns: int
    points: list[Point]  # the tracer's timeline: see gpumagic.memory.trace.tracer.Point
    host_method: str = ""
    error_index: int = -1  # statement that raised, -1 if the cell completed
    error: str = ""  # "ZeroDivisionError: division by zero"
    oom: OomReport | None = None
    live_frames: int = 0  # frames the live view pushed while the cell ran
    notes: list[str] = field(default_factory=list)  # caveats on how to read the numbers
    synced: bool = False  # --sync: each boundary waited for the traced CUDA device
    sync_count: int = 0  # boundaries that waited (CUDA initialised by then)
    sync_ns: int = 0  # time spent in those waits, all together
    # The tensor census (empty without it): by category after each statement's last hit and
    # at its highest hit's peak, the cell's highest moment, the module names, the events.
    categories: list[Categories | None] = field(default_factory=list)
    peak_categories: list[Categories | None] = field(default_factory=list)
    peak_moment: PeakMoment | None = None
    approximate: list[int] = field(default_factory=list)
    module_names: dict[int, str] = field(default_factory=dict)
    events: EventLog | None = field(default=None, repr=False)
    _lines: Any = field(default=None, repr=False)

    @classmethod
    def from_totals(
        cls,
        totals: TraceTotals,
        device: TracedDevice,
        error: str = "",
        oom: OomReport | None = None,
        host_method: str = "",
        notes: list[str] | None = None,
    ) -> MemTrace:
        """The result of a traced cell; ``error`` ("ValueError: ...", "" when the cell
        completed) marks the statement that was open at the end as the failing one."""
        return cls(
            statements=list(totals.statements),
            device=device,
            hits=list(totals.hits),
            delta=list(totals.delta),
            peak=list(totals.peak),
            after=list(totals.after),
            reserved_after=list(totals.reserved_after),
            host_delta=list(totals.host_delta),
            host_peak=list(totals.host_peak),
            host_after=list(totals.host_after),
            time_ns=list(totals.time_ns),
            initial=totals.initial,
            final=totals.final,
            cell_peak=totals.cell_peak,
            final_reserved=totals.final_reserved,
            host_initial=totals.initial_host,
            host_final=totals.final_host,
            host_cell_peak=totals.host_cell_peak,
            elapsed_ns=totals.elapsed_ns,
            points=list(totals.timeline),
            categories=list(totals.categories),
            peak_categories=list(totals.peak_categories),
            peak_moment=totals.at_peak,
            approximate=list(totals.approximate),
            host_method=host_method,
            error_index=totals.failing if error else -1,
            error=error,
            oom=oom,
            notes=list(notes or []),
            synced=totals.sync_requested and device.kind == CUDA,
            sync_count=totals.syncs,
            sync_ns=totals.sync_ns,
        )

    # -- data ----------------------------------------------------------------------------------
    @property
    def has_categories(self) -> bool:
        """The tensor census ran: every row has its bytes by category."""
        return any(c is not None for c in self.categories)

    @property
    def at_peak(self) -> AtPeak | None:
        """What was alive at the cell's highest moment, by category and (activations) by
        module; None without the tensor census or when nothing was allocated."""
        return at_peak_of(self.peak_moment, self.statements, self.module_names)

    @property
    def timeline(self) -> pd.DataFrame:
        """Memory over the cell by category, one row per point and category (see
        :func:`gpumagic.memory.trace.timeline.timeline_frame`)."""
        return timeline_frame(self.points, self.statements)

    def export_memory_viz(self, path: str | Path) -> Path:
        """Write the cell's allocations and frees for PyTorch's memory visualiser: a
        ``.pickle`` for https://pytorch.org/memory_viz, or an ``.html`` page (see
        :mod:`gpumagic.memory.census.viz`). Needs the tensor census."""
        from gpumagic.memory.census.viz import memory_viz_snapshot, write_memory_viz

        if self.events is None:
            raise ValueError(
                "no tensor events to export: this trace ran without the tensor census "
                "(--no-tensors, or torch was not loaded)"
            )
        snapshot = memory_viz_snapshot(self.events, self.statements, self.module_names)
        return write_memory_viz(path, snapshot)

    @property
    def time_label(self) -> str:
        """What the ``time`` column measures: CUDA kernels run asynchronously, so without
        ``--sync`` a statement's time on a CUDA run is the host's (launching, not running,
        its kernels) and the next statement that waits for the GPU is charged its work."""
        if self.device.kind != CUDA:
            return "time"
        return "time (synced)" if self.synced else "host time"

    @property
    def time_note(self) -> str:
        """One sentence on the ``time`` column for CUDA runs ("" on the host)."""
        if self.device.kind != CUDA:
            return ""
        if not self.synced:
            return (
                "Host time: CUDA kernels run asynchronously, so a statement's time is what the "
                "host spent launching its work, and a later statement that waits for the GPU "
                "(.item(), print, a copy to the CPU) is charged for it; %%memtrace --sync "
                "times each statement's GPU work."
            )
        return (
            f"--sync: the device was synchronised at {fmt_count(self.sync_count)} statement "
            f"boundaries, so each time includes the GPU work its statement queued. The waits "
            f"took {fmt_us(self.sync_ns / 1000)} in all: the host no longer runs ahead of the "
            "GPU, so the cell runs up to that much longer than without --sync."
        )

    @property
    def net_change(self) -> int:
        return self.final - self.initial

    @property
    def peak_above_start(self) -> int:
        return self.cell_peak - self.initial

    @property
    def lines(self) -> pd.DataFrame:
        """One row per statement that ran (hits > 0), in the cell's order (see
        :mod:`gpumagic.memory.trace.lines`)."""
        if self._lines is None:
            measured = (
                self.hits,
                self.delta,
                self.peak,
                self.after,
                self.reserved_after,
                self.host_delta,
                self.host_peak,
                self.host_after,
            )
            self._lines = lines_frame(
                self.statements,
                dict(zip(MEASURED, measured)),
                self.time_ns,
                self.categories,
                self.error_index,
            )
        return self._lines

    @property
    def failed_line(self) -> int | None:
        """The cell's line whose statement raised (None when the cell completed)."""
        return self.statements[self.error_index].line if self.error_index >= 0 else None

    @property
    def heaviest(self) -> list[bool]:
        """Per row of :attr:`lines`: whether it is one of the heaviest statements (the
        largest peaks and allocations, when not trivial), the rows the table highlights."""
        hot = self._hot()
        return [s.index in hot for s in self._ran()]

    def _ran(self) -> list[Statement]:
        return [s for s in self.statements if self.hits[s.index] > 0]

    def _hot(self) -> set[int]:
        """The heaviest statements: largest peaks and largest allocations, if non-trivial."""
        floor = max(abs(self.peak_above_start) * 0.05, 1 << 20)
        by_peak = sorted(self._ran(), key=lambda s: -self.peak[s.index])[:HOT_ROWS]
        by_delta = sorted(self._ran(), key=lambda s: -self.delta[s.index])[:HOT_ROWS]
        hot = {s.index for s in by_peak if self.peak[s.index] >= floor}
        hot |= {s.index for s in by_delta if self.delta[s.index] >= floor}
        return hot

    def plot(self, ax: Any = None) -> Any:
        """Allocated memory over the statements as they ran (matplotlib), stacked by category
        when the tensor census ran (see :mod:`gpumagic.memory.trace.plot`). Returns the Axes."""
        title = f"%%memtrace: {self.device.label}"
        return plot_memory(self.points, self.statements, title, self.has_categories, ax)

    # -- display (gpumagic.render.memtrace) -------------------------------------------------------
    def _report(self) -> Report:
        from gpumagic.render.memtrace import memtrace_report

        return memtrace_report(self)
