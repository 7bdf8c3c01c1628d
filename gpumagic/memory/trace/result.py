"""The ``%%memtrace`` result: per-statement rows as a DataFrame, memory over time by
category, what was alive at the peak, a table, a chart, a memory-visualiser export."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpumagic.cell import Statement
from gpumagic.device_kinds import CUDA
from gpumagic.memory.census.categories import COLUMNS, NAMES
from gpumagic.memory.census.ledger import EventLog
from gpumagic.memory.trace.device import TracedDevice
from gpumagic.memory.trace.oom.model import OomReport
from gpumagic.memory.trace.timeline import AtPeak, at_peak_of, timeline_frame
from gpumagic.render.html import Rendered
from gpumagic.units import fmt_count, fmt_us

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.memory.trace.tracer import Categories, PeakMoment, Point, TraceTotals
    from gpumagic.render.sections import Report

LINE_COLUMNS = [
    "line",
    "source",
    "hits",
    "delta_bytes",
    "peak_bytes",
    "allocated_bytes",
    "reserved_bytes",
    "host_delta_bytes",
    "host_peak_bytes",
    "host_bytes",
    "time_us",
    "depth",
    "kind",
    "delta_per_hit_bytes",
]
# With it: every category (gpumagic.memory.census.categories), adding up to allocated_bytes.
CATEGORY_COLUMNS = list(COLUMNS)
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
        """One row per statement that ran (hits > 0), in the cell's order."""
        if self._lines is None:
            import pandas as pd

            rows = []
            for s in self.statements:
                i = s.index
                if self.hits[i] == 0:
                    continue
                row: dict[str, Any] = {
                    "line": s.line,
                    "source": s.source,
                    "hits": self.hits[i],
                    "delta_bytes": self.delta[i],
                    "peak_bytes": self.peak[i],
                    "allocated_bytes": self.after[i],
                    "reserved_bytes": self.reserved_after[i],
                    "host_delta_bytes": self.host_delta[i],
                    "host_peak_bytes": self.host_peak[i],
                    "host_bytes": self.host_after[i],
                    "time_us": self.time_ns[i] / 1000.0,
                    "depth": s.depth,
                    "kind": s.kind,
                    "delta_per_hit_bytes": round(self.delta[i] / self.hits[i]),
                }
                if self.has_categories:
                    cats = self.categories[i]
                    row.update(zip(CATEGORY_COLUMNS, cats or (None,) * len(CATEGORY_COLUMNS)))
                row["failed"] = i == self.error_index
                rows.append(row)
            extra = CATEGORY_COLUMNS if self.has_categories else []
            columns = LINE_COLUMNS + extra + ["failed"]
            df = pd.DataFrame(rows, columns=columns)
            for c in df.columns:
                if c.endswith("_bytes") and c not in extra:
                    df[c] = df[c].astype("int64")
            if self.has_categories and all(c is not None for c in self._ran_categories()):
                df[extra] = df[extra].astype("int64")
            self._lines = df
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

    def _ran_categories(self) -> list[Categories | None]:
        return [self.categories[s.index] for s in self._ran()]

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

    # -- plot ------------------------------------------------------------------------------------
    def plot(self, ax: Any = None) -> Any:
        """Allocated memory over the statements as they ran (matplotlib), stacked by category
        when the tensor census ran. Returns the Axes."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(8, 3))
        points = self.points
        xs = list(range(len(points)))
        cur = [p[1] / 2**20 for p in points]
        peaks = [p[3] / 2**20 for p in points]
        ax.step(xs, cur, where="post", label="allocated after statement", color="#3b7dd8")
        ax.plot(xs, peaks, ".", markersize=3, label="peak within statement", color="#f0ad4e")
        if self.has_categories:
            from gpumagic.render.memchart import CATEGORY_COLORS

            stacks = [
                [(p[4][c] if p[4] is not None else 0) / 2**20 for p in points]
                for c in range(len(NAMES))
            ]
            ax.stackplot(
                xs, *stacks, labels=NAMES, colors=CATEGORY_COLORS, alpha=0.5, step="post"
            )
        ax.set_xlabel("statement executions, in order")
        ax.set_ylabel("MiB")
        ax.set_title(f"%%memtrace: {self.device.label}")
        lines_by_index = {s.index: s.line for s in self.statements}
        top = sorted(range(1, len(points)), key=lambda k: -points[k][3])[:3]
        for k in top:
            idx = points[k][2]
            if idx in lines_by_index:
                ax.annotate(
                    f"line {lines_by_index[idx]}",
                    (k, peaks[k]),
                    fontsize=8,
                    textcoords="offset points",
                    xytext=(2, 4),
                )
        ax.legend(loc="best", fontsize=7)
        return ax

    # -- display (gpumagic.render.memtrace) -------------------------------------------------------
    def _report(self) -> Report:
        from gpumagic.render.memtrace import memtrace_report

        return memtrace_report(self)
