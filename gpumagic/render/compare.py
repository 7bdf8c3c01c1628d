"""The report of a :class:`~gpumagic.profile.compare.Comparison`, declared once for text
and HTML: the headline (the verdict on the step time), the metrics side by side with each
change's 95% interval and verdict, both breakdowns, what became of each finding, and the
cell's lines paired by their source. A relative change is never shown without its
interval."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpumagic.profile.analysis.noise import METHOD
from gpumagic.profile.compare import change_text
from gpumagic.render.profile import category_column, stacked_bar, text_bar
from gpumagic.render.profile_code import first_line
from gpumagic.render.sections import Figure, Heading, Paragraph, Report, Section, only
from gpumagic.render.table import Column, Table
from gpumagic.units import fmt_interval, fmt_named, fmt_percent, fmt_pp, fmt_us

if TYPE_CHECKING:
    from gpumagic.profile.compare import Comparison

_METRIC_LABELS = {
    "step_time_median_us": "median step time",
    "step_time_us": "mean step time",
    "gpu_utilization_percent": "GPU utilisation",
    "gpu_idle_us_per_step": "GPU idle per step",
    "sm_efficiency_percent": "est. SM efficiency",
    "achieved_occupancy_percent": "achieved occupancy",
    "steps": "steps",
    "communication_percent": "communication (not hidden)",
    "communication_overlap_percent": "communication overlap",
}


def _change(c: Comparison, metric: str, delta: float) -> str:
    d = c.differences.get(metric)
    if d is not None and metric.endswith("percent") and d.interval is not None:
        # a share (utilisation) changes by percentage points, its interval too
        lo, hi = d.interval
        return f"{fmt_pp(d.estimate)} (95% CI {fmt_pp(lo)} to {fmt_pp(hi)})"
    if d is not None:
        return change_text(d)
    if delta != delta or metric.endswith("percent"):
        # no value per step, so no interval: a share's change is not shown without one
        return "–"
    return fmt_us(delta, signed=True) if metric.endswith(("_us", "_per_step")) else f"{delta:+g}"


def _metrics(c: Comparison) -> Table:
    a, b = c.names
    rows = [
        {"metric": str(m), **row}
        for m, row in c.table.to_dict("index").items()
        # a metric neither run has (GPU figures of CPU runs, communication without any): no row
        if m in ("steps", "step_time_median_us", "step_time_us")
        or any(v == v and v != 0 for v in (row["a"], row["b"]))
    ]
    return Table(
        [
            Column("metric", lambda x: _METRIC_LABELS.get(x["metric"], x["metric"]), align="left"),
            Column(a, lambda x: fmt_named(x["metric"], x["a"])),
            Column(b, lambda x: fmt_named(x["metric"], x["b"])),
            Column("change (95% interval)", lambda x: _change(c, x["metric"], x["delta"])),
            Column("verdict", lambda x: x["verdict"] or "–", align="left"),
        ],
        rows,
        highlight=lambda x: "hot" if x["verdict"] not in ("", "no difference") else "",
    )


def _share(us: float, percent: float) -> str:
    return f"{fmt_us(us)} ({fmt_percent(percent)})"


def _category_change(x: dict[str, Any]) -> str:
    low, high = x["delta_low_us"], x["delta_high_us"]
    spread = "" if low != low else f" ({fmt_interval((low, high), _signed_us)})"
    return fmt_us(x["delta_us"], signed=True) + spread


def _signed_us(value: float) -> str:
    return fmt_us(value, signed=True)


def _breakdown(c: Comparison) -> list[Section]:
    a, b = c.names
    rows = [
        {"category": cat, **row}
        for cat, row in c.breakdown.to_dict("index").items()
        if row["a_us"] or row["b_us"]  # a category neither run spent time in: no row
    ]
    bars: list[Section] = []
    for name, result in ((a, c.a), (b, c.b)):
        percent = result.summary.breakdown_percent
        bars += [
            only("html", Paragraph(name)),
            Figure(stacked_bar(percent), [f"{text_bar(percent)} {name}"]),
        ]
    return [
        Heading("Step-time breakdown", f"mean per step, {a} -> {b}"),
        *bars,
        Table(
            [
                category_column(),
                Column(a, lambda x: _share(x["a_us"], x["a_percent"])),
                Column(b, lambda x: _share(x["b_us"], x["b_percent"])),
                Column("change per step (95% interval)", _category_change),
                Column("verdict", "verdict", align="left"),
            ],
            rows,
        ),
    ]


def _saving(value: float | None) -> str:
    if value is None or value != value:
        return "–"
    return f"~{fmt_us(value)}/step"


def _findings(c: Comparison) -> list[Section]:
    if c.findings.empty:
        return []
    a, b = c.names
    return [
        Heading("Findings", f"estimated saving per step, {a} -> {b}"),
        Table(
            [
                Column("finding", "rule", align="left"),
                Column(a, "a_saving_us", _saving),
                Column(b, "b_saving_us", _saving),
                Column("status", "status", align="left"),
            ],
            c.findings.to_dict("records"),
        ),
    ]


def _line_cell(x: dict[str, Any]) -> str:
    a, b = x["a_line"], x["b_line"]
    if a != a:  # NaN: only the later run has it
        return f"{int(b)} (new)"
    if b != b:
        return f"{int(a)} (gone)"
    return str(int(b)) if a == b else f"{int(b)} (was {int(a)})"


def _lines(c: Comparison) -> list[Section]:
    """Per line of a cell run twice, paired by source (none: the runs share no line)."""
    lines = c.lines
    if lines.empty or not (lines["a_host_us"].notna() & lines["b_host_us"].notna()).any():
        return []
    gpu = bool((lines[["a_device_us", "b_device_us"]].fillna(0) > 0).to_numpy().any())
    a, b = c.names
    columns = [
        Column("line", _line_cell, align="left"),
        Column("statement", lambda x: first_line(str(x["source"])), align="code", chars=60),
        Column("host", lambda x: f"{fmt_us(x['a_host_us'])} -> {fmt_us(x['b_host_us'])}"),
        Column("change", "delta_host_us", lambda v: fmt_us(v, signed=True)),
    ]
    if gpu:
        columns += [
            Column("GPU", lambda x: f"{fmt_us(x['a_device_us'])} -> {fmt_us(x['b_device_us'])}"),
            Column("change", "delta_device_us", lambda v: fmt_us(v, signed=True)),
        ]
    return [
        Heading(f"Per line, {a} -> {b}", "lines paired by their source"),
        Table(columns, lines.to_dict("records")),
    ]


def _samples(c: Comparison) -> str:
    (ra, na), (rb, nb) = c.step_time.samples
    a, b = c.names

    def side(name: str, runs: int, steps: int) -> str:
        return f"{name} {runs} run{'s' if runs != 1 else ''}, {steps} steps"

    single = " One run a side cannot show run-to-run noise: --repeat N runs a cell N times." if (
        ra == 1 or rb == 1
    ) else ""
    return (
        f"Samples: {side(a, ra, na)}; {side(b, rb, nb)}. {METHOD}; otherwise no difference "
        "beyond the noise. Metrics without a value per step (SM efficiency, occupancy, "
        f"communication) are shown side by side, without a change.{single}"
    )


def comparison_report(c: Comparison) -> Report:
    a, b = c.names
    sections: list[Section] = [
        Paragraph(c.headline, "info"),
        _metrics(c),
        Paragraph(_samples(c), prefix="note: "),
        *_breakdown(c),
        *_findings(c),
        *_lines(c),
    ]
    return Report(
        "profile-compare", "compare", f"{a} -> {b}", sections, summary=f"compare {a} -> {b}: {c.headline}"
    )
