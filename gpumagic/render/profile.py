"""The ``%%gpuprofile`` report, declared once for text and HTML.

The summary comes first (step time, utilisation, the breakdown as one stacked bar, the
findings ranked by saving with their fixes), then the detail (per line, per module,
per rank, communication, the per-step timeline, idle time, operators, kernels). Everything
is read from the result's public tables and summary. HTML has no script element: tables
are sorted by time and cut to ``rows``, and a header click re-sorts them where the front
end runs an output's handlers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpumagic.render.comms import communication_sections
from gpumagic.render.comms import headline_items as comms_headline_items
from gpumagic.render.html import escape, swatch
from gpumagic.render.profile_code import lines_sections, modules_sections, where_html, where_text
from gpumagic.render.ranks import slow_ranks_sections
from gpumagic.render.sections import (
    Figure,
    Heading,
    KeyValues,
    Paragraph,
    Report,
    Section,
    only,
    sub_span,
)
from gpumagic.render.svg import svg_image, svg_open
from gpumagic.render.table import Column, Table, finite
from gpumagic.units import fmt_count, fmt_interval, fmt_named, fmt_number, fmt_percent, fmt_us

if TYPE_CHECKING:
    from gpumagic.profile.result import ProfileResult
    from gpumagic.profile.rules.base import Finding
    from gpumagic.profile.summary import ProfileSummary

CATEGORY_COLORS = {
    "Kernel": "#3b7dd8",
    "Memcpy": "#8e6bbf",
    "Memset": "#c3a3e3",
    "Communication": "#17a2b8",
    "Runtime": "#f0ad4e",
    "DataLoader": "#d9534f",
    "CPU Exec": "#5cb85c",
    "Other": "#b0b0b0",
}
# The letter of each category in the text form's one-line breakdown bar.
CATEGORY_LETTERS = dict(zip(CATEGORY_COLORS, "KMSNRDC."))
SEVERITY_COLORS = {"high": "#d9534f", "medium": "#f0ad4e", "low": "#888888"}
IDLE_COLORS = {"host_wait": "#d9534f", "kernel_wait": "#f0ad4e", "other": "#b0b0b0"}
_NAME_CHARS = 60, 90  # text, HTML: kernel names run to thousands of characters


def _steps_label(s: ProfileSummary) -> str:
    names = s.step_names
    if s.steps_from == "ProfilerStep" and names:
        label = f"ProfilerStep {names[0]}" + (f"-{names[-1]}" if len(names) > 1 else "")
    elif s.steps_from == "DataLoader":
        label = "one per DataLoader batch"
    elif s.startup_left_out:
        label = "no step marks: the trace after its start-up phase is one step"
    else:
        label = "the whole trace (no step marks)"
    if s.first_step_left_out:
        label += "; the first (setup) left out, --keep-first keeps it"
    if s.steps_dropped:
        label += f"; the last {s.steps_dropped} dropped: its GPU work was not all recorded"
    return label


def _steps_count(s: ProfileSummary) -> str:
    """The step count: "6", or "5 of 6" when steps were left out of the statistics."""
    recorded = s.steps + int(bool(s.first_step_left_out)) + s.steps_dropped
    return f"{s.steps} of {recorded}" if recorded != s.steps else str(s.steps)


def _step_time(s: ProfileSummary) -> str:
    """Mean, min and max of the steps, and where there are enough steps, the median with
    its 95% interval (over every run of ``--repeat N``)."""
    spread = f"min {fmt_us(s.step_time_min_us)}, max {fmt_us(s.step_time_max_us)}"
    text = f"{fmt_us(s.step_time_us)} ({spread})"
    interval = s.step_time_median_interval_us
    runs = s.runs
    if runs > 1:
        text = f"this run {text}"
    if interval is not None:
        over = f" over {runs} runs" if runs > 1 else ""
        text = (
            f"median {fmt_us(s.step_time_median_us)} "
            f"({fmt_interval(interval, fmt_us)}){over}; mean {text}"
        )
    return text


def _headline_items(r: ProfileResult) -> list[tuple[str, str]]:
    s = r.summary
    items = [
        ("wall time", fmt_us(s.wall_time_us)),
        ("steps", f"{_steps_count(s)} ({_steps_label(s)})"),
    ]
    if s.startup:
        kept = (
            "left out of every figure below (--keep-startup keeps it)"
            if s.startup_left_out
            else "counted in the step"
        )
        items.append(("start-up", f"{fmt_us(s.startup_us)}, {kept}: {s.startup}"))
    items.append(("step time", _step_time(s)))
    if s.cpu_only:
        items.append(("GPU", "none in this trace (CPU-only analysis)"))
    else:
        # communication kernels do not count as utilisation; say so where there are some
        util = (
            "GPU utilisation (compute kernels)"
            if s.communication_busy_percent
            else "GPU utilisation"
        )
        value = fmt_percent(s.gpu_utilization_percent)
        if s.communication_busy_percent and s.communication_overlap_percent is not None:
            value += f"; communication {fmt_percent(s.communication_busy_percent)} of the steps"
        items.append((util, value))
        if s.sm_efficiency_percent is not None:
            items.append(("est. SM efficiency", fmt_percent(s.sm_efficiency_percent)))
        if s.achieved_occupancy_percent is not None:
            items.append(("achieved occupancy", fmt_percent(s.achieved_occupancy_percent)))
        items.append(("GPU idle", f"{fmt_us(s.gpu_idle_us_per_step)} per step"))
    items += comms_headline_items(r)
    if s.ranks > 1:
        items.append(
            ("ranks", f"{s.ranks}, slowest: rank {s.slowest_rank} (tables below are its)")
        )
    return items


def _title(r: ProfileResult) -> str:
    s = r.summary
    devices = ", ".join(s.devices) if s.devices else ("CPU only" if s.cpu_only else "")
    rank = f", rank {s.rank}" if s.rank is not None and s.ranks == 1 else ""
    return f"{r.name}{rank}" + (f" ({devices})" if devices else "")


# --- the breakdown -----------------------------------------------------------------------


def text_bar(percent: dict[str, float], width: int = 50) -> str:
    """The breakdown as one line of letters, one per category (``[KKKKDDD...]``)."""
    letters = "".join(CATEGORY_LETTERS[c] * round(width * p / 100.0) for c, p in percent.items())
    return "[" + letters[:width].ljust(width) + "]"


def stacked_bar(percent: dict[str, float], width_px: int = 480, height_px: int = 16) -> str:
    """The breakdown as one horizontal bar of coloured segments (an image), with a legend."""
    rects, x = [], 0.0
    for cat, p in percent.items():
        w = width_px * max(p, 0.0) / 100.0
        if w <= 0:
            continue
        rects.append(
            f'<rect x="{x:.2f}" y="0" width="{w:.2f}" height="{height_px}" '
            f'fill="{CATEGORY_COLORS[cat]}"><title>{escape(cat)}: {escape(fmt_percent(p))}</title></rect>'
        )
        x += w
    svg = (
        f"{svg_open(width_px, height_px)}{''.join(rects)}"
        f'<rect x="0.5" y="0.5" width="{width_px - 1}" height="{height_px - 1}" fill="none" '
        'stroke="rgba(128,128,128,0.5)"/></svg>'
    )
    alt = "step time: " + ", ".join(
        f"{c} {fmt_percent(p)}" for c, p in percent.items() if p > 0
    )
    legend = " ".join(
        f'<span style="white-space:nowrap">{swatch(CATEGORY_COLORS[c])} {escape(c)} '
        f"{escape(fmt_percent(p))}</span>"
        for c, p in percent.items()
    )
    return (
        f'<div class="gm-stack">{svg_image(svg, width_px, height_px, alt, "gm-stack-bar")}</div>'
        f'<div class="gm-note" style="margin:3px 0 6px 0;color:#888">{legend}</div>'
    )


def category_column(header: str = "category") -> Column:
    """A breakdown category, with its colour's swatch in HTML."""
    return Column(header, "category", align="left", swatch=lambda c: CATEGORY_COLORS[str(c)])


def _breakdown_sections(r: ProfileResult) -> list[Section]:
    percent = r.summary.breakdown_percent
    rows = [{"category": c, **row} for c, row in r.breakdown.to_dict("index").items()]
    return [
        Heading(
            "Step-time breakdown",
            "mean per step; each instant of a step counted once, Kernel > Memcpy > Memset > "
            "Communication > Runtime > DataLoader > CPU Exec > Other",
        ),
        Figure(stacked_bar(percent), [text_bar(percent)]),
        Table(
            [
                category_column(),
                Column("mean per step", "us", fmt_us),
                Column("share", "percent", fmt_percent),
            ],
            rows,
        ),
    ]


# --- findings ----------------------------------------------------------------------------


@dataclass
class FindingBlock:
    """One finding: title, severity, rule and saving; where it points; what was seen (with
    its evidence); the fix, and its code."""

    number: int
    finding: Finding

    def _saving(self) -> str:
        f = self.finding
        return f"saves ~{fmt_us(f.saving_us)} per step" if f.saving_us > 0 else "no time estimate"

    def _evidence(self) -> list[tuple[str, str]]:
        return [(k, fmt_named(k, v)) for k, v in self.finding.evidence.items()]

    def text(self) -> list[str]:
        f = self.finding
        confirmed = " (confirmed by the session)" if f.confirmed else ""
        lines = [f"{self.number}. [{f.severity}] {f.title} ({f.rule}): {self._saving()}{confirmed}"]
        lines += [where_text(f)] if where_text(f) else []
        lines.append(f.message)
        if self._evidence():
            lines.append("evidence: " + "; ".join(f"{k} {v}" for k, v in self._evidence()))
        lines += [f"fix: {f.fix}"] if f.fix else []
        lines += [f"| {code}" for code in f.snippet.splitlines()]
        return [lines[0], *(f"   {line}" for line in lines[1:])]

    def html(self) -> str:
        f = self.finding
        color = SEVERITY_COLORS.get(f.severity, "#888")
        confirmed = sub_span("(confirmed by the session)") if f.confirmed else ""
        snippet = f'<pre class="gm-snippet">{escape(f.snippet)}</pre>' if f.snippet else ""
        box = (
            f"border-left:3px solid {color};padding:4px 10px;margin:6px 0;"
            "background:rgba(128,128,128,0.06)"
        )
        return (
            f'<div class="gm-box gm-finding" data-rule="{escape(f.rule)}" style="{box}">'
            f"<b>{self.number}. {escape(f.title)}</b> "
            f'<span style="color:{color}">[{escape(f.severity)}]</span>'
            f"{sub_span(f'{f.rule} · {self._saving()}')}{confirmed}"
            f"{where_html(f)}<div>{escape(f.message)}</div>{KeyValues(self._evidence()).html()}"
            f"<div><b>Fix:</b> {escape(f.fix)}</div>{snippet}</div>"
        )


def _findings_sections(r: ProfileResult) -> list[Section]:
    if not r.findings:
        return [Paragraph("No findings: no rule matched this run.", "info")]
    return [
        Heading("Findings", "ranked by estimated saving per step"),
        *(FindingBlock(i, f) for i, f in enumerate(r.findings, 1)),
    ]


# --- ranks, steps, idle ------------------------------------------------------------------


def _per_rank_sections(r: ProfileResult) -> list[Section]:
    s = r.summary
    if s.ranks < 2:
        return []
    columns = [
        Column("rank", lambda x: f"{x['rank']}" + (" (slowest)" if x["slowest"] else ""), align="left"),
        Column("file", "file", align="left"),
        Column("steps", "steps"),
        Column("step time", "step_time_us", fmt_us),
        Column("GPU util", "gpu_utilization_percent", fmt_percent),
        Column("GPU idle/step", "gpu_idle_us_per_step", fmt_us),
        *(Column(c, f"{c}_percent", fmt_percent) for c in CATEGORY_COLORS),
        Column("comm overlap", "communication_overlap_percent", finite(fmt_percent)),
        Column("coll. wait/step", "collective_wait_us_per_step", finite(fmt_us)),
    ]
    rows = r.per_rank.to_dict("records")
    return [
        Heading("Per rank", f"slowest: rank {s.slowest_rank}"),
        Table(columns, rows, highlight=lambda x: "hot" if x["slowest"] else ""),
        *slow_ranks_sections(r),
    ]


def timeline_svg(r: ProfileResult, width: int = 640) -> str:
    """Per-step stacked bars (scaled to the longest step) under a GPU busy/idle strip, as an
    image (:func:`gpumagic.render.svg.svg_image`)."""
    steps = r.steps
    if len(steps) == 0:
        return ""
    label_w, row_h, gap = 110, 12, 4
    plot_w = width - label_w - 70
    strip_h = 0 if r.summary.cpu_only else 14
    height = 18 + strip_h + (row_h + gap) * len(steps) + 6
    out = [svg_open(width, height)]
    y = 4
    if strip_h:
        out.append(
            f'<text x="{label_w - 4}" y="{y + 10}" text-anchor="end" class="fg">GPU busy</text>'
            f'<rect x="{label_w}" y="{y}" width="{plot_w}" height="{strip_h - 2}" fill="#eeeeee" '
            f'stroke="rgba(128,128,128,0.4)" stroke-width="0.5"><title>idle</title></rect>'
        )
        for px, f in enumerate(r.gpu_busy(plot_w).tolist()):
            if f > 0.02:
                out.append(
                    f'<rect x="{label_w + px}" y="{y}" width="1" height="{strip_h - 2}" '
                    f'fill="{CATEGORY_COLORS["Kernel"]}" fill-opacity="{min(f, 1.0):.2f}"/>'
                )
        out.append(
            f'<text x="{label_w + plot_w + 4}" y="{y + 10}" class="dim">'
            f"{escape(fmt_percent(r.summary.gpu_utilization_percent or 0))}</text>"
        )
        y += strip_h + 4
    longest = float(steps["duration_us"].max()) or 1.0
    for step in steps.to_dict("records"):
        name = escape(step["step"])
        x = float(label_w)
        out.append(
            f'<text x="{label_w - 4}" y="{y + row_h - 2}" text-anchor="end" class="fg">'
            f"step {name}</text>"
        )
        for cat, color in CATEGORY_COLORS.items():
            us = float(step[f"{cat}_us"])
            w = plot_w * us / longest
            if w <= 0:
                continue
            out.append(
                f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h}" fill="{color}">'
                f"<title>step {name}: {escape(cat)} {escape(fmt_us(us))}</title></rect>"
            )
            x += w
        out.append(
            f'<text x="{x + 4:.2f}" y="{y + row_h - 2}" class="dim">'
            f"{escape(fmt_us(float(step['duration_us'])))}</text>"
        )
        y += row_h + gap
    out.append("</svg>")
    return svg_image("".join(out), width, height, _timeline_alt(r), "gm-timeline")


def _timeline_alt(r: ProfileResult) -> str:
    durations = r.steps["duration_us"].astype(float)
    busy = (
        ""
        if r.summary.cpu_only
        else f"; GPU busy {fmt_percent(r.summary.gpu_utilization_percent or 0)}"
    )
    return (
        f"{len(durations)} steps, {fmt_us(float(durations.min()))} to "
        f"{fmt_us(float(durations.max()))}, each split by category{busy}"
    )


def _steps_text(r: ProfileResult, rows: int) -> list[str]:
    """The timeline's numbers for the text form: each step's length and its two largest
    categories (the first ``rows`` steps)."""
    lines = []
    records = r.steps.to_dict("records")
    for step in records[:rows]:
        parts = sorted(
            ((float(step[f"{c}_us"]), c) for c in CATEGORY_COLORS), reverse=True
        )[:2]
        top = ", ".join(f"{c} {fmt_us(us)}" for us, c in parts if us > 0)
        lines.append(f"  step {step['step']}: {fmt_us(float(step['duration_us']))} ({top})")
    if len(records) > rows:
        lines.append(f"  ... {len(records) - rows} more steps in .steps")
    return lines


def _cpu_meanwhile(ops: list[tuple[str, float]]) -> str:
    return "; ".join(f"{name} {fmt_us(us)}" for name, us in ops)


def _cpu_meanwhile_html(ops: list[tuple[str, float]]) -> str:
    return "<br>".join(
        f"{escape(name if len(name) <= 70 else name[:69] + '…')}{sub_span(fmt_us(us))}"
        for name, us in ops
    )


def _idle_sections(r: ProfileResult, rows: int) -> list[Section]:
    s = r.summary
    if s.cpu_only:
        return []
    split = s.gpu_idle_split_us_per_step or {}
    idle = r.idle
    sections: list[Section] = [
        Heading(
            "GPU idle",
            "inside the steps, per step; split as Holistic Trace Analysis does (host_wait: the "
            "CPU launched too late; kernel_wait: gaps under 30 µs between kernels)",
        ),
        KeyValues(
            [("idle", fmt_us(s.gpu_idle_us_per_step))]
            + [(k, fmt_us(v)) for k, v in split.items()]
        ),
    ]
    if not idle.streams.empty:
        sections.append(
            Table(
                [
                    Column("device", "device", align="left"),
                    Column("stream", "stream", align="left"),
                    Column("events", "events", fmt_count),
                    *(
                        Column(h, f"{h}_us", fmt_us)
                        for h in ("busy", "host_wait", "kernel_wait", "other")
                    ),
                ],
                idle.streams.to_dict("records"),
            )
        )
    if not idle.gaps.empty:
        sections += [
            Heading("Longest gaps", "with the CPU operators that ran meanwhile"),
            Table(
                [
                    Column("step", "step", align="left"),
                    Column("at", "start_us", fmt_us),
                    Column("gap", "us", fmt_us),
                    Column("why", "category", align="left", color=IDLE_COLORS.get),
                    Column(
                        "CPU meanwhile",
                        "cpu_ops",
                        _cpu_meanwhile,
                        align="left",
                        chars=120,
                        html=_cpu_meanwhile_html,
                    ),
                ],
                idle.gaps.head(rows).to_dict("records"),
            ),
        ]
    return sections


# --- operators and kernels ---------------------------------------------------------------


def _name_column(header: str) -> Column:
    return Column(header, "name", align="code", chars=_NAME_CHARS[0], html_chars=_NAME_CHARS[1])


def _ops_sections(r: ProfileResult, rows: int) -> list[Section]:
    ops = r.ops
    if ops.empty:
        return []
    return [
        Heading(
            "Operators",
            f"top {min(rows, len(ops))} of {fmt_count(len(ops))} by device time, whole trace",
        ),
        Table(
            [
                _name_column("operator"),
                Column("calls", "calls", fmt_count),
                Column("host self", "host_self_us", fmt_us),
                Column("host total", "host_total_us", fmt_us),
                Column("device self", "device_self_us", fmt_us),
                Column("device total", "device_total_us", fmt_us),
            ],
            ops.head(rows).to_dict("records"),
            sortable=True,
        ),
    ]


def _kernels_sections(r: ProfileResult, rows: int) -> list[Section]:
    kernels = r.kernels
    if kernels.empty:
        return []
    return [
        Heading(
            "Kernels", f"top {min(rows, len(kernels))} of {fmt_count(len(kernels))} by total time"
        ),
        Table(
            [
                _name_column("kernel"),
                Column("calls", "calls", fmt_count),
                Column("total", "total_us", fmt_us),
                Column("share", "percent", fmt_percent),
                Column("mean", "mean_us", fmt_us),
                Column("max", "max_us", fmt_us),
                Column("blocks/SM", "blocks_per_sm", fmt_number),
                Column("occupancy", "occupancy_percent", fmt_percent),
            ],
            kernels.head(rows).to_dict("records"),
            sortable=True,
        ),
    ]


# --- the report --------------------------------------------------------------------------


def profile_report(r: ProfileResult, rows: int) -> Report:
    """The whole report, ``rows`` rows in each table (the result chooses how many:
    :meth:`~gpumagic.profile.result.ProfileResult.table_rows`)."""
    sections: list[Section] = [
        *(Paragraph(n, "box", prefix="note: ", css="gm-record-note") for n in r.notes),
        KeyValues(_headline_items(r)),
        *_breakdown_sections(r),
        *_findings_sections(r),
        *lines_sections(r),
        *modules_sections(r, rows),
        *_per_rank_sections(r),
        *communication_sections(r, rows),
        only("html", Heading("Steps", "each step's breakdown, scaled to the longest")),
        *([only("text", Heading("Steps", "each step's time and its two largest parts"))]
          if len(r.steps) else []),
        Figure(lambda: timeline_svg(r), lambda: _steps_text(r, rows)),
        *_idle_sections(r, min(rows, 10)),
        *_ops_sections(r, rows),
        *_kernels_sections(r, rows),
    ]
    s = r.summary
    found = f"{len(r.findings)} finding{'s' if len(r.findings) != 1 else ''}"
    summary = f"%%gpuprofile {_title(r)}: step time {fmt_us(s.step_time_us)}, {found}"
    return Report("profile", "%%gpuprofile", _title(r), sections, summary=summary)


def report_document(r: ProfileResult, rows: int) -> str:
    """A standalone HTML page: the same report, no scripts and no external resources."""
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>gpumagic profile: {escape(r.name)}</title></head><body>"
        f"{profile_report(r, rows).html()}</body></html>\n"
    )
