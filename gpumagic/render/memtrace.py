"""HTML and text for the ``%%memtrace`` result, and its live view while the cell runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumagic.device_kinds import HOST
from gpumagic.memory.oom import OomReport
from gpumagic.render.html import bar, escape, kv, table, text_table, wrap
from gpumagic.render.svg import Chart, Series, render_chart
from gpumagic.units import fmt_bytes, fmt_count, fmt_us

if TYPE_CHECKING:
    from gpumagic.memory.report import MemTrace
    from gpumagic.memory.run import MemtraceStatus


def _header_text(self: MemTrace) -> str:
    status = f"  FAILED at line {_error_line(self)}: {self.error}" if self.error else ""
    return (
        f"%%memtrace on {self.device.label} ({self.device.why})\n"
        f"cell peak {fmt_bytes(self.cell_peak)} ({fmt_bytes(self.peak_above_start, signed=True)} above start), "
        f"net change {fmt_bytes(self.net_change, signed=True)}, "
        f"reserved {fmt_bytes(self.final_reserved)}, time {fmt_us(self.elapsed_ns / 1000)}{status}"
    )


def _error_line(self: MemTrace) -> int | None:
    if self.error_index < 0:
        return None
    return self.statements[self.error_index].line


def memtrace_text(self: MemTrace) -> str:
    rows = []
    hot = self._hot()
    for s in self._ran():
        i = s.index
        mark = "!" if i == self.error_index else ("*" if i in hot else " ")
        src = ("  " * s.depth + s.source.splitlines()[0])[:60]
        rows.append(
            [
                f"{mark}{s.line}",
                fmt_count(self.hits[i]),
                fmt_bytes(self.delta[i], signed=True),
                fmt_bytes(self.peak[i]),
                fmt_bytes(self.after[i]),
                fmt_us(self.time_ns[i] / 1000),
                src,
            ]
        )
    body = text_table(
        ["line", "hits", "delta", "peak", "allocated", self.time_label, "source"], rows, left=[6]
    )
    parts = [_header_text(self), body]
    parts.extend(f"note: {n}" for n in (self.time_note, *self.notes) if n)
    if self.oom is not None:
        parts.append(oom_text(self.oom))
    return "\n".join(parts)


def memtrace_html(self: MemTrace) -> str:
    ran = self._ran()
    hot = self._hot()
    host_cols = self.device.kind != HOST
    scale = max([abs(self.delta[s.index]) for s in ran] + [self.peak[s.index] for s in ran] + [1])
    # On the host, allocated and reserved are both the RSS: one column says it.
    headers = [
        "line",
        "statement",
        "hits",
        self.time_label,
        "Δ allocated",
        "peak in statement",
        "allocated after",
    ]
    if host_cols:
        headers += ["reserved after", "host Δ", "host peak"]
    if self.has_breakdown:
        headers += ["params", "grads", "optimizer", "other"]
    rows, classes, titles = [], [], []
    for s in ran:
        i = s.index
        d = self.delta[i]
        first = s.source.splitlines()[0] if s.source else ""
        more = " …" if "\n" in s.source else ""
        cells = [
            str(s.line),
            "&nbsp;" * (4 * s.depth) + escape(first) + more,
            fmt_count(self.hits[i]),
            fmt_us(self.time_ns[i] / 1000),
            fmt_bytes(d, signed=True)
            + " "
            + bar(abs(d) / scale, "#d9534f" if d > 0 else "#5cb85c", 60),
            fmt_bytes(self.peak[i]) + " " + bar(self.peak[i] / scale, "#f0ad4e", 60),
            fmt_bytes(self.after[i]),
        ]
        if host_cols:
            cells += [
                fmt_bytes(self.reserved_after[i]),
                fmt_bytes(self.host_delta[i], signed=True),
                fmt_bytes(self.host_peak[i]),
            ]
        if self.has_breakdown:
            p = self.parts[i]
            if p is None:
                cells += ["–"] * 4
            else:
                cells += [fmt_bytes(v) for v in (*p, max(self.after[i] - sum(p), 0))]
        rows.append(cells)
        classes.append("gm-error" if i == self.error_index else ("gm-hot" if i in hot else ""))
        titles.append(s.source)
    summary = kv(
        [
            ("device", escape(self.device.label)),
            (
                "cell peak",
                f"{fmt_bytes(self.cell_peak)} ({fmt_bytes(self.peak_above_start, signed=True)})",
            ),
            ("net change", fmt_bytes(self.net_change, signed=True)),
            ("reserved at end", fmt_bytes(self.final_reserved)),
            *(
                [("host RSS change", fmt_bytes(self.host_final - self.host_initial, signed=True))]
                if host_cols
                else []
            ),
            ("time", fmt_us(self.elapsed_ns / 1000)),
        ]
    )
    title = "<h4>%%memtrace"
    if self.error:
        title += f' <span class="gm-warn">failed at line {_error_line(self)}: {escape(self.error)}</span>'
    title += "</h4>"
    notes = f'<div class="gm-note">Tracking {escape(self.device.label)}: {escape(self.device.why)}.'
    if self.has_breakdown:
        notes += " Params/grads/optimizer/other: memory after the statement by owner."
    notes += " Highlighted rows: heaviest statements."
    for extra in (self.time_note, *self.notes):
        if extra:
            notes += " " + escape(extra if extra.endswith(".") else extra + ".")
    notes += "</div>"
    body = (
        title
        + summary
        + table(headers, rows, left=[1], code=[1], row_classes=classes, title_attr=titles)
        + notes
    )
    if self.oom is not None:
        body += oom_html(self.oom)
    return wrap("memtrace", body)


def _asked_and_free(report: OomReport) -> tuple[str, str]:
    """The request and the free memory, with more digits when they would print alike
    ("asked for 32.0 MiB; free 32.0 MiB" reads as a contradiction)."""
    asked, free = fmt_bytes(report.requested), fmt_bytes(report.free)
    if report.requested is not None and report.free is not None and asked == free:
        asked, free = fmt_bytes(report.requested, digits=3), fmt_bytes(report.free, digits=3)
    return asked, free


def oom_text(report: OomReport) -> str:
    asked, free = _asked_and_free(report)
    lines = [f"Out of memory on {report.device}: {report.exception}"]
    lines.append(
        f"  asked for {asked}; free {free}"
        + (f" of {fmt_bytes(report.total)}" if report.total else "")
        + (f"; allocated {fmt_bytes(report.allocated)}" if report.allocated is not None else "")
        + (
            f"; reserved but unallocated {fmt_bytes(report.reserved_unallocated)}"
            if report.reserved_unallocated is not None
            else ""
        )
    )
    if report.requested_note:
        lines.append(f"  asked for: {report.requested_note}")
    if report.limit_note:
        lines.append(f"  note: {report.limit_note}")
    if report.released:
        lines.append(f"  released with the failed call's frames: {fmt_bytes(report.released)}")
    if report.holders:
        lines.append("  largest live tensors:")
        for h in report.holders[:10]:
            lines.append(
                f"    {fmt_bytes(h.nbytes):>10}  {h.name}  ({h.role}, {list(h.shape)}, {h.dtype})"
            )
    if report.unnamed_count:
        lines.append(
            f"    {fmt_bytes(report.unnamed_bytes):>10}  in {report.unnamed_count} tensors no variable names"
        )
    lines.append("  what to try:")
    lines.extend(f"    - {a}" for a in report.advice)
    return "\n".join(lines)


def oom_html(report: OomReport) -> str:
    asked, free = _asked_and_free(report)
    facts = [
        ("asked for", asked),
        ("free", free + (f" of {fmt_bytes(report.total)}" if report.total else "")),
    ]
    if report.allocated is not None:
        facts.append(("allocated", fmt_bytes(report.allocated)))
    if report.reserved_unallocated is not None:
        frag = fmt_bytes(report.reserved_unallocated)
        if report.fragmented:
            frag = f'<span class="gm-warn">{frag} (fragmented)</span>'
        facts.append(("reserved but unallocated", frag))
    if report.released:
        facts.append(("released with the failed call's frames", fmt_bytes(report.released)))
    out = [
        f'<div class="gm-box"><b>Out of memory on {escape(report.device)}</b>: {escape(report.exception)}'
    ]
    out.append(kv(facts))
    if report.requested_note:
        out.append(f'<div class="gm-note">Asked for: {escape(report.requested_note)}.</div>')
    if report.limit_note:
        out.append(f'<div class="gm-note">{escape(report.limit_note)}</div>')
    if report.holders or report.unnamed_count:
        rows = [
            [
                fmt_bytes(h.nbytes),
                escape(h.name),
                escape(h.role),
                escape(str(list(h.shape))),
                escape(h.dtype),
            ]
            for h in report.holders[:10]
        ]
        if report.unnamed_count:
            rows.append(
                [
                    fmt_bytes(report.unnamed_bytes),
                    f"<i>{report.unnamed_count} tensors no variable names</i>",
                    "",
                    "",
                    "",
                ]
            )
        out.append("<div>Largest live tensors:</div>")
        out.append(
            table(["size", "held by", "role", "shape", "dtype"], rows, left=[1, 2], code=[1])
        )
    out.append(
        "<div>What to try:</div><ul>"
        + "".join(f"<li>{escape(a)}</li>" for a in report.advice)
        + "</ul>"
    )
    out.append("</div>")
    return "".join(out)


def memtrace_live_html(status: MemtraceStatus) -> str:
    """The live view while a cell runs: the statement running now, its hits, memory so far.

    Drawn from the run's status (:meth:`gpumagic.memory.run.MemtraceRun.status`), which the
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
        f"allocated {fmt_bytes(timeline[-1][1] if timeline else 0)}</div>" + render_chart(chart)
    )
    return wrap("memtrace-live", body)
