"""``%gpuwatch`` on screen: the live frame, the status header and the static summary.

Everything is an HTML string with inline SVG built from a ``Snapshot`` (no matplotlib per
frame): one row of small charts per GPU (utilisation, memory, temperature, power) and one
for the host (CPU, RAM), cells shaded where they ran, current values and alerts on top.
``LiveFrame`` is the LiveView callback; it returns the cached frame when no new sample
arrived, so a view refreshing faster than the sampler costs nothing. Only the watcher's
public ``seq``, ``running`` and ``snapshot()`` are read here; the live view itself
(IPython, widgets) is ``watch_live.py``, never imported by the core's results.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from gpumagic.device_kinds import CUDA
from gpumagic.monitor import metrics as M
from gpumagic.monitor.alerts import cell_note
from gpumagic.monitor.result import device_values, utilization_of
from gpumagic.render.html import PALETTE, Rendered, escape, kv, table, text_table, wrap
from gpumagic.render.svg import Band, Chart, Series, render_small_multiples
from gpumagic.units import (
    fmt_bytes,
    fmt_celsius,
    fmt_mhz,
    fmt_percent,
    fmt_seconds,
    fmt_us,
    fmt_usd,
    fmt_watts,
    fmt_wh,
)

if TYPE_CHECKING:
    from gpumagic.monitor.cells import CellRecord
    from gpumagic.monitor.cost import CostState
    from gpumagic.monitor.processes import ProcessTable
    from gpumagic.monitor.result import WatchResult, WatchStatus
    from gpumagic.monitor.snapshot import Snapshot
    from gpumagic.monitor.watcher import Watcher

CHART_W = 232
CHART_H = 84
# More points than the plot has pixels only costs bytes (a live frame is re-sent every
# second); buckets keep each one's peak, so a one-sample spike in utilisation or memory
# stays visible in a day-long summary. 52 px are the chart's axis margins (svg.py).
MAX_POINTS = CHART_W - 52

_CELL_BAND = "rgba(59, 125, 216, 0.10)"
_RUNNING_BAND = "rgba(240, 173, 78, 0.22)"
_FAILED_BAND = "rgba(217, 83, 79, 0.14)"


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%H:%M:%S")


def _ratio(used: float, total: float, fmt: Callable[[float | None], str]) -> str:
    if math.isnan(total):
        return fmt(used)
    return f"{fmt(used)} / {fmt(total)}"


def _cell_name(cell: CellRecord) -> str:
    return f"[{cell.execution_count}]" if cell.execution_count is not None else "[ ]"


# -- charts --------------------------------------------------------------------------------
def _decimate(
    x: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS
) -> tuple[list[float], list[float | None]]:
    """At most ``max_points`` points, each bucket keeping its maximum (NaN only if all NaN)."""
    if len(x) > max_points:
        edges = np.linspace(0, len(x), max_points + 1).astype(int)[:-1]
        x = x[edges]
        y = np.fmax.reduceat(y, edges)
    return x.tolist(), [None if v != v else v for v in y.tolist()]


def _series(name: str, x: np.ndarray, y: np.ndarray, color: str, fill: bool = False) -> Series:
    xs, ys = _decimate(x, y)
    return Series(name, xs, ys, color=color, fill=fill)


def _latest(y: np.ndarray) -> float:
    finite = y[~np.isnan(y)]
    return float(finite[-1]) if len(finite) else math.nan


def _max(y: np.ndarray) -> float:
    return float(np.nanmax(y)) if len(y) and not np.isnan(y).all() else math.nan


def _bands(
    cells: Sequence[CellRecord], origin: float, x_lo: float, x_hi: float, now: float
) -> list[Band]:
    bands = []
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
        label = f"{_cell_name(cell)} {cell.source} ({fmt_seconds(cell.duration(now))})"
        # A cell shorter than a pixel still gets a visible sliver.
        bands.append(Band(x0, max(x1, x0 + (x_hi - x_lo) / 400), label, color))
    return bands


def _charts(snap: Snapshot, live: bool) -> list[list[Chart]]:
    """One list of charts per device row (GPUs first, then the host)."""
    if live:
        origin = snap.now
        # The axis grows with the data until it spans the window: a fresh watcher's first
        # seconds would otherwise be a sliver at the right edge of a 5-minute axis.
        seen = snap.now - float(snap.times[0]) if len(snap.times) else 0.0
        span = min(snap.window, max(seen, 10 * snap.interval, 5.0))
        x_lo, x_hi = -span, 0.0
        caption = f"last {fmt_seconds(span)}"
    else:
        origin = float(snap.times[0]) if len(snap.times) else snap.now
        x_lo = 0.0
        x_hi = max((float(snap.times[-1]) - origin) if len(snap.times) else 0.0, snap.interval)
        caption = f"{fmt_seconds(x_hi)} from {_clock(origin)}"
    x = snap.times - origin
    bands = _bands(snap.cells, origin, x_lo, x_hi, snap.now)

    # Host only: its two charts are the whole panel, so they get the room four GPU charts would.
    host_only = all(d.kind != CUDA for d in snap.devices)
    width, height = (2 * CHART_W + 6, CHART_H + 36) if host_only else (CHART_W, CHART_H)

    def chart(title: str, series: list[Series], **kw: Any) -> Chart:
        return Chart(
            series,
            width=width,
            height=height,
            title=title,
            y_label=caption,
            x_min=x_lo,
            x_max=x_hi,
            bands=bands,
            **kw,
        )

    def pct(v: float) -> str:
        return f"{v:.0f}%"

    rows: list[list[Chart]] = []
    for row, device in enumerate(snap.devices):
        v = snap.values[:, row, :]
        if device.kind == CUDA:
            util, mutil = v[:, M.UTIL_GPU], v[:, M.UTIL_MEM]
            used, total, proc = v[:, M.MEM_USED], v[:, M.MEM_TOTAL], v[:, M.PROC_MEM]
            temp, power, limit = v[:, M.TEMPERATURE], v[:, M.POWER_DRAW], v[:, M.POWER_LIMIT]
            mem_top = _max(total)
            power_top = _max(np.concatenate([power, limit]))
            rows.append(
                [
                    chart(
                        f"{device.label} util {fmt_percent(_latest(util))} (mem {fmt_percent(_latest(mutil))})",
                        [
                            _series("memory util", x, mutil, PALETTE["muted"]),
                            _series("util", x, util, PALETTE["accent"], fill=True),
                        ],
                        y_max=100.0,
                        y_format=pct,
                    ),
                    chart(
                        f"memory {fmt_bytes(_latest(used))} (this kernel {fmt_bytes(_latest(proc))})",
                        [
                            _series("used", x, used, PALETTE["accent"], fill=True),
                            _series("this kernel", x, proc, PALETTE["alloc"]),
                        ],
                        y_max=None if math.isnan(mem_top) else mem_top,
                        y_format=fmt_bytes,
                    ),
                    chart(
                        f"temperature {fmt_celsius(_latest(temp))}",
                        [_series("temperature", x, temp, PALETTE["peak"])],
                        y_min=None,
                        y_format=lambda t: f"{t:.0f} °C",
                    ),
                    chart(
                        f"power {_ratio(_latest(power), _latest(limit), fmt_watts)}",
                        [_series("power", x, power, PALETTE["free"], fill=True)],
                        y_max=None if math.isnan(power_top) else power_top,
                        y_format=lambda w: f"{w:.0f} W",
                    ),
                ]
            )
        else:
            cpu, pcpu = v[:, M.HOST_CPU], v[:, M.PROC_CPU]
            used, total, rss = v[:, M.HOST_MEM_USED], v[:, M.HOST_MEM_TOTAL], v[:, M.PROC_RSS]
            ram_top = _max(total)
            rows.append(
                [
                    chart(
                        f"host CPU {fmt_percent(_latest(cpu))} (this kernel {fmt_percent(_latest(pcpu))})",
                        [
                            _series("host", x, cpu, PALETTE["accent"], fill=True),
                            _series("this kernel", x, pcpu, PALETTE["alloc"]),
                        ],
                        y_max=100.0,
                        y_format=pct,
                    ),
                    chart(
                        f"host RAM {_ratio(_latest(used), _latest(total), fmt_bytes)}",
                        [
                            _series("used", x, used, PALETTE["accent"], fill=True),
                            _series("this kernel", x, rss, PALETTE["alloc"]),
                        ],
                        y_max=None if math.isnan(ram_top) else ram_top,
                        y_format=fmt_bytes,
                    ),
                ]
            )
    return rows


# -- header --------------------------------------------------------------------------------
def _gpu_rows(entries: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for e in entries:
        if e["cuda_index"] is None:
            continue
        throttle = [n for n in e["throttle"] if n != "gpu_idle"]
        rows.append(
            [
                e["label"],
                e["name"],
                f"{fmt_percent(e['utilization_gpu'])} (mem {fmt_percent(e['utilization_memory'])})",
                _ratio(e["memory_used"], e["memory_total"], fmt_bytes),
                fmt_bytes(e["process_memory_used"]),
                fmt_celsius(e["temperature"]),
                _ratio(e["power_draw"], e["power_limit"], fmt_watts),
                f"{fmt_mhz(e['clock_sm'])} / {fmt_mhz(e['clock_mem'])}",
                ", ".join(throttle) or ("idle" if "gpu_idle" in e["throttle"] else "–"),
            ]
        )
    return rows


_GPU_HEADERS = [
    "GPU",
    "name",
    "util",
    "memory",
    "this kernel",
    "temp",
    "power",
    "SM / mem clock",
    "throttle",
]
_GPU_LEFT = (0, 1, 8)


def _host_items(entries: list[dict[str, Any]]) -> list[tuple[str, str]]:
    for e in entries:
        if e["device"] == "host":
            return [
                ("host CPU", fmt_percent(e["host_cpu"])),
                ("host RAM", _ratio(e["host_memory_used"], e["host_memory_total"], fmt_bytes)),
                ("this kernel CPU", fmt_percent(e["process_cpu"])),
                ("this kernel RSS", fmt_bytes(e["process_rss"])),
            ]
    return []


def _subtitle(snap: Snapshot, live: bool) -> str:
    parts = [f"every {fmt_seconds(snap.interval)}"]
    if live:
        parts.append(f"last {fmt_seconds(snap.window)}")
        if not snap.running:
            parts.append("stopped")
    parts.append(f"{snap.samples_taken} samples")
    if snap.log_path:
        parts.append(f"log: {snap.log_path}")
    return " · ".join(parts)


def _reason_box(snap: Snapshot) -> str:
    if snap.reason is None:
        return ""
    return (
        f'<div class="gm-box gm-info">No GPU panel: {escape(snap.reason)}. '
        "Showing this machine's CPU and RAM.</div>"
    )


def _alerts_box(messages: Sequence[str]) -> str:
    if not messages:
        return ""
    items = "".join(f"<div>⚠ {escape(m)}</div>" for m in messages)
    return f'<div class="gm-box">{items}</div>'


def _notes(notes: Sequence[str]) -> str:
    if not notes:
        return ""
    items = "".join(f"<div>{escape(n)}</div>" for n in notes)
    return f'<details class="gm-note"><summary>{len(notes)} note(s) on missing values</summary>{items}</details>'


def _running_line(snap: Snapshot) -> str:
    running = [c for c in snap.cells if c.end is None]
    if not running:
        return ""
    cell = running[-1]
    return (
        f'<div class="gm-note">running {escape(_cell_name(cell))} '
        f"<code>{escape(cell.source)}</code> for {escape(fmt_seconds(cell.duration(snap.now)))}</div>"
    )


def _header(snap: Snapshot, title: str, live: bool) -> str:
    entries = device_values(snap)
    parts = [
        f'<h4>{escape(title)} <span class="gm-sub">{escape(_subtitle(snap, live))}</span></h4>',
        _reason_box(snap),
        _alerts_box([a.message for a in snap.alerts]) if live else "",
    ]
    gpu_rows = _gpu_rows(entries)
    if gpu_rows:
        parts.append(
            table(_GPU_HEADERS, [[escape(c) for c in r] for r in gpu_rows], left=_GPU_LEFT)
        )
    host = _host_items(entries)
    if host:
        parts.append(kv((k, escape(v)) for k, v in host))
    return "".join(parts)


def _chart_block(snap: Snapshot, live: bool) -> str:
    if len(snap.times) == 0:
        return '<div class="gm-note">no sample yet</div>'
    return "".join(render_small_multiples(row) for row in _charts(snap, live))


# -- public --------------------------------------------------------------------------------
def live_html(snap: Snapshot) -> str:
    """The live frame: header with current values and alerts, charts of the last window."""
    body = (
        _header(snap, "gpuwatch", live=True)
        + _running_line(snap)
        + _chart_block(snap, live=True)
        + _notes(snap.notes)
    )
    return wrap("watch", body)


class LiveFrame:
    """LiveView callback: ``frame()`` is the live frame of ``watcher``'s latest sample, built
    once per sample (the watcher's ``seq`` is the version polled) and once more at the stop."""

    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher
        # (seq, running, html) in one tuple: the view's thread and a caller may both ask.
        self._cached: tuple[int, bool, str] | None = None

    def __call__(self) -> str:
        seq, running = self.watcher.seq, self.watcher.running
        cached = self._cached
        if cached is not None and cached[:2] == (seq, running):
            return cached[2]
        html = live_html(self.watcher.snapshot())
        self._cached = (seq, running, html)
        return html


def status_html(status: WatchStatus) -> str:
    snap = status.snapshot
    body = (
        _header(snap, "gpuwatch status", live=True)
        + _running_line(snap)
        + _cost_html(snap.cost, so_far=True)
        + _processes_html(snap.processes)
        + _notes(snap.notes)
    )
    return wrap("watch-status", body)


def status_text(status: WatchStatus) -> str:
    snap = status.snapshot
    lines = [f"gpuwatch status ({_subtitle(snap, live=True)})"]
    if snap.reason:
        lines.append(f"No GPU panel: {snap.reason}")
    entries = device_values(snap)
    gpu_rows = _gpu_rows(entries)
    if gpu_rows:
        lines.append(text_table(_GPU_HEADERS, gpu_rows, left=_GPU_LEFT))
    host = _host_items(entries)
    if host:
        lines.append("  ".join(f"{k}: {v}" for k, v in host))
    lines.extend(f"! {a.message}" for a in status.alerts)
    lines.extend(_cost_lines(snap.cost, so_far=True))
    lines.extend(_processes_text(snap.processes))
    lines.extend(f"note: {n}" for n in status.notes)
    return "\n".join(lines)


_CELL_HEADERS_GPU = [
    "cell",
    "source",
    "start",
    "duration",
    "peak util",
    "mean util",
    "peak memory",
    "this kernel",
    "",
]
_CELL_HEADERS_HOST = ["cell", "source", "start", "duration", "peak CPU", "peak RAM", ""]


def _cell_flag(cell: CellRecord) -> str:
    """A word for the table; the advice behind it is spelled out once below the table."""
    flags = []
    if cell.success is False:
        flags.append("failed")
    if cell_note(cell):
        flags.append("low GPU use")
    return ", ".join(flags)


def _cell_rows(result: WatchResult) -> list[list[str]]:
    snap = result.snapshot
    several = sum(d.kind == CUDA for d in snap.devices) > 1
    rows = []
    for cell in snap.cells:
        head = [
            _cell_name(cell),
            cell.source,
            _clock(cell.start),
            fmt_seconds(cell.duration(snap.now)),
        ]
        if cell.samples == 0:
            tail = ["no sample"] + [""] * (3 if result.has_gpus else 1)
        elif result.has_gpus:
            # on a box of several GPUs, say whose utilisation it is (this process's GPUs)
            own = utilization_of(cell, snap.devices) if cell.utilization_rows and several else ""
            tail = [
                fmt_percent(cell.peak_utilization) + (f" ({own})" if own else ""),
                fmt_percent(cell.mean_utilization),
                fmt_bytes(cell.peak_memory),
                fmt_bytes(cell.peak_process_memory),
            ]
        else:
            tail = [fmt_percent(cell.peak_host_cpu), fmt_bytes(cell.peak_host_memory)]
        rows.append([*head, *tail, *_cell_cost(result, cell), _cell_flag(cell)])
    return rows


def _cell_advice(result: WatchResult) -> list[str]:
    low = [c for c in result.snapshot.cells if cell_note(c)]
    if not low:
        return []
    names = ", ".join(_cell_name(c) for c in low)
    return [f"{names}: {cell_note(low[0]) if len(low) == 1 else LOW_USE_ADVICE}"]


LOW_USE_ADVICE = (
    "GPU busy under 30% on average while holding memory: likely waiting on data or the "
    "host; profile one with %%gpuprofile"
)


def _seen_alerts(result: WatchResult) -> list[str]:
    out = []
    for alert, last, count in result.alerts:
        span = f"{_clock(alert.since)}–{_clock(last)}" if count > 1 else _clock(alert.since)
        out.append(f"{alert.message} ({span}, {count} sample{'s' if count != 1 else ''})")
    return out


def _summary_line(result: WatchResult) -> str:
    snap = result.snapshot
    span = float(snap.times[-1] - snap.times[0]) if len(snap.times) > 1 else 0.0
    gpus = sum(1 for d in snap.devices if d.kind == CUDA)
    what = f"{gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "host only"
    cpu = result.sample_cpu_mean_s
    cost = f" · {fmt_us(cpu * 1e6)} CPU per sample" if not math.isnan(cpu) else ""
    return f"{what} · {fmt_seconds(span)} shown · {_subtitle(snap, live=False)}{cost}"


def result_html(result: WatchResult) -> str:
    snap = result.snapshot
    parts = [
        f'<h4>gpuwatch summary <span class="gm-sub">{escape(_summary_line(result))}</span></h4>',
        _reason_box(snap),
        _alerts_box(_seen_alerts(result)),
        _chart_block(snap, live=False),
    ]
    rows = _cell_rows(result)
    if rows:
        headers = _cell_headers(result)
        classes = [
            "gm-error" if c.success is False else ("gm-hot" if cell_note(c) else "")
            for c in snap.cells
        ]
        parts.append(
            table(
                headers,
                [[escape(c) for c in r] for r in rows],
                left=(0, len(headers) - 1),
                code=(1,),
                row_classes=classes,
                title_attr=[c.source for c in snap.cells],
            )
        )
        advice = _cell_advice(result)
        if advice:
            parts.append(f'<div class="gm-box gm-info">{escape(advice[0])}</div>')
    else:
        parts.append('<div class="gm-note">no cell ran while watching</div>')
    parts.append(_cost_html(snap.cost, so_far=False))
    parts.append(_processes_html(snap.processes, at_stop=True))
    if result.log:
        parts.append(f'<div class="gm-note">CSV log: <code>{escape(result.log)}</code></div>')
    parts.append(_notes(snap.notes))
    return wrap("watch-result", "".join(parts))


def result_text(result: WatchResult) -> str:
    snap = result.snapshot
    lines = [f"gpuwatch summary: {_summary_line(result)}"]
    if snap.reason:
        lines.append(f"No GPU panel: {snap.reason}")
    lines.extend(f"! {m}" for m in _seen_alerts(result))
    rows = _cell_rows(result)
    if rows:
        headers = _cell_headers(result)
        lines.append(text_table(headers, rows, left=(0, 1, len(headers) - 1)))
        lines.extend(_cell_advice(result))
    else:
        lines.append("no cell ran while watching")
    lines.extend(_cost_lines(snap.cost, so_far=False))
    lines.extend(_processes_text(snap.processes, at_stop=True))
    if result.log:
        lines.append(f"CSV log: {result.log}")
    lines.extend(f"note: {n}" for n in snap.notes)
    return "\n".join(lines)


def render_time(watcher: Watcher, repeat: int = 20) -> float:
    """Seconds one uncached frame (snapshot copy + ``live_html``) takes for ``watcher`` now."""
    t0 = time.perf_counter()
    for _ in range(repeat):
        live_html(watcher.snapshot())
    return (time.perf_counter() - t0) / repeat


class StoppedNote(Rendered):
    """What the live slot shows once the watcher stops: one line, the summary being in the
    cell that stopped it (a second copy of the charts here would only repeat them)."""

    def __init__(self, result: WatchResult, started: float, stopped: float) -> None:
        self.started, self.stopped = started, stopped
        self.log = result.log

    def _line(self) -> str:
        span = fmt_seconds(max(self.stopped - self.started, 0.0))
        line = f"gpuwatch stopped at {_clock(self.stopped)} after {span}; the summary is where it was stopped"
        return line + (f"; CSV log: {self.log}" if self.log else "")

    def _text(self) -> str:
        return self._line()

    def _html(self) -> str:
        return wrap("watch-stopped", f'<div class="gm-note">{escape(self._line())}</div>')


# -- cost, energy and processes (issue 12) ---------------------------------------------------
def _cell_headers(result: WatchResult) -> list[str]:
    headers = list(_CELL_HEADERS_GPU if result.has_gpus else _CELL_HEADERS_HOST)
    extra = []
    if result.has_gpus:
        extra.append("energy")
    cost = result.snapshot.cost
    if cost is not None and cost.price is not None:
        extra.append("cost")
    return [*headers[:-1], *extra, headers[-1]]


def _cell_cost(result: WatchResult, cell: CellRecord) -> list[str]:
    out = []
    if result.has_gpus:
        out.append(fmt_wh(cell.energy_mj / 3.6e6))
    cost = result.snapshot.cost
    if cost is not None and cost.price is not None:
        out.append(fmt_usd(cost.price * cell.duration(result.snapshot.now) / 3600.0))
    return out


def _cost_sentences(cost: CostState | None, so_far: bool) -> list[str]:
    if cost is None:
        return []
    out = []
    span = fmt_seconds(cost.metered_s)
    share = cost.idle_share
    idle = f"{fmt_percent(100.0 * share)} idle" if not math.isnan(share) else "idle share not known yet"
    if cost.price is not None:
        lead = "cost so far" if so_far else "cost"
        line = f"{lead}: {fmt_usd(cost.total_usd)} for {span} at {fmt_usd(cost.price)}/h"
        if not math.isnan(share):
            line += f", {fmt_usd(cost.idle_usd)} of it ({fmt_percent(100.0 * share)}) while idle"
        out.append(line)
    elif cost.idle_alert_s is not None or not so_far:
        out.append(f"{span} watched, {idle}" + ("" if so_far else " (give --price $/h for the cost)"))
    if out:
        out.append(f"idle means: {cost.idle_meaning}")
    if cost.unknown_s > 0:
        out.append(
            f"{fmt_seconds(cost.unknown_s)} could not be classed idle or busy "
            "(a GPU's utilisation was missing)"
        )
    if not math.isnan(cost.energy_mj):  # when it is not, the notes say why
        out.append(f"energy of the watched GPUs: {fmt_wh(cost.energy_wh)}")
    return out


def _cost_lines(cost: CostState | None, so_far: bool) -> list[str]:
    return _cost_sentences(cost, so_far)


def _cost_html(cost: CostState | None, so_far: bool) -> str:
    sentences = _cost_sentences(cost, so_far)
    if not sentences:
        return ""
    items = "".join(f"<div>{escape(s)}</div>" for s in sentences)
    return f'<div class="gm-box gm-info">{items}</div>'


_PROCESS_HEADERS = ["GPU", "PID", "user", "GPU memory", "command", ""]
_COMMAND_CHARS = 60


def _process_rows(procs: ProcessTable, full: bool) -> list[list[str]]:
    rows = []
    for p in procs.rows:
        command = p.command if p.command is not None else "?"
        if not full and len(command) > _COMMAND_CHARS:
            command = command[: _COMMAND_CHARS - 1] + "…"
        flag = "this kernel" if p.this_kernel else p.note
        rows.append(
            [p.label, str(p.pid), p.user or "?", fmt_bytes(p.gpu_memory), command, flag]
        )
    return rows


def _process_title(procs: ProcessTable | None, at_stop: bool) -> str:
    when = "at the stop" if at_stop else "now"
    n = len(procs.rows) if procs is not None else 0
    return f"compute processes on the watched GPUs {when}: {n}"


def _processes_html(procs: ProcessTable | None, at_stop: bool = False) -> str:
    if procs is None or not procs.read:
        return ""
    parts = [f'<div class="gm-note">{escape(_process_title(procs, at_stop))}</div>']
    if procs.rows:
        rows = _process_rows(procs, full=True)
        parts.append(
            table(
                _PROCESS_HEADERS,
                [[escape(c) for c in r] for r in rows],
                left=(0, 2, 4, 5),
                code=(4,),
                row_classes=["gm-hot" if p.this_kernel else "" for p in procs.rows],
            )
        )
    for note in procs.notes:
        parts.append(f'<div class="gm-note">{escape(note)}</div>')
    return "".join(parts)


def _processes_text(procs: ProcessTable | None, at_stop: bool = False) -> list[str]:
    if procs is None or not procs.read:
        return []
    lines = [_process_title(procs, at_stop)]
    if procs.rows:
        lines.append(text_table(_PROCESS_HEADERS, _process_rows(procs, full=False), left=(0, 2, 4, 5)))
    lines.extend(f"note: {n}" for n in procs.notes)
    return lines
