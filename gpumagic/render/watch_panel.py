"""The parts every ``%gpuwatch`` view shows, as sections of the one report model: the
current values of each GPU (a table) and of the host, why there is no GPU panel, the
alerts, the cell running now, the notes on missing values, what the watched time cost,
and who else is on the watched GPUs.

The live frame and ``%gpuwatch status`` (``watch_status.py``) and the summary at the stop
(``watch_summary.py``) put these together; the charts are ``watch_chart.py``. Everything
is read from a ``Snapshot``, the watcher's public copy of its state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpumagic.monitor.frames import device_values
from gpumagic.render.sections import Box, Details, KeyValues, Paragraph, Section
from gpumagic.render.table import Column, Table
from gpumagic.units import (
    fmt_bytes,
    fmt_celsius,
    fmt_mhz,
    fmt_percent,
    fmt_seconds,
    fmt_usd,
    fmt_watts,
    fmt_wh,
)

if TYPE_CHECKING:
    from gpumagic.monitor.cells import CellRecord
    from gpumagic.monitor.cost import CostState
    from gpumagic.monitor.processes import ProcessTable
    from gpumagic.monitor.snapshot import Snapshot


def cell_name(cell: CellRecord) -> str:
    return f"[{cell.execution_count}]" if cell.execution_count is not None else "[ ]"


def ratio(used: float, total: float, fmt: Callable[[float | None], str]) -> str:
    """``used / total`` (``used`` alone where the total is unknown)."""
    if math.isnan(total):
        return fmt(used)
    return f"{fmt(used)} / {fmt(total)}"


def subtitle(snap: Snapshot, live: bool) -> str:
    parts = [f"every {fmt_seconds(snap.interval)}"]
    if live:
        parts.append(f"last {fmt_seconds(snap.window)}")
        if not snap.running:
            parts.append("stopped")
    parts.append(f"{snap.samples_taken} samples")
    if snap.log_path:
        parts.append(f"log: {snap.log_path}")
    return " · ".join(parts)


def reason(snap: Snapshot) -> list[Section]:
    if snap.reason is None:
        return []
    text = f"No GPU panel: {snap.reason}. Showing this machine's CPU and RAM."
    return [Paragraph(text, "info")]


def alerts(messages: Sequence[str]) -> list[Section]:
    return [Paragraph(f"⚠ {m}", "box") for m in messages]


def notes(snap_notes: Sequence[str]) -> list[Section]:
    """The notes on missing values, folded in HTML (they can be many and are rarely news)."""
    if not snap_notes:
        return []
    lines = [Paragraph(n, "plain", prefix="note: ") for n in snap_notes]
    return [Details(f"{len(snap_notes)} note(s) on missing values", lines, css="gm-note")]


def running(snap: Snapshot) -> list[Section]:
    """The cell running now, and for how long."""
    now = [c for c in snap.cells if c.end is None]
    if not now:
        return []
    cell = now[-1]
    text = f"running {cell_name(cell)} {cell.source} for {fmt_seconds(cell.duration(snap.now))}"
    return [Paragraph(text)]


# -- the devices now --------------------------------------------------------------------------
def _throttle(e: dict[str, Any]) -> str:
    names = [n for n in e["throttle"] if n != "gpu_idle"]
    return ", ".join(names) or ("idle" if "gpu_idle" in e["throttle"] else "–")


_GPU_COLUMNS = [
    Column("GPU", "label", align="left"),
    Column("name", "name", align="left"),
    Column(
        "util",
        lambda e: f"{fmt_percent(e['utilization_gpu'])} (mem {fmt_percent(e['utilization_memory'])})",
    ),
    Column("memory", lambda e: ratio(e["memory_used"], e["memory_total"], fmt_bytes)),
    Column("this kernel", "process_memory_used", fmt_bytes),
    Column("temp", "temperature", fmt_celsius),
    Column("power", lambda e: ratio(e["power_draw"], e["power_limit"], fmt_watts)),
    Column("SM / mem clock", lambda e: f"{fmt_mhz(e['clock_sm'])} / {fmt_mhz(e['clock_mem'])}"),
    Column("throttle", _throttle, align="left"),
]


def devices(snap: Snapshot) -> list[Section]:
    """Each GPU's latest sample as a table row; the host's as label: value pairs."""
    entries = device_values(snap)
    out: list[Section] = []
    gpus = [e for e in entries if e["cuda_index"] is not None]
    if gpus:
        out.append(Table(_GPU_COLUMNS, gpus))
    for e in entries:
        if e["device"] == "host":
            items = [
                ("host CPU", fmt_percent(e["host_cpu"])),
                ("host RAM", ratio(e["host_memory_used"], e["host_memory_total"], fmt_bytes)),
                ("this kernel CPU", fmt_percent(e["process_cpu"])),
                ("this kernel RSS", fmt_bytes(e["process_rss"])),
            ]
            out.append(KeyValues(items, inline=""))
            break
    return out


# -- cost and energy (issue 12) ---------------------------------------------------------------
def cost_sentences(cost: CostState | None, so_far: bool) -> list[str]:
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


def cost(state: CostState | None, so_far: bool) -> list[Section]:
    """What the watched time cost, how much of it idle, the energy: one box."""
    sentences = cost_sentences(state, so_far)
    if not sentences:
        return []
    return [Box([Paragraph(s, "plain") for s in sentences], "info", css="gm-cost")]


# -- who else is on the GPUs ------------------------------------------------------------------
_COMMAND_CHARS = 60


def processes(procs: ProcessTable | None, at_stop: bool = False) -> list[Section]:
    """The compute processes on the watched GPUs (this kernel's highlighted), the command
    line cut in the text form only."""
    if procs is None or not procs.read:
        return []
    when = "at the stop" if at_stop else "now"
    out: list[Section] = [
        Paragraph(f"compute processes on the watched GPUs {when}: {len(procs.rows)}")
    ]
    if procs.rows:
        columns = [
            Column("GPU", "label", align="left"),
            Column("PID", "pid"),
            Column("user", lambda p: p.user or "?", align="left"),
            Column("GPU memory", "gpu_memory", fmt_bytes),
            Column(
                "command",
                lambda p: p.command if p.command is not None else "?",
                align="code",
                chars=_COMMAND_CHARS,
            ),
            Column("", lambda p: "this kernel" if p.this_kernel else p.note, align="left"),
        ]
        highlight = lambda p: "hot" if p.this_kernel else ""  # noqa: E731
        out.append(Table(columns, procs.rows, highlight=highlight))
    out += [Paragraph(n, prefix="note: ") for n in procs.notes]
    return out
