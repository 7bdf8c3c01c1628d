"""The HTML and text forms of a :class:`~gpumagic.profile.compare.Comparison`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from gpumagic.render.html import escape, table, text_table, wrap
from gpumagic.render.profile import CATEGORY_COLORS, stacked_bar
from gpumagic.render.profile_code import first_line, shorten
from gpumagic.units import fmt_count, fmt_percent, fmt_us

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.profile.compare import Comparison


def _metric_cell(metric: str, value: float) -> str:
    if np.isnan(value):
        return "–"
    if metric.endswith("_us") or metric.endswith("_us_per_step"):
        return fmt_us(value)
    if metric.endswith("percent"):
        return fmt_percent(value)
    return fmt_count(value)


def _delta_cell(metric: str, delta: float, pct: float) -> str:
    if np.isnan(delta):
        return "–"
    if metric.endswith("percent"):
        return f"{delta:+.1f} pp"
    base = (
        fmt_us(delta, signed=True)
        if metric.endswith("_us") or metric.endswith("_per_step")
        else f"{delta:+g}"
    )
    return base + (f" ({fmt_percent(pct, signed=True)})" if not np.isnan(pct) else "")


_METRIC_LABELS = {
    "step_time_us": "step time",
    "gpu_utilization_percent": "GPU utilisation",
    "gpu_idle_us_per_step": "GPU idle per step",
    "sm_efficiency_percent": "est. SM efficiency",
    "achieved_occupancy_percent": "achieved occupancy",
    "steps": "steps",
    "communication_percent": "communication (not hidden)",
    "communication_overlap_percent": "communication overlap",
}


def _comparison_rows(c: Comparison) -> list[list[str]]:
    rows = []
    for metric, row in c.table.iterrows():
        m = str(metric)
        rows.append(
            [
                _METRIC_LABELS.get(m, m),
                _metric_cell(m, row.a),
                _metric_cell(m, row.b),
                _delta_cell(m, row.delta, row.delta_percent),
            ]
        )
    return rows


def comparison_text(c: Comparison) -> str:
    a, b = c.names
    lines = [f"compare: {a} -> {b}", f"  {c.headline}", ""]
    lines.append(text_table(["metric", a, b, "change"], _comparison_rows(c), left=[0]))
    lines.append("")
    lines.append(
        text_table(
            ["category", a, b, "change"],
            [
                [
                    str(cat),
                    f"{fmt_us(r.a_us)} ({fmt_percent(r.a_percent)})",
                    f"{fmt_us(r.b_us)} ({fmt_percent(r.b_percent)})",
                    f"{r.delta_pp:+.1f} pp",
                ]
                for cat, r in c.breakdown.iterrows()
            ],
            left=[0],
        )
    )
    if not c.findings.empty:
        lines.append("")
        lines.append(
            text_table(
                ["finding", a, b, "status"],
                [
                    [f.rule, _saving(f.a_saving_us), _saving(f.b_saving_us), f.status]
                    for f in c.findings.itertuples()
                ],
                left=[0, 3],
            )
        )
    lines += comparison_lines_text(c)
    return "\n".join(lines)


def _saving(value: float | None) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "–"
    return f"~{fmt_us(value)}/step"


def comparison_html(c: Comparison) -> str:
    a, b = c.names
    parts = [
        f"<h4>compare <span class='gm-sub'>{escape(a)} → {escape(b)}</span></h4>",
        f"<div class='gm-box gm-info'><b>{escape(c.headline)}</b></div>",
        table(
            ["metric", a, b, "change"],
            [[escape(x) for x in row] for row in _comparison_rows(c)],
            left=[0],
        ),
        f"<div class='gm-note'>{escape(a)}</div>",
        stacked_bar(c.a.summary["breakdown_percent"]),
        f"<div class='gm-note'>{escape(b)}</div>",
        stacked_bar(c.b.summary["breakdown_percent"]),
        table(
            ["category", a, b, "change"],
            [
                [
                    f'<span style="color:{CATEGORY_COLORS[str(cat)]}">■</span> {escape(cat)}',
                    escape(f"{fmt_us(r.a_us)} ({fmt_percent(r.a_percent)})"),
                    escape(f"{fmt_us(r.b_us)} ({fmt_percent(r.b_percent)})"),
                    escape(f"{r.delta_pp:+.1f} pp"),
                ]
                for cat, r in c.breakdown.iterrows()
            ],
            left=[0],
        ),
    ]
    if not c.findings.empty:
        parts.append(
            table(
                ["finding", a, b, "status"],
                [
                    [
                        escape(f.rule),
                        escape(_saving(f.a_saving_us)),
                        escape(_saving(f.b_saving_us)),
                        escape(f.status),
                    ]
                    for f in c.findings.itertuples()
                ],
                left=[0, 3],
            )
        )
    parts.append(comparison_lines_html(c))
    return wrap("profile-compare", "".join(parts))


# --- per line, between two runs of one cell ---------------------------------------------


def _paired(c: Comparison) -> tuple[pd.DataFrame, bool] | None:
    """The per-line rows to show (None: the runs share no line), and whether GPU time shows."""
    lines = c.lines
    if lines.empty or not (lines["a_host_us"].notna() & lines["b_host_us"].notna()).any():
        return None
    gpu = bool((lines[["a_device_us", "b_device_us"]].fillna(0) > 0).to_numpy().any())
    return lines, gpu


def _line_cell(x: Any) -> str:
    a, b = x.a_line, x.b_line
    if a != a:  # NaN: only the later run has it
        return f"{int(b)} (new)"
    if b != b:
        return f"{int(a)} (gone)"
    return str(int(b)) if a == b else f"{int(b)} (was {int(a)})"


def comparison_lines_text(c: Comparison) -> list[str]:
    got = _paired(c)
    if got is None:
        return []
    lines, gpu = got
    a, b = c.names
    headers = ["line", "host", "change"] + (["device", "change"] if gpu else []) + ["source"]
    body = []
    for x in lines.itertuples():
        row = [_line_cell(x), f"{fmt_us(x.a_host_us)} -> {fmt_us(x.b_host_us)}"]
        row.append(fmt_us(x.delta_host_us, signed=True))
        if gpu:
            row += [
                f"{fmt_us(x.a_device_us)} -> {fmt_us(x.b_device_us)}",
                fmt_us(x.delta_device_us, signed=True),
            ]
        row.append(shorten(first_line(str(x.source)), 60))
        body.append(row)
    return [
        "",
        f"Per line, {a} -> {b} (lines paired by their source)",
        text_table(headers, body, left=[len(headers) - 1]),
    ]


def comparison_lines_html(c: Comparison) -> str:
    got = _paired(c)
    if got is None:
        return ""
    lines, gpu = got
    a, b = c.names
    headers = ["line", "statement", "host", "change"] + (["GPU", "change"] if gpu else [])
    body = []
    for x in lines.itertuples():
        row = [
            escape(_line_cell(x)),
            escape(first_line(str(x.source))),
            escape(f"{fmt_us(x.a_host_us)} → {fmt_us(x.b_host_us)}"),
            escape(fmt_us(x.delta_host_us, signed=True)),
        ]
        if gpu:
            row += [
                escape(f"{fmt_us(x.a_device_us)} → {fmt_us(x.b_device_us)}"),
                escape(fmt_us(x.delta_device_us, signed=True)),
            ]
        body.append(row)
    return (
        f"<h4>Per line <span class='gm-sub'>{escape(a)} → {escape(b)}, lines paired by "
        "their source</span></h4>" + table(headers, body, code=[1])
    )
