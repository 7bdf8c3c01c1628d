"""Text and HTML for ``%%gpuprofile`` results and comparisons.

The summary comes first (step time, utilisation, the breakdown as one stacked bar, the
findings ranked by saving with their fixes), then the detail (per-rank table, per-step
timeline, idle time, operators, kernels). HTML has no script: JupyterLab drops scripts
from untrusted outputs, so tables are sorted by time and cut to ``rows``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from gpumagic.render.comms import communication_html, communication_text
from gpumagic.render.comms import headline_items as comms_headline_items
from gpumagic.render.html import escape, kv, table, text_table, wrap
from gpumagic.render.profile_code import (
    lines_html,
    lines_text,
    modules_html,
    modules_text,
    where_html,
    where_text,
)
from gpumagic.render.ranks import slow_ranks_html, slow_ranks_text
from gpumagic.units import fmt_bytes, fmt_count, fmt_percent, fmt_us

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.profile.result import ProfileResult
    from gpumagic.profile.rules.base import Finding

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
SEVERITY_COLORS = {"high": "#d9534f", "medium": "#f0ad4e", "low": "#888888"}
_IDLE_COLORS = {"host_wait": "#d9534f", "kernel_wait": "#f0ad4e", "other": "#b0b0b0"}
_NAME_CHARS = 90  # kernel names run to thousands of characters


def _short(name: str, n: int = _NAME_CHARS) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


def _steps_label(s: dict[str, Any]) -> str:
    names = s["step_names"]
    if s["steps_from"] == "ProfilerStep" and names:
        label = f"ProfilerStep {names[0]}" + (f"-{names[-1]}" if len(names) > 1 else "")
    elif s["steps_from"] == "DataLoader":
        label = "one per DataLoader batch"
    else:
        label = "the whole trace (no step marks)"
    if s.get("first_step_left_out"):
        label += "; the first (setup) left out, --keep-first keeps it"
    if s["steps_dropped"]:
        label += f"; the last {s['steps_dropped']} dropped: its GPU work was not all recorded"
    return label


def _steps_count(s: dict[str, Any]) -> str:
    """The step count: "6", or "5 of 6" when steps were left out of the statistics."""
    recorded = s["steps"] + int(bool(s.get("first_step_left_out"))) + s["steps_dropped"]
    return f"{s['steps']} of {recorded}" if recorded != s["steps"] else str(s["steps"])


def _pct(value: float | None) -> str:
    return fmt_percent(value) if value is not None else "–"


def _headline_items(r: ProfileResult) -> list[tuple[str, str]]:
    s = r.summary
    items = [
        ("wall time", fmt_us(s["wall_time_us"])),
        ("steps", f"{_steps_count(s)} ({_steps_label(s)})"),
        (
            "step time",
            f"{fmt_us(s['step_time_us'])} (min {fmt_us(s['step_time_min_us'])}, max {fmt_us(s['step_time_max_us'])})",
        ),
    ]
    if s["cpu_only"]:
        items.append(("GPU", "none in this trace (CPU-only analysis)"))
    else:
        # communication kernels do not count as utilisation; say so where there are some
        util = (
            "GPU utilisation (compute kernels)"
            if s["communication_busy_percent"]
            else "GPU utilisation"
        )
        value = _pct(s["gpu_utilization_percent"])
        if s["communication_busy_percent"] and s["communication_overlap_percent"] is not None:
            value += f"; communication {_pct(s['communication_busy_percent'])} of the steps"
        items.append((util, value))
        if s["sm_efficiency_percent"] is not None:
            items.append(("est. SM efficiency", _pct(s["sm_efficiency_percent"])))
        if s["achieved_occupancy_percent"] is not None:
            items.append(("achieved occupancy", _pct(s["achieved_occupancy_percent"])))
        items.append(("GPU idle", f"{fmt_us(s['gpu_idle_us_per_step'])} per step"))
    items += comms_headline_items(r)
    if s["ranks"] > 1:
        items.append(
            ("ranks", f"{s['ranks']}, slowest: rank {s['slowest_rank']} (tables below are its)")
        )
    return items


def _title(r: ProfileResult) -> str:
    s = r.summary
    devices = ", ".join(s["devices"]) if s["devices"] else ("CPU only" if s["cpu_only"] else "")
    rank = f", rank {s['rank']}" if s["rank"] is not None and s["ranks"] == 1 else ""
    return f"{r.name}{rank}" + (f" ({devices})" if devices else "")


# --- text --------------------------------------------------------------------------------


def _text_bar(percent: dict[str, float], width: int = 50) -> str:
    out = []
    for cat, p in percent.items():
        n = round(width * p / 100.0)
        if n:
            out.append(
                {
                    "Kernel": "K",
                    "Memcpy": "M",
                    "Memset": "S",
                    "Communication": "N",
                    "Runtime": "R",
                    "DataLoader": "D",
                    "CPU Exec": "C",
                    "Other": ".",
                }[cat]
                * n
            )
    return "[" + "".join(out)[:width].ljust(width) + "]"


def _finding_text(i: int, f: Finding) -> list[str]:
    saving = f"saves ~{fmt_us(f.saving_us)}/step" if f.saving_us > 0 else "no time estimate"
    confirmed = " (confirmed by the session)" if f.confirmed else ""
    lines = [f"{i}. [{f.severity}] {f.title} ({f.rule}): {saving}{confirmed}"]
    if where_text(f):
        lines.append(f"   {where_text(f)}")
    lines.append(f"   {f.message}")
    if f.fix:
        lines.append(f"   fix: {f.fix}")
    for code in f.snippet.splitlines():
        lines.append(f"   | {code}")
    return lines


def profile_text(r: ProfileResult, rows: int = 10) -> str:
    s = r.summary
    lines = [f"%%gpuprofile {_title(r)}"]
    lines += [f"  note: {n}" for n in r.notes]
    lines += [f"  {k}: {v}" for k, v in _headline_items(r)]
    bd = r.breakdown
    lines.append("")
    lines.append("Step-time breakdown (mean per step)  " + _text_bar(s["breakdown_percent"]))
    lines.append(
        text_table(
            ["category", "time", "share"],
            [[str(c), fmt_us(row.us), fmt_percent(row.percent)] for c, row in bd.iterrows()],
            left=[0],
        )
    )
    if r.findings:
        lines.append("")
        lines.append("Findings, by estimated saving per step")
        for i, f in enumerate(r.findings, 1):
            lines.extend(_finding_text(i, f))
    else:
        lines.append("")
        lines.append("Findings: none; no rule matched this run.")
    lines += lines_text(r)
    lines += modules_text(r, rows)
    if s["ranks"] > 1:
        lines.append("")
        lines.append("Per rank")
        lines.append(_per_rank_text(r))
        lines += slow_ranks_text(r)
    comm = communication_text(r, rows)
    if comm:
        lines += ["", comm]
    if not s["cpu_only"]:
        idle = r.idle
        n = max(s["steps"], 1)
        lines.append("")
        split = ", ".join(f"{k} {fmt_us(v / n)}" for k, v in idle.device_us.items())
        lines.append(f"GPU idle per step: {fmt_us(sum(idle.device_us.values()) / n)} ({split})")
        if not idle.gaps.empty:
            gap_rows = []
            for g in idle.gaps.head(min(rows, 5)).itertuples():
                ops = "; ".join(f"{_short(name, 50)} {fmt_us(us)}" for name, us in g.cpu_ops)
                gap_rows.append([g.step, fmt_us(g.us), g.category, ops])
            lines.append(
                text_table(["step", "gap", "why", "CPU meanwhile"], gap_rows, left=[0, 2, 3])
            )
    ops = r.ops.head(rows)
    if not ops.empty:
        lines.append("")
        lines.append(f"Top operators (of {fmt_count(len(r.ops))}, whole trace)")
        lines.append(
            text_table(
                ["operator", "calls", "host self", "host total", "device self", "device total"],
                [
                    [
                        _short(o.name, 60),
                        fmt_count(o.calls),
                        fmt_us(o.host_self_us),
                        fmt_us(o.host_total_us),
                        fmt_us(o.device_self_us),
                        fmt_us(o.device_total_us),
                    ]
                    for o in ops.itertuples()
                ],
                left=[0],
            )
        )
    kernels = r.kernels.head(rows)
    if not kernels.empty:
        lines.append("")
        lines.append(f"Top kernels (of {fmt_count(len(r.kernels))})")
        lines.append(
            text_table(
                ["kernel", "calls", "total", "mean", "max", "blocks/SM", "occupancy"],
                [
                    [
                        _short(k.name, 60),
                        fmt_count(k.calls),
                        fmt_us(k.total_us),
                        fmt_us(k.mean_us),
                        fmt_us(k.max_us),
                        _num(k.blocks_per_sm),
                        _pct(None if np.isnan(k.occupancy_percent) else k.occupancy_percent),
                    ]
                    for k in kernels.itertuples()
                ],
                left=[0],
            )
        )
    return "\n".join(lines)


def _num(value: float) -> str:
    if value is None or np.isnan(value):
        return "–"
    return f"{value:.2f}" if value < 10 else f"{value:.0f}"


def _per_rank_rows(r: ProfileResult) -> tuple[list[str], list[list[str]]]:
    pr = r.per_rank
    headers = ["rank", "file", "steps", "step time", "GPU util", "GPU idle/step"] + [
        c for c in CATEGORY_COLORS
    ]
    headers += ["comm overlap", "coll. wait/step"]
    body = []
    for row in pr.itertuples():
        d = row._asdict()
        mark = " (slowest)" if row.slowest and len(pr) > 1 else ""
        body.append(
            [
                f"{row.rank}{mark}",
                str(row.file),
                str(row.steps),
                fmt_us(row.step_time_us),
                _pct(d["gpu_utilization_percent"]),
                fmt_us(row.gpu_idle_us_per_step),
            ]
            + [fmt_percent(pr.loc[row.Index, f"{c}_percent"]) for c in CATEGORY_COLORS]
            + [
                _pct(_finite(d["communication_overlap_percent"])),
                fmt_us(_finite(d["collective_wait_us_per_step"])),
            ]
        )
    return headers, body


def _finite(value: Any) -> float | None:
    return float(value) if value is not None and np.isfinite(value) else None


def _per_rank_text(r: ProfileResult) -> str:
    headers, body = _per_rank_rows(r)
    return text_table(headers, body, left=[0, 1])


# --- HTML --------------------------------------------------------------------------------


def stacked_bar(percent: dict[str, float], width_px: int = 480, height_px: int = 16) -> str:
    """The breakdown as one horizontal bar of coloured segments, with a legend."""
    segs = []
    for cat, p in percent.items():
        if p <= 0:
            continue
        segs.append(
            f'<span title="{escape(cat)}: {escape(fmt_percent(p))}" style="display:inline-block;'
            f'width:{p:.3f}%;height:{height_px}px;background:{CATEGORY_COLORS[cat]}"></span>'
        )
    legend = " ".join(
        f'<span style="white-space:nowrap"><span style="display:inline-block;width:9px;height:9px;'
        f'background:{CATEGORY_COLORS[c]}"></span> {escape(c)} {escape(fmt_percent(p))}</span>'
        for c, p in percent.items()
    )
    return (
        f'<div class="gm-stack" style="width:{width_px}px;max-width:100%;display:flex;'
        f'border:1px solid rgba(128,128,128,0.4)">{"".join(segs)}</div>'
        f'<div class="gm-note" style="margin:3px 0 6px 0">{legend}</div>'
    )


def _finding_html(i: int, f: Finding) -> str:
    color = SEVERITY_COLORS.get(f.severity, "#888")
    saving = f"saves ~{fmt_us(f.saving_us)} per step" if f.saving_us > 0 else "no time estimate"
    confirmed = ' <span class="gm-sub">(confirmed by the session)</span>' if f.confirmed else ""
    evidence = kv((k, escape(_evidence_value(k, v))) for k, v in f.evidence.items())
    snippet = f'<pre class="gm-snippet">{escape(f.snippet)}</pre>' if f.snippet else ""
    return (
        f'<div class="gm-box gm-finding" data-rule="{escape(f.rule)}" style="border-left-color:{color}">'
        f"<b>{i}. {escape(f.title)}</b> "
        f'<span style="color:{color}">[{escape(f.severity)}]</span> '
        f'<span class="gm-sub">{escape(f.rule)} · {escape(saving)}</span>{confirmed}'
        f"{where_html(f)}<div>{escape(f.message)}</div>{evidence}"
        f"<div><b>Fix:</b> {escape(f.fix)}</div>{snippet}</div>"
    )


def _evidence_value(key: str, value: object) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if key.endswith("_us") or key.endswith("_us_per_step"):
            return fmt_us(value)
        if key.endswith("bytes") or key.endswith("bytes_per_step"):
            return fmt_bytes(value)
        if key.endswith("percent"):
            return fmt_percent(value)
    return str(value)


def timeline_svg(r: ProfileResult, width: int = 640) -> str:
    """Per-step stacked bars (scaled to the longest step) under a GPU busy/idle strip."""
    a = r.primary
    st, bd = a.steps, a.breakdown
    if len(st) == 0:
        return ""
    label_w, row_h, gap = 110, 12, 4
    plot_w = width - label_w - 70
    strip_h = 14 if a.trace.has_gpu else 0
    height = 18 + strip_h + (row_h + gap) * len(st) + 6
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="9" class="gm-timeline">'
    ]
    y = 4
    if strip_h:
        lo, hi = st.span
        frac = _busy_per_pixel(a, lo, hi, plot_w)
        out.append(
            f'<text x="{label_w - 4}" y="{y + 10}" text-anchor="end" fill="currentColor">GPU busy</text>'
        )
        out.append(
            f'<rect x="{label_w}" y="{y}" width="{plot_w}" height="{strip_h - 2}" fill="#eeeeee" '
            f'stroke="rgba(128,128,128,0.4)" stroke-width="0.5"><title>idle</title></rect>'
        )
        for px, f in enumerate(frac.tolist()):
            if f > 0.02:
                out.append(
                    f'<rect x="{label_w + px}" y="{y}" width="1" height="{strip_h - 2}" '
                    f'fill="{CATEGORY_COLORS["Kernel"]}" fill-opacity="{min(f, 1.0):.2f}"/>'
                )
        out.append(
            f'<text x="{label_w + plot_w + 4}" y="{y + 10}" fill="#888">'
            f"{escape(fmt_percent(r.summary['gpu_utilization_percent'] or 0))}</text>"
        )
        y += strip_h + 4
    longest = float(st.duration.max()) or 1.0
    cats = list(CATEGORY_COLORS)
    for i, name in enumerate(st.names):
        x = float(label_w)
        out.append(
            f'<text x="{label_w - 4}" y="{y + row_h - 2}" text-anchor="end" fill="currentColor">'
            f"step {escape(name)}</text>"
        )
        for c, cat in enumerate(cats):
            w = plot_w * float(bd.us[i, c]) / longest
            if w <= 0:
                continue
            out.append(
                f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h}" fill="{CATEGORY_COLORS[cat]}">'
                f"<title>step {escape(name)}: {escape(cat)} {escape(fmt_us(float(bd.us[i, c])))}</title></rect>"
            )
            x += w
        out.append(
            f'<text x="{x + 4:.2f}" y="{y + row_h - 2}" fill="#888">{escape(fmt_us(float(st.duration[i])))}</text>'
        )
        y += row_h + gap
    out.append("</svg>")
    return "".join(out)


def _busy_per_pixel(a: Any, lo: float, hi: float, pixels: int) -> np.ndarray:
    """Fraction of each pixel's time in which some GPU event ran."""
    from gpumagic.profile.analysis import intervals

    gpu = a.trace.gpu
    if hi <= lo:
        return np.zeros(pixels)
    edges = np.linspace(lo, hi, pixels + 1)
    return np.diff(intervals.cumulative(gpu.ts, gpu.end, edges)) / np.diff(edges)


def _idle_html(r: ProfileResult, rows: int) -> str:
    s = r.summary
    idle = r.idle
    n = max(s["steps"], 1)
    total = sum(idle.device_us.values()) / n
    split = {k: v / n for k, v in idle.device_us.items()}
    parts = [
        "<h4>GPU idle <span class='gm-sub'>inside the steps, per step; split as Holistic Trace Analysis "
        "does (host_wait: the CPU launched too late; kernel_wait: gaps under 30 µs between kernels)</span></h4>",
        kv([("idle", escape(fmt_us(total)))] + [(k, escape(fmt_us(v))) for k, v in split.items()]),
    ]
    if not idle.streams.empty:
        parts.append(
            table(
                ["device", "stream", "events", "busy", "host_wait", "kernel_wait", "other"],
                [
                    [
                        str(x.device),
                        str(x.stream),
                        fmt_count(x.events),
                        fmt_us(x.busy_us),
                        fmt_us(x.host_wait_us),
                        fmt_us(x.kernel_wait_us),
                        fmt_us(x.other_us),
                    ]
                    for x in idle.streams.itertuples()
                ],
            )
        )
    if not idle.gaps.empty:
        gap_rows = []
        for g in idle.gaps.head(rows).itertuples():
            ops = "<br>".join(
                f"{escape(_short(name, 70))} <span class='gm-sub'>{escape(fmt_us(us))}</span>"
                for name, us in g.cpu_ops
            )
            color = _IDLE_COLORS.get(g.category, "#888")
            gap_rows.append(
                [
                    escape(g.step),
                    escape(fmt_us(g.start_us)),
                    escape(fmt_us(g.us)),
                    f'<span style="color:{color}">{escape(g.category)}</span>',
                    ops,
                ]
            )
        parts.append(
            "<div class='gm-note'>Longest gaps, with the CPU operators that ran meanwhile</div>"
        )
        parts.append(table(["step", "at", "gap", "why", "CPU meanwhile"], gap_rows, left=[0, 3, 4]))
    return "".join(parts)


def _ops_html(frame: pd.DataFrame, rows: int) -> str:
    head = frame.head(rows)
    body = [
        [
            escape(_short(o.name)),
            fmt_count(o.calls),
            fmt_us(o.host_self_us),
            fmt_us(o.host_total_us),
            fmt_us(o.device_self_us),
            fmt_us(o.device_total_us),
        ]
        for o in head.itertuples()
    ]
    keys = [
        [o.name, o.calls, o.host_self_us, o.host_total_us, o.device_self_us, o.device_total_us]
        for o in head.itertuples()
    ]
    return table(
        ["operator", "calls", "host self", "host total", "device self", "device total"],
        body,
        code=[0],
        title_attr=[str(n) for n in head["name"]],
        sort_keys=keys,
    )


def _kernels_html(frame: pd.DataFrame, rows: int) -> str:
    head = frame.head(rows)
    body = [
        [
            escape(_short(k.name)),
            fmt_count(k.calls),
            fmt_us(k.total_us),
            fmt_percent(k.percent),
            fmt_us(k.mean_us),
            fmt_us(k.max_us),
            _num(k.blocks_per_sm),
            _pct(None if np.isnan(k.occupancy_percent) else k.occupancy_percent),
        ]
        for k in head.itertuples()
    ]
    keys = [
        [
            k.name,
            k.calls,
            k.total_us,
            k.percent,
            k.mean_us,
            k.max_us,
            k.blocks_per_sm,
            k.occupancy_percent,
        ]
        for k in head.itertuples()
    ]
    return table(
        ["kernel", "calls", "total", "share", "mean", "max", "blocks/SM", "occupancy"],
        body,
        code=[0],
        title_attr=[str(n) for n in head["name"]],
        sort_keys=keys,
    )


def profile_html(r: ProfileResult, rows: int = 15) -> str:
    s = r.summary
    parts = [
        f"<h4>%%gpuprofile <span class='gm-sub'>{escape(_title(r))}</span></h4>",
        "".join(f"<div class='gm-box gm-record-note'>{escape(n)}</div>" for n in r.notes),
        kv((k, escape(v)) for k, v in _headline_items(r)),
        "<div class='gm-note'>Step-time breakdown: each instant of a step counted once, "
        "Kernel &gt; Memcpy &gt; Memset &gt; Communication &gt; Runtime &gt; DataLoader &gt; "
        "CPU Exec &gt; Other</div>",
        stacked_bar(s["breakdown_percent"]),
    ]
    if r.findings:
        parts.append(
            "<h4>Findings <span class='gm-sub'>ranked by estimated saving per step</span></h4>"
        )
        parts.extend(_finding_html(i, f) for i, f in enumerate(r.findings, 1))
    else:
        parts.append("<div class='gm-box gm-info'>No findings: no rule matched this run.</div>")
    parts.append(lines_html(r))
    parts.append(modules_html(r))
    if s["ranks"] > 1:
        headers, body = _per_rank_rows(r)
        slow = ["gm-hot" if row.slowest else "" for row in r.per_rank.itertuples()]
        parts.append(
            f"<h4>Per rank <span class='gm-sub'>slowest: rank {escape(s['slowest_rank'])}</span></h4>"
        )
        parts.append(
            table(
                headers, [[escape(c) for c in row] for row in body], left=[0, 1], row_classes=slow
            )
        )
        parts.append(slow_ranks_html(r))
    parts.append(communication_html(r, rows))
    parts.append("<h4>Steps</h4>")
    parts.append(timeline_svg(r))
    bd = r.breakdown
    parts.append(
        table(
            ["category", "mean per step", "share"],
            [
                [
                    f'<span style="color:{CATEGORY_COLORS[str(c)]}">■</span> {escape(c)}',
                    fmt_us(row.us),
                    fmt_percent(row.percent),
                ]
                for c, row in bd.iterrows()
            ],
            left=[0],
        )
    )
    if not s["cpu_only"]:
        parts.append(_idle_html(r, min(rows, 10)))
    if not r.ops.empty:
        parts.append(
            f"<h4>Operators <span class='gm-sub'>top {min(rows, len(r.ops))} of {fmt_count(len(r.ops))} "
            "by device time, whole trace</span></h4>"
        )
        parts.append(_ops_html(r.ops, rows))
    if not r.kernels.empty:
        parts.append(
            f"<h4>Kernels <span class='gm-sub'>top {min(rows, len(r.kernels))} of {fmt_count(len(r.kernels))} "
            "by total time</span></h4>"
        )
        parts.append(_kernels_html(r.kernels, rows))
    return wrap("profile", "".join(parts))


def report_document(r: ProfileResult, rows: int = 50) -> str:
    """A standalone HTML page: the same report, no scripts and no external resources."""
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>gpumagic profile: {escape(r.name)}</title></head><body>"
        f"{profile_html(r, rows=rows)}</body></html>\n"
    )
