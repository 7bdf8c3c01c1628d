"""``%gpuwatch``'s charts: one row of small SVG charts per GPU (utilisation, memory,
temperature, power) and one for the host (CPU, RAM), cells shaded where they ran.

Drawn as strings from a ``Snapshot`` (no matplotlib per frame): the live frame is redrawn
every second, over the last window; the summary at the stop draws the whole watch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gpumagic.device_kinds import CUDA
from gpumagic.monitor import metrics as M
from gpumagic.render.html import NOTE_STYLE, PALETTE
from gpumagic.render.svg import Band, Chart, Series, render_small_multiples
from gpumagic.render.watch_panel import cell_name, ratio
from gpumagic.units import fmt_bytes, fmt_celsius, fmt_clock, fmt_percent, fmt_seconds, fmt_watts

if TYPE_CHECKING:
    from gpumagic.monitor.cells import CellRecord
    from gpumagic.monitor.snapshot import Snapshot

CHART_W = 232
CHART_H = 84
# More points than the plot has pixels only costs bytes (a live frame is re-sent every
# second); buckets keep each one's peak, so a one-sample spike in utilisation or memory
# stays visible in a day-long summary. 52 px are the chart's axis margins (svg.py).
MAX_POINTS = CHART_W - 52

_CELL_BAND = "rgba(59, 125, 216, 0.10)"
_RUNNING_BAND = "rgba(240, 173, 78, 0.22)"
_FAILED_BAND = "rgba(217, 83, 79, 0.14)"


def _decimate(
    x: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS
) -> tuple[list[float], list[float | None]]:
    """At most ``max_points`` points, each bucket keeping its maximum (NaN only if all NaN)."""
    if len(x) > max_points:
        edges = np.linspace(0, len(x), max_points + 1).astype(int)[:-1]
        x = x[edges]
        y = np.fmax.reduceat(y, edges)
    return x.tolist(), [None if v != v else v for v in y.tolist()]


def series(name: str, x: np.ndarray, y: np.ndarray, color: str, fill: bool = False) -> Series:
    """A chart's line, at most as many points as the plot has pixels."""
    xs, ys = _decimate(x, y)
    return Series(name, xs, ys, color=color, fill=fill)


def _latest(y: np.ndarray) -> float:
    finite = y[~np.isnan(y)]
    return float(finite[-1]) if len(finite) else math.nan


def _max(y: np.ndarray) -> float:
    return float(np.nanmax(y)) if len(y) and not np.isnan(y).all() else math.nan


def bands(
    cells: Sequence[CellRecord], origin: float, x_lo: float, x_hi: float, now: float
) -> list[Band]:
    """The cells as shaded bands on a time axis (running, failed, done)."""
    out = []
    for cell in cells:
        end = cell.end if cell.end is not None else now
        x0, x1 = cell.start - origin, end - origin
        if x1 < x_lo or x0 > x_hi:
            continue
        if cell.end is None:
            color = _RUNNING_BAND
        elif cell.success is False:
            color = _FAILED_BAND
        else:
            color = _CELL_BAND
        label = f"{cell_name(cell)} {cell.source} ({fmt_seconds(cell.duration(now))})"
        # A cell shorter than a pixel still gets a visible sliver.
        out.append(Band(x0, max(x1, x0 + (x_hi - x_lo) / 400), label, color))
    return out


ChartOf = Callable[..., Chart]  # (title, series, **Chart fields) -> a chart on the shared axis


def _pct(v: float) -> str:
    return fmt_percent(v, digits=0)


def _top(values: np.ndarray) -> float | None:
    top = _max(values)
    return None if math.isnan(top) else top


def _gpu_row(label: str, v: np.ndarray, x: np.ndarray, chart: ChartOf) -> list[Chart]:
    util, mutil = v[:, M.UTIL_GPU], v[:, M.UTIL_MEM]
    used, total, proc = v[:, M.MEM_USED], v[:, M.MEM_TOTAL], v[:, M.PROC_MEM]
    temp, power, limit = v[:, M.TEMPERATURE], v[:, M.POWER_DRAW], v[:, M.POWER_LIMIT]
    return [
        chart(
            f"{label} util {fmt_percent(_latest(util))} (mem {fmt_percent(_latest(mutil))})",
            [
                series("memory util", x, mutil, PALETTE["muted"]),
                series("util", x, util, PALETTE["accent"], fill=True),
            ],
            y_max=100.0,
            y_format=_pct,
        ),
        chart(
            f"memory {fmt_bytes(_latest(used))} (this kernel {fmt_bytes(_latest(proc))})",
            [
                series("used", x, used, PALETTE["accent"], fill=True),
                series("this kernel", x, proc, PALETTE["alloc"]),
            ],
            y_max=_top(total),
            y_format=fmt_bytes,
        ),
        chart(
            f"temperature {fmt_celsius(_latest(temp))}",
            [series("temperature", x, temp, PALETTE["peak"])],
            y_min=None,
            y_format=fmt_celsius,
        ),
        chart(
            f"power {ratio(_latest(power), _latest(limit), fmt_watts)}",
            [series("power", x, power, PALETTE["free"], fill=True)],
            y_max=_top(np.concatenate([power, limit])),
            y_format=fmt_watts,
        ),
    ]


def _host_row(v: np.ndarray, x: np.ndarray, chart: ChartOf) -> list[Chart]:
    cpu, pcpu = v[:, M.HOST_CPU], v[:, M.PROC_CPU]
    used, total, rss = v[:, M.HOST_MEM_USED], v[:, M.HOST_MEM_TOTAL], v[:, M.PROC_RSS]
    return [
        chart(
            f"host CPU {fmt_percent(_latest(cpu))} (this kernel {fmt_percent(_latest(pcpu))})",
            [
                series("host", x, cpu, PALETTE["accent"], fill=True),
                series("this kernel", x, pcpu, PALETTE["alloc"]),
            ],
            y_max=100.0,
            y_format=_pct,
        ),
        chart(
            f"host RAM {ratio(_latest(used), _latest(total), fmt_bytes)}",
            [
                series("used", x, used, PALETTE["accent"], fill=True),
                series("this kernel", x, rss, PALETTE["alloc"]),
            ],
            y_max=_top(total),
            y_format=fmt_bytes,
        ),
    ]


def axis(snap: Snapshot, live: bool) -> tuple[float, float, float, str]:
    """(origin, x_lo, x_hi, caption): seconds before now (live) or since the first sample."""
    if live:
        # The axis grows with the data until it spans the window: a fresh watcher's first
        # seconds would otherwise be a sliver at the right edge of a 5-minute axis.
        seen = snap.now - float(snap.times[0]) if len(snap.times) else 0.0
        span = min(snap.window, max(seen, 10 * snap.interval, 5.0))
        return snap.now, -span, 0.0, f"last {fmt_seconds(span)}"
    origin = float(snap.times[0]) if len(snap.times) else snap.now
    x_hi = max((float(snap.times[-1]) - origin) if len(snap.times) else 0.0, snap.interval)
    return origin, 0.0, x_hi, f"{fmt_seconds(x_hi)} from {fmt_clock(origin)}"


def _charts(snap: Snapshot, live: bool) -> list[list[Chart]]:
    """One list of charts per device row (GPUs first, then the host)."""
    origin, x_lo, x_hi, caption = axis(snap, live)
    x = snap.times - origin
    shaded = bands(snap.cells, origin, x_lo, x_hi, snap.now)

    # Host only: its two charts are the whole panel, so they get the room four GPU charts would.
    host_only = all(d.kind != CUDA for d in snap.devices)
    width, height = (2 * CHART_W + 6, CHART_H + 36) if host_only else (CHART_W, CHART_H)

    def chart(title: str, lines: list[Series], **kw: Any) -> Chart:
        alt = f"{title}: {_range(lines, kw.get('y_format'))}, {caption}"
        return Chart(
            lines, width, height, title, caption, x_min=x_lo, x_max=x_hi, bands=shaded, alt=alt, **kw
        )

    return [
        _gpu_row(device.label, snap.values[:, row, :], x, chart)
        if device.kind == CUDA
        else _host_row(snap.values[:, row, :], x, chart)
        for row, device in enumerate(snap.devices)
    ]


def _range(lines: list[Series], fmt: Any) -> str:
    """The main line's peak and mean in words (the filled one: used memory, utilisation)."""
    main = next((s for s in lines if s.fill), lines[0])
    values = [v for v in main.y if v is not None]
    if not values:
        return "no value yet"
    fmt = fmt if callable(fmt) else (lambda v: f"{v:g}")
    return f"peak {fmt(max(values))}, mean {fmt(sum(values) / len(values))}"


def chart_lines(snap: Snapshot, live: bool) -> list[str]:
    """What the charts show, a line per chart, for the text form (and each chart's alt)."""
    if len(snap.times) == 0:
        return []
    return [chart.alt for row in _charts(snap, live) for chart in row]


def chart_block(snap: Snapshot, live: bool) -> str:
    """Every device's row of charts: the last window (``live``) or the whole watch."""
    if len(snap.times) == 0:
        return f'<div class="gm-note" style="{NOTE_STYLE}">no sample yet</div>'
    return "".join(render_small_multiples(row) for row in _charts(snap, live))
