"""``%gpuwatch --prometheus`` on screen: a job's GPUs, grouped by node, with the cells.

Built from a :class:`~gpumagic.monitor.job_stats.JobSnapshot`, as HTML with inline SVG
(the live frame is rebuilt once per sample) and as text. Up to :data:`CHARTS_UP_TO` GPUs
each get a chart of utilisation (with SM and tensor activity where DCGM exports them)
under its node's heading; past that, a job with 64 or 512 GPUs would be a wall of charts,
so each node becomes one row of tiles, one per GPU, coloured by utilisation, under one
chart of the job's median and idlest GPU. Stragglers and XID errors head the frame;
cells are shaded where they ran, and the last ones are listed with their job-wide
utilisation, energy and cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from gpumagic.monitor import dcgm
from gpumagic.monitor.job_result import latest_values
from gpumagic.monitor.job_stats import STRAGGLER_SPAN_S, cell_cost, cell_stats
from gpumagic.render.html import PALETTE, Rendered, escape, wrap
from gpumagic.render.sections import (
    Details,
    Figure,
    Heading,
    KeyValues,
    Paragraph,
    Report,
    Section,
    only,
)
from gpumagic.render.svg import Band, Chart, Series, render_small_multiples
from gpumagic.render.table import Column, Table
from gpumagic.units import (
    fmt_celsius,
    fmt_clock,
    fmt_percent,
    fmt_seconds,
    fmt_usd,
    fmt_watts,
    fmt_wh,
)

if TYPE_CHECKING:
    from gpumagic.monitor.cells import CellRecord
    from gpumagic.monitor.job import JobWatcher
    from gpumagic.monitor.job_result import JobResult, JobStatus
    from gpumagic.monitor.job_stats import JobSnapshot

CHARTS_UP_TO = 16
CHART_W, CHART_H = 232, 84
MAX_POINTS = CHART_W - 52  # the plot's width in pixels (see watch.py)
CELLS_SHOWN = 8
_CELL_BAND = "rgba(59, 125, 216, 0.10)"
_RUNNING_BAND = "rgba(240, 173, 78, 0.22)"
_FAILED_BAND = "rgba(217, 83, 79, 0.14)"
_U = dcgm.FIELD_INDEX


_seconds = fmt_seconds
_clock = fmt_clock


def _mib(v: float) -> str:
    return "–" if math.isnan(v) else (f"{v / 1024:.1f} GiB" if v >= 1024 else f"{v:.0f} MiB")


def _gib_pair(used: float, total: float) -> str:
    """``60/79 GiB``: framebuffer used of the total, in whole GiB (DCGM counts MiB)."""
    if math.isnan(used):
        return "–"
    if math.isnan(total):
        return f"{used / 1024:.0f} GiB"
    return f"{used / 1024:.0f}/{total / 1024:.0f} GiB"


def _cell_name(cell: CellRecord) -> str:
    return f"[{cell.execution_count}]" if cell.execution_count is not None else "[ ]"


def _decimate(x: np.ndarray, y: np.ndarray) -> tuple[list[float], list[float | None]]:
    """At most MAX_POINTS points, each bucket keeping its maximum (a spike stays visible)."""
    if len(x) > MAX_POINTS:
        edges = np.linspace(0, len(x), MAX_POINTS + 1).astype(int)[:-1]
        x = x[edges]
        y = np.fmax.reduceat(y, edges)
    return x.tolist(), [None if v != v else v for v in y.tolist()]


def _series(name: str, x: np.ndarray, y: np.ndarray, color: str, fill: bool = False) -> Series:
    xs, ys = _decimate(x, y)
    return Series(name, xs, ys, color=color, fill=fill)


# -- the frame's parts -------------------------------------------------------------------
def _axis(snap: JobSnapshot, live: bool) -> tuple[float, float, float, str]:
    """(origin, x_lo, x_hi, caption): seconds before now (live) or since the first sample."""
    if live:
        seen = snap.now - float(snap.times[0]) if len(snap.times) else 0.0
        span = min(snap.window, max(seen, 10 * snap.interval, 5.0))
        return snap.now, -span, 0.0, f"last {_seconds(span)}"
    origin = float(snap.times[0]) if len(snap.times) else snap.now
    hi = max((float(snap.times[-1]) - origin) if len(snap.times) else 0.0, snap.interval)
    return origin, 0.0, hi, f"{_seconds(hi)} from {_clock(origin)}"


def _bands(snap: JobSnapshot, origin: float, lo: float, hi: float) -> list[Band]:
    out = []
    for cell in snap.cells:
        end = cell.end if cell.end is not None else snap.now
        x0, x1 = cell.start - origin, end - origin
        if x1 < lo or x0 > hi:
            continue
        color = (
            _RUNNING_BAND
            if cell.end is None
            else (_FAILED_BAND if cell.success is False else _CELL_BAND)
        )
        label = f"{_cell_name(cell)} {cell.source} ({_seconds(cell.duration(snap.now))})"
        out.append(Band(x0, max(x1, x0 + (hi - lo) / 400), label, color))
    return out


def _gpu_charts(snap: JobSnapshot, live: bool) -> str:
    origin, lo, hi, caption = _axis(snap, live)
    bands = _bands(snap, origin, lo, hi)
    x = snap.times - origin
    latest = latest_values(snap)
    slow = {a.device for a in snap.alerts if a.kind == "straggler"}
    parts = []
    for host in snap.hosts:
        rows = [i for i, g in enumerate(snap.gpus) if g.host == host]
        models = sorted({snap.gpus[i].model for i in rows if snap.gpus[i].model})
        parts.append(
            f"<div><b>{escape(host)}</b> <span class='gm-sub'>{len(rows)} GPU(s)"
            f"{' · ' + escape(', '.join(models)) if models else ''}</span></div>"
        )
        charts = []
        for i in rows:
            g = snap.gpus[i]
            v = snap.values[:, i, :]
            now = latest[i]
            total = now[_U[dcgm.FB_USED]] + now[_U[dcgm.FB_FREE]]
            # short enough for the chart's width; the table and .gpus have the rest
            title = (
                f"GPU {g.gpu}{' ⚠' if g.label in slow else ''} {fmt_percent(now[_U[dcgm.UTIL]])} · "
                f"{_gib_pair(now[_U[dcgm.FB_USED]], total)} · {fmt_watts(now[_U[dcgm.POWER]])}"
            )
            series = [_series("util", x, v[:, _U[dcgm.UTIL]], PALETTE["accent"], fill=True)]
            for name, color in (
                (dcgm.SM_ACTIVE, PALETTE["peak"]),
                (dcgm.TENSOR_ACTIVE, PALETTE["free"]),
            ):
                ratio = v[:, _U[name]]
                if not np.isnan(ratio).all():
                    series.append(_series(name, x, ratio * 100.0, color))
            charts.append(
                Chart(
                    series,
                    width=CHART_W,
                    height=CHART_H,
                    title=title,
                    y_label=caption,
                    x_min=lo,
                    x_max=hi,
                    y_max=100.0,
                    bands=bands,
                    y_format=lambda p: f"{p:.0f}%",
                )
            )
        for k in range(0, len(charts), 4):
            parts.append(render_small_multiples(charts[k : k + 4]))
    shown = [
        what
        for field, what in (
            (dcgm.SM_ACTIVE, "SM active (orange)"),
            (dcgm.TENSOR_ACTIVE, "tensor pipe active (green)"),
        )
        if snap.has(field)
    ]
    legend = "utilisation (filled)" + (f", {', '.join(shown)}, as % of cycles" if shown else "")
    parts.append(f"<div class='gm-note'>{escape(legend)}</div>")
    return "".join(parts)


def _tile(util: float, label: str, slow: bool) -> str:
    if math.isnan(util):
        color, text = "rgba(128,128,128,0.25)", "–"
    else:
        # light to dark blue with utilisation; stragglers outlined in red
        color = f"rgba(59, 125, 216, {0.12 + 0.8 * min(max(util, 0.0), 100.0) / 100:.2f})"
        text = f"{util:.0f}"
    border = "2px solid #d9534f" if slow else "1px solid rgba(128,128,128,0.3)"
    return (
        f'<span title="{escape(label)}" style="display:inline-block;width:26px;height:18px;'
        f"margin:1px;text-align:center;font-size:10px;line-height:18px;background:{color};"
        f'border:{border}">{text}</span>'
    )


def _compact(snap: JobSnapshot, live: bool) -> str:
    """Past CHARTS_UP_TO GPUs: one chart of the job's median and idlest GPU, tiles per node."""
    origin, lo, hi, caption = _axis(snap, live)
    util = snap.field(dcgm.UTIL)
    x = snap.times - origin
    has = ~np.isnan(util).all(axis=1)
    median = np.full(len(x), np.nan)
    idlest = np.full(len(x), np.nan)
    if has.any():
        median[has] = np.nanmedian(util[has], axis=1)
        idlest[has] = np.nanmin(util[has], axis=1)
    chart = Chart(
        [
            _series("median GPU", x, median, PALETTE["accent"], fill=True),
            _series("idlest GPU", x, idlest, PALETTE["alloc"]),
        ],
        width=2 * CHART_W + 6,
        height=CHART_H + 36,
        title=f"{len(snap.gpus)} GPUs: median (filled) and idlest GPU utilisation",
        y_label=caption,
        x_min=lo,
        x_max=hi,
        y_max=100.0,
        bands=_bands(snap, origin, lo, hi),
        y_format=lambda p: f"{p:.0f}%",
    )
    latest = latest_values(snap)[:, _U[dcgm.UTIL]]
    slow = {a.device for a in snap.alerts if a.kind == "straggler"}
    rows = []
    for host in snap.hosts:
        tiles = "".join(
            _tile(float(latest[i]), f"{g.label}: {fmt_percent(float(latest[i]))}", g.label in slow)
            for i, g in enumerate(snap.gpus)
            if g.host == host
        )
        rows.append(
            f"<div style='white-space:nowrap'><span style='display:inline-block;min-width:9em'>"
            f"{escape(host)}</span>{tiles}</div>"
        )
    return render_small_multiples([chart]) + "".join(rows)


def _subtitle(snap: JobSnapshot, live: bool) -> str:
    parts = [f"Prometheus {snap.url}"]
    if snap.selector:
        parts.append("{" + snap.selector + "}")
    parts.append(f"{len(snap.gpus)} GPUs on {len(snap.hosts)} node(s)")
    parts.append(f"every {_seconds(snap.interval)}")
    if live and not snap.running:
        parts.append("stopped")
    parts.append(f"{snap.polls} polls")
    if snap.log_path:
        parts.append(f"log: {snap.log_path}")
    return " · ".join(parts)


def _totals(snap: JobSnapshot) -> KeyValues:
    items = [("watched", _seconds(max(snap.now - snap.started, 0.0)))]
    if not math.isnan(snap.energy_wh):
        items.append(("job energy", fmt_wh(snap.energy_wh)))
    if snap.price is not None:
        items.append(
            (
                "job cost",
                f"{fmt_usd(snap.cost_usd)} ({len(snap.gpus)} GPUs × ${snap.price:g}/GPU-h)",
            )
        )
    return KeyValues(items, inline="")


def _alerts(snap: JobSnapshot) -> list[Section]:
    return [Paragraph(f"⚠ {a.message}", "box") for a in snap.alerts]


def _notes(notes: Sequence[str]) -> list[Section]:
    if not notes:
        return []
    lines = [Paragraph(n, "plain", prefix="note: ") for n in notes]
    return [Details(f"{len(notes)} note(s)", lines, css="gm-note")]


def _charts(snap: JobSnapshot, live: bool) -> Section:
    """The charts (HTML only: the GPU table holds the text form's numbers)."""

    def draw() -> str:
        if not len(snap.times):
            return '<div class="gm-note">no sample yet</div>'
        if len(snap.gpus) <= CHARTS_UP_TO:
            return _gpu_charts(snap, live)
        return _compact(snap, live)

    return only("html", Figure(draw))


# -- tables --------------------------------------------------------------------------------
def _gpu_rows(snap: JobSnapshot) -> list[dict[str, object]]:
    latest = latest_values(snap)
    slow = {a.device for a in snap.alerts if a.kind == "straggler"}
    rows = []
    for i, g in enumerate(snap.gpus):
        now = latest[i]
        rows.append(
            {
                "node": g.host,
                "gpu": g.gpu,
                "model": g.model,
                "util": now[_U[dcgm.UTIL]],
                "straggler": g.label in slow,
                "used": now[_U[dcgm.FB_USED]],
                "total": now[_U[dcgm.FB_USED]] + now[_U[dcgm.FB_FREE]],
                "power": now[_U[dcgm.POWER]],
                "temp": now[_U[dcgm.TEMP]],
                "sm": 100 * now[_U[dcgm.SM_ACTIVE]],
                "tensor": 100 * now[_U[dcgm.TENSOR_ACTIVE]],
            }
        )
    return rows


_GPU_COLUMNS = [
    Column("node", "node", align="left"),
    Column("gpu", "gpu", align="left"),
    Column("model", "model", align="left"),
    Column("util", lambda r: fmt_percent(r["util"]) + (" straggler" if r["straggler"] else "")),
    Column("memory", lambda r: f"{_mib(r['used'])} / {_mib(r['total'])}"),
    Column("power", "power", fmt_watts),
    Column("temp", "temp", fmt_celsius),
    Column("SM active", "sm", fmt_percent),
    Column("tensor", "tensor", fmt_percent),
]


def _gpu_table(snap: JobSnapshot, shown: int = CHARTS_UP_TO) -> list[Section]:
    rows = _gpu_rows(snap)
    # the profiling columns only where the exporter publishes them
    absent = {
        key
        for key, field in (("sm", dcgm.SM_ACTIVE), ("tensor", dcgm.TENSOR_ACTIVE))
        if not snap.has(field)
    }
    columns = [c for c in _GPU_COLUMNS if c.value not in absent]
    out: list[Section] = [
        Table(columns, rows[:shown], highlight=lambda r: "hot" if r["straggler"] else "")
    ]
    if len(rows) > shown:
        out.append(Paragraph(f"... {len(rows) - shown} more GPUs (.gpus has them all)"))
    return out


def _cells(snap: JobSnapshot, shown: int = CELLS_SHOWN) -> list[Section]:
    cells = snap.cells[-shown:]
    if not cells:
        return []
    rows = []
    for cell in cells:
        stats = cell_stats(snap, cell)
        rows.append(
            {
                "cell": _cell_name(cell) + ("" if cell.end is not None else " running"),
                "source": cell.source,
                "time": cell.duration(snap.now),
                "util": stats.mean_utilization,
                "idlest": stats.min_gpu_utilization,
                "stragglers": ", ".join(stats.stragglers) or "–",
                "energy": math.nan if dcgm.ENERGY in snap.missing else cell.energy_mj / 3.6e6,
                "cost": cell_cost(snap, cell),
            }
        )
    columns = [
        Column("cell", "cell", align="left"),
        Column("source", "source", align="code", html_chars=60),
        Column("time", "time", fmt_seconds),
        Column("job util", "util", fmt_percent),
        Column("idlest GPU", "idlest", fmt_percent),
        Column("stragglers", "stragglers", align="left"),
        Column("energy", "energy", fmt_wh),
        Column("cost", "cost", fmt_usd),
    ]
    return [Heading("Cells", "job-wide"), Table(columns, rows)]


# -- public --------------------------------------------------------------------------------
def live_report(snap: JobSnapshot) -> Report:
    sections: list[Section] = [
        *_alerts(snap),
        _totals(snap),
        _charts(snap, live=True),
        *_cells(snap),
        *_notes(snap.notes),
    ]
    return Report("watch-job", "gpuwatch · job", _subtitle(snap, live=True), sections)


def live_html(snap: JobSnapshot) -> str:
    return live_report(snap).html(style=False)


class JobLiveFrame:
    """LiveView callback: the live frame of ``watcher``, rebuilt only when a sample came in."""

    def __init__(self, watcher: JobWatcher) -> None:
        self.watcher = watcher
        self._cached: tuple[int, bool, str] | None = None

    def __call__(self) -> str:
        seq, running = self.watcher.seq, self.watcher.running
        cached = self._cached
        if cached is not None and cached[:2] == (seq, running):
            return cached[2]
        html = live_html(self.watcher.snapshot())
        self._cached = (seq, running, html)
        return html


def status_report(status: JobStatus) -> Report:
    snap = status.snapshot
    sections: list[Section] = [
        *_alerts(snap),
        _totals(snap),
        *_gpu_table(snap),
        *_cells(snap),
        *_notes(snap.notes),
    ]
    return Report("watch-job-status", "gpuwatch status · job", _subtitle(snap, False), sections)


def status_text(status: JobStatus) -> str:
    return status_report(status).text()


def status_html(status: JobStatus) -> str:
    return status_report(status).html(style=False)


def result_report(result: JobResult) -> Report:
    snap = result.snapshot
    slow = result.stragglers
    window: list[Section] = []
    if not slow.empty:
        named = ", ".join(
            f"{r.Hostname} GPU {r.gpu} {fmt_percent(r.utilization)} (median {fmt_percent(r.job_median)})"
            for r in slow.itertuples()
        )
        window.append(
            Paragraph(f"Stragglers over the window ({_seconds(snap.window)}): {named}", "box")
        )
    sections: list[Section] = [
        *_alerts(snap),
        *window,
        _totals(snap),
        _charts(snap, live=False),
        *_gpu_table(snap),
        *_cells(snap),
        *_notes(snap.notes),
        Paragraph(
            ".series, .gpus, .cells, .stragglers, .xid_errors; the alerts on top are over the "
            f"last {STRAGGLER_SPAN_S:.0f} s"
        ),
    ]
    return Report("watch-job-summary", "gpuwatch summary · job", _subtitle(snap, False), sections)


def result_text(result: JobResult) -> str:
    return result_report(result).text()


def result_html(result: JobResult) -> str:
    return result_report(result).html(style=False)


class JobStoppedNote(Rendered):
    """What the live slot shows once the job watcher stops: one line (the summary is in the
    cell that stopped it)."""

    def __init__(self, result: JobResult, started: float, stopped: float) -> None:
        self.line = (
            f"gpuwatch (job, {len(result.snapshot.gpus)} GPUs) stopped at {_clock(stopped)} after "
            f"{_seconds(max(stopped - started, 0.0))}; the summary is where it was stopped"
        ) + (f"; CSV log: {result.log}" if result.log else "")

    def _text(self) -> str:
        return self.line

    def _html(self) -> str:
        return wrap("watch-job", f'<div class="gm-note">{escape(self.line)}</div>')
