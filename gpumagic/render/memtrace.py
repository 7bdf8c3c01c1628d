"""The ``%%memtrace`` report (one declaration, text and HTML), the out-of-memory
post-mortem, and the live view while the cell runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumagic.device_kinds import CUDA
from gpumagic.memory.census.categories import ACTIVATIONS, NAMES, SHORT
from gpumagic.memory.trace.lines import CATEGORY_COLUMNS
from gpumagic.memory.trace.oom.model import OomReport
from gpumagic.render.html import PALETTE, escape, wrap
from gpumagic.render.memchart import memory_chart_image
from gpumagic.render.sections import (
    Box,
    Bullets,
    Figure,
    KeyValues,
    Paragraph,
    Report,
    Section,
)
from gpumagic.render.svg import Chart, Series, chart_image
from gpumagic.render.table import Bar, Column, Table
from gpumagic.units import fmt_bytes, fmt_count, fmt_us

if TYPE_CHECKING:
    from gpumagic.memory.trace.result import MemTrace
    from gpumagic.memory.trace.run import MemtraceStatus
    from gpumagic.memory.trace.timeline import AtPeak


GROWTH, RELEASE, PEAK = PALETTE["alloc"], PALETTE["free"], PALETTE["peak"]
# The heaviest statements and the one that failed: shaded in HTML, marked in the text form.
_LEGEND = "Highlighted rows: the heaviest statements (* in the text form) and the one that failed (!)."


def first_line(source: str) -> str:
    first = source.splitlines()[0] if source else ""
    return first + (" …" if "\n" in source else "")


def _looped(t: MemTrace) -> bool:
    return any(h > 1 for h in t.hits)


def _lines_table(t: MemTrace) -> Table:
    rows = [
        {**row, "heaviest": heavy}
        for row, heavy in zip(t.lines.to_dict("records"), t.heaviest)
    ]
    scale = max(
        [abs(r["delta_per_hit_bytes"]) for r in rows] + [r["peak_bytes"] for r in rows] + [1]
    )
    looped = _looped(t)
    columns = [
        Column("line", "line", align="left"),
        Column(
            "statement",
            lambda r: "    " * int(r["depth"]) + first_line(r["source"]),
            align="code",
            chars=60,
            tooltip=lambda r: r["source"],
        ),
        Column("hits", "hits", fmt_count),
        Column(t.time_label + (" (all hits)" if looped else ""), "time_us", fmt_us),
        Column(
            "Δ per hit" if looped else "Δ allocated",
            "delta_per_hit_bytes",
            lambda v: fmt_bytes(v, signed=True),
            bar=Bar(scale, lambda v: GROWTH if v > 0 else RELEASE),
        ),
        Column(
            "peak (highest hit)" if looped else "peak in statement",
            "peak_bytes",
            fmt_bytes,
            bar=Bar(scale, PEAK),
        ),
        Column("allocated after", "allocated_bytes", fmt_bytes),
    ]
    if t.device.kind == CUDA:
        columns.append(Column("reserved after", "reserved_bytes", fmt_bytes))
    if not t.device.pages:
        # The traced bytes are tensors: the process's pages beside them (RSS counts library
        # code paged in and blocks the C library keeps, not tensors).
        # (host_peak_bytes stays in .lines: the table is wide enough with the categories)
        columns.append(
            Column("host RSS Δ", "host_delta_bytes", lambda v: fmt_bytes(v, signed=True))
        )
    if t.has_categories:
        lines = t.lines
        columns += [
            Column(header, key, fmt_bytes)
            for header, key in zip(SHORT, CATEGORY_COLUMNS)
            if lines[key].fillna(0).astype(bool).any()  # a category no row holds is left out
        ]
    return Table(
        columns,
        rows,
        highlight=lambda r: "error" if r["failed"] else ("hot" if r["heaviest"] else ""),
        marks=True,
    )


def _summary(t: MemTrace) -> KeyValues:
    items = [
        ("cell peak", f"{fmt_bytes(t.cell_peak)} ({fmt_bytes(t.peak_above_start, signed=True)})"),
        ("net change", fmt_bytes(t.net_change, signed=True)),
    ]
    if t.device.kind == CUDA:
        items.append(("reserved at end", fmt_bytes(t.final_reserved)))
    if not t.device.pages:
        items.append(("host RSS change", fmt_bytes(t.host_final - t.host_initial, signed=True)))
    items.append(("time", fmt_us(t.elapsed_ns / 1000)))
    return KeyValues(items, inline="")


def _categories_text(categories: dict[str, int]) -> str:
    return ", ".join(f"{name} {fmt_bytes(n)}" for name, n in categories.items() if n)


def at_peak_section(peak: AtPeak) -> Section:
    """What was alive at the cell's highest moment, and whose activations."""
    head = (
        f"At the peak ({fmt_bytes(peak.total)}, during line {peak.line}"
        + (f", hit {fmt_count(peak.hit)}" if peak.hit > 1 else "")
        + f"): {_categories_text(peak.categories)}."
    )
    blocks = peak.blocks()
    if blocks and peak.activations:
        shown = list(blocks.items())[:6]
        rest = sum(n for _, n in list(blocks.items())[6:])
        mods = ", ".join(f"{name} {fmt_bytes(n)}" for name, n in shown)
        head += f" Activations by module: {mods}" + (f", others {fmt_bytes(rest)}" if rest else "") + "."
    return Paragraph(head, "plain", css="gm-at-peak")


def _census_legend(t: MemTrace) -> str:
    if not t.has_categories:
        return ""
    return (
        "Categories: memory after each statement by owner (parameters and buffers, their "
        "gradients, optimizer state, activations kept for backward, temporaries, tensors your "
        "variables name, other); they add up to 'allocated after'. Temporaries live inside a "
        "statement: they show in its peak and in the chart."
    )


def memtrace_report(t: MemTrace) -> Report:
    """The cell's peak and net change, a row per statement that ran, the chart by category
    and what was alive at the peak, the caveats on reading them, and the out-of-memory
    post-mortem when a statement ran out."""
    tracking = f"Tracking {t.device.label}: {t.device.why}."
    sections: list[Section] = [_summary(t), _lines_table(t)]
    if t.has_categories:
        chart_title = f"{t.device.label}: memory by category over the cell's statements"
        sections.append(Figure(lambda: memory_chart_image(t.points, t.statements, chart_title)))
        peak = t.at_peak
        if peak is not None:
            sections.append(at_peak_section(peak))
    legend = " ".join(p for p in (tracking, _census_legend(t), _LEGEND) if p)
    sections += [
        Paragraph(legend),
        *(Paragraph(n, prefix="note: ") for n in (t.time_note, *t.notes) if n),
    ]
    if t.oom is not None:
        sections.append(oom_section(t.oom))
    warn = f"failed at line {t.failed_line}: {t.error}" if t.error else ""
    summary = (
        f"%%memtrace {t.device.label}: {len(t.lines)} statements, peak "
        f"{fmt_bytes(t.cell_peak)}, net {fmt_bytes(t.net_change, signed=True)}"
    )
    return Report("memtrace", "%%memtrace", t.device.label, sections, warn=warn, summary=summary)


def _asked_and_free(report: OomReport) -> tuple[str, str]:
    """The request and the free memory, with more digits when they would print alike
    ("asked for 32.0 MiB; free 32.0 MiB" reads as a contradiction)."""
    asked, free = fmt_bytes(report.requested), fmt_bytes(report.free)
    if report.requested is not None and report.free is not None and asked == free:
        asked, free = fmt_bytes(report.requested, digits=3), fmt_bytes(report.free, digits=3)
    return asked, free


def _holders_table(report: OomReport) -> Table:
    rows: list[tuple[int, str, str, str, str]] = [
        (h.nbytes, h.name, h.role, str(list(h.shape)), h.dtype) for h in report.holders[:10]
    ]
    if report.unnamed_count:
        rows.append(
            (report.unnamed_bytes, f"{report.unnamed_count} tensors no variable names", "", "", "")
        )
    return Table(
        [
            Column("size", 0, fmt_bytes),
            Column("held by", 1, align="code"),
            Column("role", 2, align="left"),
            Column("shape", 3, align="left"),
            Column("dtype", 4, align="left"),
        ],
        rows,
    )


def oom_section(report: OomReport) -> Box:
    """What was asked, what was free and fragmented, who holds the memory, what to try."""
    asked, free = _asked_and_free(report)
    facts = [
        ("asked for", asked),
        ("free", free + (f" of {fmt_bytes(report.total)}" if report.total else "")),
    ]
    if report.allocated is not None:
        facts.append(("allocated", fmt_bytes(report.allocated)))
    if report.reserved_unallocated is not None:
        frag = fmt_bytes(report.reserved_unallocated)
        facts.append(("reserved but unallocated", frag + (" (fragmented)" if report.fragmented else "")))
    if report.released:
        facts.append(("released with the failed call's frames", fmt_bytes(report.released)))
    sections: list[Section] = [
        Paragraph(f"Out of memory on {report.device}: {report.exception}", "plain"),
        KeyValues(facts, inline="", warn=["reserved but unallocated"] if report.fragmented else ()),
    ]
    if report.categories is not None:
        sections.append(Paragraph(_at_failure(report), "plain", css="gm-at-failure"))
    if report.requested_note:
        sections.append(Paragraph(f"Asked for: {report.requested_note}."))
    if report.limit_note:
        sections.append(Paragraph(report.limit_note, prefix="note: "))
    if report.holders or report.unnamed_count:
        sections += [Paragraph("Largest live tensors:", "plain"), _holders_table(report)]
    sections.append(Bullets("What to try", report.advice))
    if report.memfit:
        sections.append(
            Paragraph(
                "What fits, predicted by a dry run before running it again (nothing "
                f"allocated, no GPU needed), with this line on top of the cell: {report.memfit}",
                "plain",
                css="gm-memfit-next",
            )
        )
    return Box(sections, css="gm-oom")


def _at_failure(report: OomReport) -> str:
    assert report.categories is not None
    text = "Tensors at the failure: " + _categories_text(dict(zip(NAMES, report.categories)))
    act = report.categories[ACTIVATIONS]
    if act and report.activations:
        mods = ", ".join(f"{name} {fmt_bytes(n)}" for name, n in report.activations[:6])
        text += f"; the activations kept for backward ({fmt_bytes(act)}) by module: {mods}"
    return text + "."


def oom_text(report: OomReport) -> str:
    return "\n".join(oom_section(report).text())


def oom_html(report: OomReport) -> str:
    return oom_section(report).html()


def memtrace_live_html(status: MemtraceStatus) -> str:
    """The live view while a cell runs: the statement running now, its hits, memory so far.

    Drawn from the run's status (:meth:`gpumagic.memory.trace.run.MemtraceRun.status`), which the
    probes already recorded: no device query from this thread.
    """
    s, hits, timeline = status.statement, status.hits, status.timeline
    if s is not None:
        first = s.source.splitlines()[0] if s.source else ""
        now = f"running line {s.line} (hit {fmt_count(hits)}): <code>{escape(first[:80])}</code>"
    else:
        now = "between statements"
    xs = [p[0] for p in timeline]
    chart = Chart(
        series=[
            Series("peak", xs, [p[3] for p in timeline], color="#f0ad4e"),
            Series("allocated", xs, [p[1] for p in timeline], color="#3b7dd8", fill=True),
        ],
        width=420,
        height=110,
        title=f"{status.device_label}: memory over the statements so far",
        y_min=0.0,
        y_format=fmt_bytes,
        y_label="seconds",
    )
    elapsed = xs[-1] if xs else 0.0
    body = (
        f"<div><b>%%memtrace</b> {now} · {elapsed:.1f} s · "
        f"allocated {fmt_bytes(timeline[-1][1] if timeline else 0)}</div>" + chart_image(chart)
    )
    return wrap("memtrace-live", body)
