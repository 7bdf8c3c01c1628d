"""``%gpuwatch --prometheus`` on screen: a job's GPUs, grouped by node, with the cells.

Built from a :class:`~gpumagic.monitor.snapshot.Snapshot` of a job's layout (DCGM's fields,
GPUs labelled by node), as HTML with SVG charts (the live frame is rebuilt once per sample)
and as text; ``watch_views.py`` picks these reports for a job's watch. Up to :data:`CHARTS_UP_TO` GPUs
each get a chart of utilisation (with SM and tensor activity where DCGM exports them)
under its node's heading; past that, a job with 64 or 512 GPUs would be a wall of charts,
so each node becomes one row of tiles, one per GPU, coloured by utilisation, under one
chart of the job's median and idlest GPU. Stragglers and XID errors head the frame;
cells are shaded where they ran, and the last ones are listed with their job-wide
utilisation, energy and cost.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from gpumagic.monitor.job import dcgm
from gpumagic.monitor.job.stats import STRAGGLER_SPAN_S, cell_stats
from gpumagic.render import watch_panel as panel
from gpumagic.render.html import PALETTE, escape
from gpumagic.render.sections import Figure, Heading, KeyValues, Paragraph, Report, Section, only
from gpumagic.render.svg import Chart, render_small_multiples
from gpumagic.render.table import Column, Table
from gpumagic.render.watch_chart import CHART_H, CHART_W, axis, bands, series
from gpumagic.units import fmt_celsius, fmt_percent, fmt_seconds, fmt_usd, fmt_watts, fmt_wh

if TYPE_CHECKING:
    from gpumagic.monitor.result import WatchResult, WatchStatus
    from gpumagic.monitor.snapshot import Snapshot

CHARTS_UP_TO = 16
CELLS_SHOWN = 8
_U = dcgm.FIELD_INDEX


def _mib(v: float) -> str:
    return "–" if math.isnan(v) else (f"{v / 1024:.1f} GiB" if v >= 1024 else f"{v:.0f} MiB")


def _gib_pair(used: float, total: float) -> str:
    """``60/79 GiB``: framebuffer used of the total, in whole GiB (DCGM counts MiB)."""
    if math.isnan(used):
        return "–"
    if math.isnan(total):
        return f"{used / 1024:.0f} GiB"
    return f"{used / 1024:.0f}/{total / 1024:.0f} GiB"


# -- the frame's parts -------------------------------------------------------------------
def _gpu_charts(snap: Snapshot, live: bool) -> str:
    origin, lo, hi, caption = axis(snap, live)
    shaded = bands(snap.cells, origin, lo, hi, snap.now)
    x = snap.times - origin
    latest = snap.latest()
    slow = {a.device for a in snap.alerts if a.kind == "straggler"}
    parts = []
    for host in snap.hosts:
        rows = [i for i, g in enumerate(snap.devices) if g.host == host]
        models = sorted({snap.devices[i].name for i in rows if snap.devices[i].name})
        parts.append(
            f"<div><b>{escape(host)}</b> <span class='gm-sub'>{len(rows)} GPU(s)"
            f"{' · ' + escape(', '.join(models)) if models else ''}</span></div>"
        )
        charts = []
        for i in rows:
            g = snap.devices[i]
            v = snap.values[:, i, :]
            now = latest[i]
            total = now[_U[dcgm.FB_USED]] + now[_U[dcgm.FB_FREE]]
            # short enough for the chart's width; the table and .gpus have the rest
            title = (
                f"GPU {g.node_index}{' ⚠' if g.label in slow else ''} "
                f"{fmt_percent(now[_U[dcgm.UTIL]])} · "
                f"{_gib_pair(now[_U[dcgm.FB_USED]], total)} · {fmt_watts(now[_U[dcgm.POWER]])}"
            )
            lines = [series("util", x, v[:, _U[dcgm.UTIL]], PALETTE["accent"], fill=True)]
            for name, color in (
                (dcgm.SM_ACTIVE, PALETTE["peak"]),
                (dcgm.TENSOR_ACTIVE, PALETTE["free"]),
            ):
                ratio = v[:, _U[name]]
                if not np.isnan(ratio).all():
                    lines.append(series(name, x, ratio * 100.0, color))
            charts.append(
                Chart(
                    lines,
                    width=CHART_W,
                    height=CHART_H,
                    title=title,
                    y_label=caption,
                    x_min=lo,
                    x_max=hi,
                    y_max=100.0,
                    bands=shaded,
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


def _compact(snap: Snapshot, live: bool) -> str:
    """Past CHARTS_UP_TO GPUs: one chart of the job's median and idlest GPU, tiles per node."""
    origin, lo, hi, caption = axis(snap, live)
    util = snap.column(dcgm.UTIL)
    x = snap.times - origin
    has = ~np.isnan(util).all(axis=1)
    median = np.full(len(x), np.nan)
    idlest = np.full(len(x), np.nan)
    if has.any():
        median[has] = np.nanmedian(util[has], axis=1)
        idlest[has] = np.nanmin(util[has], axis=1)
    chart = Chart(
        [
            series("median GPU", x, median, PALETTE["accent"], fill=True),
            series("idlest GPU", x, idlest, PALETTE["alloc"]),
        ],
        width=2 * CHART_W + 6,
        height=CHART_H + 36,
        title=f"{len(snap.devices)} GPUs: median (filled) and idlest GPU utilisation",
        y_label=caption,
        x_min=lo,
        x_max=hi,
        y_max=100.0,
        bands=bands(snap.cells, origin, lo, hi, snap.now),
        y_format=lambda p: f"{p:.0f}%",
    )
    latest = snap.latest()[:, _U[dcgm.UTIL]]
    slow = {a.device for a in snap.alerts if a.kind == "straggler"}
    rows = []
    for host in snap.hosts:
        tiles = "".join(
            _tile(float(latest[i]), f"{g.label}: {fmt_percent(float(latest[i]))}", g.label in slow)
            for i, g in enumerate(snap.devices)
            if g.host == host
        )
        rows.append(
            f"<div style='white-space:nowrap'><span style='display:inline-block;min-width:9em'>"
            f"{escape(host)}</span>{tiles}</div>"
        )
    return render_small_multiples([chart]) + "".join(rows)


def _subtitle(snap: Snapshot, live: bool) -> str:
    parts = [snap.origin, f"{len(snap.devices)} GPUs on {len(snap.hosts)} node(s)"]
    parts.append(f"every {fmt_seconds(snap.interval)}")
    if live and not snap.running:
        parts.append("stopped")
    parts.append(f"{snap.samples_taken} polls")
    if snap.log_path:
        parts.append(f"log: {snap.log_path}")
    return " · ".join(parts)


def _totals(snap: Snapshot) -> KeyValues:
    cost = snap.cost
    if cost is None:
        return KeyValues([], inline="")
    items = [("watched", fmt_seconds(cost.metered_s))]
    if not math.isnan(cost.energy_wh):
        items.append(("job energy", fmt_wh(cost.energy_wh)))
    if cost.price is not None:
        items.append(
            (
                "job cost",
                f"{fmt_usd(cost.total_usd)} ({cost.units} GPUs × ${cost.price:g}/GPU-h)",
            )
        )
    return KeyValues(items, inline="")


def _charts(snap: Snapshot, live: bool) -> Section:
    """The charts (HTML only: the GPU table holds the text form's numbers)."""

    def draw() -> str:
        if not len(snap.times):
            return '<div class="gm-note">no sample yet</div>'
        if len(snap.devices) <= CHARTS_UP_TO:
            return _gpu_charts(snap, live)
        return _compact(snap, live)

    return only("html", Figure(draw))


# -- tables --------------------------------------------------------------------------------
def _gpu_rows(snap: Snapshot) -> list[dict[str, object]]:
    latest = snap.latest()
    slow = {a.device for a in snap.alerts if a.kind == "straggler"}
    rows = []
    for i, g in enumerate(snap.devices):
        now = latest[i]
        rows.append(
            {
                "node": g.host,
                "gpu": g.node_index,
                "model": g.name,
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


def _gpu_table(snap: Snapshot, shown: int = CHARTS_UP_TO) -> list[Section]:
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


def _cells(snap: Snapshot, shown: int = CELLS_SHOWN) -> list[Section]:
    cells = snap.cells[-shown:]
    if not cells:
        return []
    rows = []
    for cell in cells:
        stats = cell_stats(snap, cell)
        rows.append(
            {
                "cell": panel.cell_name(cell) + ("" if cell.end is not None else " running"),
                "source": cell.source,
                "time": cell.duration(snap.now),
                "util": stats.mean_utilization,
                "idlest": stats.min_gpu_utilization,
                "stragglers": ", ".join(stats.stragglers) or "–",
                "energy": cell.energy_mj / 3.6e6,
                "cost": snap.cost.usd(cell.duration(snap.now)) if snap.cost else math.nan,
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


# -- the three reports ---------------------------------------------------------------------
def live_report(snap: Snapshot) -> Report:
    sections: list[Section] = [
        *panel.alerts([a.message for a in snap.alerts]),
        _totals(snap),
        _charts(snap, live=True),
        *_cells(snap),
        *panel.notes(snap.notes),
    ]
    return Report("watch-job", "gpuwatch · job", _subtitle(snap, live=True), sections)


def status_report(status: WatchStatus) -> Report:
    snap = status.snapshot
    sections: list[Section] = [
        *panel.alerts([a.message for a in snap.alerts]),
        _totals(snap),
        *_gpu_table(snap),
        *_cells(snap),
        *panel.notes(snap.notes),
    ]
    return Report("watch-job-status", "gpuwatch status · job", _subtitle(snap, False), sections)


def result_report(result: WatchResult) -> Report:
    snap = result.snapshot
    slow = result.stragglers
    window: list[Section] = []
    if not slow.empty:
        named = ", ".join(
            f"{r.Hostname} GPU {r.gpu} {fmt_percent(r.utilization)} (median {fmt_percent(r.job_median)})"
            for r in slow.itertuples()
        )
        window.append(
            Paragraph(f"Stragglers over the window ({fmt_seconds(snap.window)}): {named}", "box")
        )
    sections: list[Section] = [
        *panel.alerts([a.message for a in snap.alerts]),
        *window,
        _totals(snap),
        _charts(snap, live=False),
        *_gpu_table(snap),
        *_cells(snap),
        *panel.notes(snap.notes),
        Paragraph(
            ".series, .gpus, .cells, .stragglers, .xid_errors; the alerts on top are over the "
            f"last {STRAGGLER_SPAN_S:.0f} s"
        ),
    ]
    return Report("watch-job-summary", "gpuwatch summary · job", _subtitle(snap, False), sections)
