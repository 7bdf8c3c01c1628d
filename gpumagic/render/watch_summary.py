"""``%gpuwatch stop``: the summary of a whole watch of this machine (the charts from the
first sample to the last, a row per cell that ran with its peaks, the clock-event reasons
that held its GPUs, energy and cost, the alerts seen, the bill, who was on the GPUs at the
stop) and, for any watch, the one line the live slot keeps."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpumagic.clock_events import BY_NAME
from gpumagic.device_kinds import CUDA
from gpumagic.monitor.alerts import cell_note
from gpumagic.monitor.machine import utilization_of
from gpumagic.render import watch_panel as panel
from gpumagic.render.html import NOTE_STYLE, Rendered, escape, wrap
from gpumagic.render.sections import Figure, Paragraph, Report, Section
from gpumagic.render.table import Column, Table
from gpumagic.render.watch_chart import chart_block, chart_lines
from gpumagic.render.watch_panel import cell_name
from gpumagic.units import fmt_bytes, fmt_clock, fmt_percent, fmt_seconds, fmt_us, fmt_usd, fmt_wh

if TYPE_CHECKING:
    from gpumagic.monitor.cells import CellRecord
    from gpumagic.monitor.result import WatchResult

LOW_USE_ADVICE = (
    "GPU busy under 30% on average while holding memory: likely waiting on data or the "
    "host; profile one with %%gpuprofile"
)
_CELLS_NAMED = 6  # cells a clock-event line names before "and N more cells"


def _cell_flag(cell: CellRecord) -> str:
    """A word for the table; the advice behind it is spelled out once below the table."""
    flags = []
    if cell.success is False:
        flags.append("failed")
    if cell_note(cell):
        flags.append("low GPU use")
    return ", ".join(flags)


def _sampled(header: str, value: Callable[[CellRecord], str], first: bool = False) -> Column:
    """A column of a cell's peaks: "no sample" in the first such column of a cell that
    ended before the sampler saw it, blank in the others."""
    blank = "no sample" if first else ""
    return Column(header, lambda c: value(c) if c.samples else blank)


def _cells_table(result: WatchResult) -> Table:
    snap = result.snapshot
    several = sum(d.kind == CUDA for d in snap.devices) > 1

    def peak_util(c: CellRecord) -> str:
        # on a box of several GPUs, say whose utilisation it is (this process's GPUs)
        own = utilization_of(c) if c.utilization_devices and several else ""
        return fmt_percent(c.peak_utilization) + (f" ({own})" if own else "")

    def held(c: CellRecord) -> str:
        shares = c.clock_event_shares()
        if shares is None:
            return "–"  # NVML read no reasons: nothing to say, not "none"
        return ", ".join(
            f"{key} {BY_NAME[name].label} {fmt_percent(100.0 * share)}"
            if several
            else f"{BY_NAME[name].label} {fmt_percent(100.0 * share)}"
            for key, reasons in shares.items()
            for name, share in _by_bit(reasons)
        )

    columns = [
        Column("cell", cell_name, align="left"),
        Column("source", "source", align="code"),
        Column("start", lambda c: fmt_clock(c.start)),
        Column("duration", lambda c: fmt_seconds(c.duration(snap.now))),
    ]
    if result.has_gpus:
        columns += [
            _sampled("peak util", peak_util, first=True),
            _sampled("mean util", lambda c: fmt_percent(c.mean_utilization)),
            _sampled("peak memory", lambda c: fmt_bytes(c.peak_memory)),
            _sampled("this kernel", lambda c: fmt_bytes(c.peak_process_memory)),
            Column("energy", lambda c: fmt_wh(c.energy_mj / 3.6e6)),
        ]
        # the column only where it says something: most watches never see a GPU held
        if any(c.clock_event_shares() for c in snap.cells):
            columns.insert(-1, _sampled("clocks held by", held))
    else:
        columns += [
            _sampled("peak CPU", lambda c: fmt_percent(c.peak_host_cpu), first=True),
            _sampled("peak RAM", lambda c: fmt_bytes(c.peak_host_memory)),
        ]
    cost = snap.cost
    if cost is not None and cost.price is not None:
        columns.append(Column("cost", lambda c: fmt_usd(cost.usd(c.duration(snap.now)))))
    columns.append(Column("", _cell_flag, align="left"))

    def highlight(c: CellRecord) -> str:
        return "error" if c.success is False else ("hot" if cell_note(c) else "")

    return Table(columns, snap.cells, highlight=highlight)


def _cell_advice(result: WatchResult) -> list[Section]:
    low = [c for c in result.snapshot.cells if cell_note(c)]
    if not low:
        return []
    names = ", ".join(cell_name(c) for c in low)
    return [Paragraph(f"{names}: {cell_note(low[0]) if len(low) == 1 else LOW_USE_ADVICE}", "info")]


def _by_bit(reasons: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(reasons.items(), key=lambda item: BY_NAME[item[0]].bit)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _clock_advice(result: WatchResult) -> list[Section]:
    """A line per GPU and clock-event reason that held it during cells, with the share of each
    cell: "GPU 0 was held by its power cap during 72% of cell In[5]: see %gpucheck"."""
    snap = result.snapshot
    held: dict[tuple[str, str], list[tuple[int, float]]] = {}  # (GPU, reason) -> (cell, share)
    for i, cell in enumerate(snap.cells):
        for key, reasons in (cell.clock_event_shares() or {}).items():
            for name, share in reasons.items():
                held.setdefault((key, name), []).append((i, share))
    # Reasons the driver asserts together (HW slowdown with the thermal slowdown or power
    # brake that engaged it, nvml.h) held a GPU in the same cells for the same shares: one line.
    together: dict[tuple[str, tuple[tuple[int, float], ...]], list[str]] = {}
    for (key, name), spans in held.items():
        together.setdefault((key, tuple(spans)), []).append(name)
    rows = {d.key: i for i, d in enumerate(snap.devices)}
    labels = {d.key: d.label for d in snap.devices}

    def order(item: tuple[tuple[str, object], list[str]]) -> tuple[int, int]:
        (key, _), names = item
        return (rows.get(key, len(rows)), min(BY_NAME[n].bit for n in names))

    out: list[Section] = []
    for (key, held_in), names in sorted(together.items(), key=order):
        ordered = sorted(names, key=lambda n: BY_NAME[n].bit)
        how = _and(list(dict.fromkeys(BY_NAME[n].held for n in ordered)))  # heat, said once
        during = [
            f"{fmt_percent(100.0 * share)} of cell In{cell_name(snap.cells[i])}"
            for i, share in held_in
        ]
        if len(during) > _CELLS_NAMED:
            during = [*during[: _CELLS_NAMED - 1], f"{len(during) - _CELLS_NAMED + 1} more cells"]
        text = f"{labels.get(key, key)} was {how} during {_and(during)}: see %gpucheck"
        out.append(Paragraph(text, "info", css="gm-clock-events"))
    return out


def _seen_alerts(result: WatchResult) -> list[str]:
    out = []
    for alert, last, count in result.alerts:
        span = f"{fmt_clock(alert.since)}–{fmt_clock(last)}" if count > 1 else fmt_clock(alert.since)
        out.append(f"{alert.message} ({span}, {count} sample{'s' if count != 1 else ''})")
    return out


def _summary_line(result: WatchResult) -> str:
    snap = result.snapshot
    span = float(snap.times[-1] - snap.times[0]) if len(snap.times) > 1 else 0.0
    gpus = sum(1 for d in snap.devices if d.kind == CUDA)
    what = f"{gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "host only"
    cpu = result.sample_cpu_mean_s
    cost = f" · {fmt_us(cpu * 1e6)} CPU per sample" if not math.isnan(cpu) else ""
    return f"{what} · {fmt_seconds(span)} shown · {panel.subtitle(snap, live=False)}{cost}"


def result_report(result: WatchResult) -> Report:
    """The summary of a stopped watch."""
    snap = result.snapshot
    sections: list[Section] = [
        *panel.reason(snap),
        *panel.alerts(_seen_alerts(result)),
        Figure(lambda: chart_block(snap, live=False), lambda: chart_lines(snap, live=False)),
    ]
    if snap.cells:
        sections += [_cells_table(result), *_cell_advice(result), *_clock_advice(result)]
    else:
        sections.append(Paragraph("no cell ran while watching"))
    sections += [
        *panel.cost(snap.cost, so_far=False),
        *panel.processes(snap.processes, at_stop=True),
    ]
    if result.log:
        sections.append(Paragraph(f"CSV log: {result.log}"))
    sections += panel.notes(snap.notes)
    return Report("watch-result", "gpuwatch summary", _summary_line(result), sections)


class StoppedNote(Rendered):
    """What the live slot shows once the watcher stops: one line, the summary being in the
    cell that stopped it (a second copy of the charts here would only repeat them)."""

    def __init__(self, result: WatchResult, started: float, stopped: float) -> None:
        self.started, self.stopped = started, stopped
        self.log = result.log
        snap = result.snapshot
        # a job's: how many GPUs on how many nodes (this machine's are in the summary)
        gpus = len(snap.gpu_rows)
        self.what = f" ({gpus} GPUs on {len(snap.hosts)} node(s))" if snap.hosts else ""

    def _line(self) -> str:
        span = fmt_seconds(max(self.stopped - self.started, 0.0))
        line = (
            f"gpuwatch{self.what} stopped at {fmt_clock(self.stopped)} after {span}; "
            "the summary is where it was stopped"
        )
        return line + (f"; CSV log: {self.log}" if self.log else "")

    def _text(self) -> str:
        return self._line()

    def _html(self) -> str:
        note = f'<div class="gm-note" style="{NOTE_STYLE}">{escape(self._line())}</div>'
        return wrap("watch-stopped", note)
