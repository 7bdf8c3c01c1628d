"""The communication part of a ``%%gpuprofile`` report: how much of the step collectives
take, how much of them compute hides (HTA's overlap, the TensorBoard plugin's
Distributed View per step and rank, drawn as SVG bars), and the collectives table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumagic.render.html import escape
from gpumagic.render.sections import Figure, Heading, KeyValues, Paragraph, Section, only
from gpumagic.render.svg import svg_image, svg_open
from gpumagic.render.table import Column, Table, finite
from gpumagic.units import fmt_bytes, fmt_count, fmt_gbps, fmt_percent, fmt_us

if TYPE_CHECKING:
    from gpumagic.profile.result import ProfileResult

COMMUNICATION_COLOR = "#17a2b8"
# the Distributed View's four parts, in the plugin's order
SPLIT = (
    ("computation_only_us", "computation only", "#3b7dd8"),
    ("overlap_us", "overlap", "#8e6bbf"),
    ("communication_only_us", "communication only", COMMUNICATION_COLOR),
    ("other_us", "other", "#b0b0b0"),
)


def headline_items(r: ProfileResult) -> list[tuple[str, str]]:
    """``communication: 27% of the step (168 ms per step), 12% of it overlaps computation;
    152 ms per step not overlapped``; and the time waiting for other ranks."""
    if not r.has_communication:
        return []
    s = r.summary
    text = (
        f"{fmt_percent(s.communication_percent)} of the step "
        f"({fmt_us(s.communication_us_per_step)} per step)"
    )
    if s.communication_overlap_percent is not None:
        text += f", {fmt_percent(s.communication_overlap_percent)} of it overlaps computation"
    text += f"; {fmt_us(s.communication_exposed_us_per_step)} per step not overlapped"
    items = [("communication", text)]
    if s.collective_wait_us_per_step is not None:
        items.append(
            ("waiting in collectives", f"{fmt_us(s.collective_wait_us_per_step)} per step")
        )
    return items


def _collectives_table(r: ProfileResult, rows: int) -> Table:
    ranks = r.summary.ranks > 1
    columns = [Column("rank", "rank", align="left")] if ranks else []
    columns += [
        Column("collective", "name", align="left"),
        Column("backend", "backend", align="left"),
        Column("calls", "calls", fmt_count),
        Column("device", "device_us", lambda v: fmt_us(v) if v > 0 else "–"),
        Column("host", "host_us", fmt_us),
        Column("size/call", "bytes_per_call", finite(fmt_bytes)),
        Column("ranks", "group_size", finite(fmt_count)),
        Column("algbw", "algbw_gbps", fmt_gbps),
        Column("busbw", "busbw_gbps", fmt_gbps),
    ]
    return Table(columns, r.collectives.head(rows).to_dict("records"), sortable=True)


def _split_table(r: ProfileResult) -> Table:
    """The Distributed View's split per step, per rank where there are several (their
    means per step and the overlap share)."""
    if r.summary.ranks > 1:
        rows = [
            {
                "": f"rank {row['rank']}",
                "overlap": row["communication_overlap_percent"],
                **{k: row[f"{k.removesuffix('_us')}_us_per_step"] for k, _, _ in SPLIT},
            }
            for row in r.per_rank.to_dict("records")
        ]
    else:
        rows = [
            {"": f"step {row['step']}", "overlap": None, **{k: row[k] for k, _, _ in SPLIT}}
            for row in r.overlap.to_dict("records")
        ]
    columns = [
        Column("", "", align="left"),
        Column("overlap share", "overlap", finite(fmt_percent)),
        *(Column(f"{label} /step", key, fmt_us) for key, label, _ in SPLIT),
    ]
    return Table(columns, rows)


def overlap_svg(r: ProfileResult, width: int = 640) -> str:
    """One stacked bar per step and rank: computation only, overlap, communication only,
    other (the TensorBoard plugin's Distributed View), scaled to the longest step; an image
    (:func:`gpumagic.render.svg.svg_image`)."""
    ov = r.overlap
    if ov.empty:
        return ""
    label_w, row_h, gap = 110, 12, 4
    plot_w = width - label_w - 70
    height = 6 + (row_h + gap) * len(ov) + 16
    longest = float(ov["step_us"].max()) or 1.0
    out = [svg_open(width, height)]
    y = 4
    many = ov["rank"].nunique() > 1
    for row in ov.to_dict("records"):
        label = (f"rank {row['rank']} · " if many else "") + f"step {row['step']}"
        out.append(
            f'<text x="{label_w - 4}" y="{y + row_h - 2}" text-anchor="end" class="fg">'
            f"{escape(label)}</text>"
        )
        x = float(label_w)
        for key, name, color in SPLIT:
            us = float(row[key])
            w = plot_w * us / longest
            if w <= 0:
                continue
            out.append(
                f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h}" fill="{color}">'
                f"<title>{escape(label)}: {escape(name)} {escape(fmt_us(us))}</title></rect>"
            )
            x += w
        out.append(
            f'<text x="{x + 4:.2f}" y="{y + row_h - 2}" class="dim">'
            f"{escape(fmt_us(float(row['step_us'])))}</text>"
        )
        y += row_h + gap
    x = float(label_w)
    for _, name, color in SPLIT:
        out.append(
            f'<rect x="{x:.0f}" y="{y + 2}" width="9" height="9" fill="{color}"/>'
            f'<text x="{x + 12:.0f}" y="{y + 10}" class="fg">{escape(name)}</text>'
        )
        x += 16 + 6 * len(name)
    out.append("</svg>")
    return svg_image("".join(out), width, height, _overlap_alt(r), "gm-overlap")


def _overlap_alt(r: ProfileResult) -> str:
    ov = r.overlap
    means = ", ".join(
        f"{name} {fmt_us(float(ov[key].mean()))}" for key, name, _ in SPLIT if key in ov
    )
    return f"{len(ov)} steps, each split by what ran (mean per step: {means})"


def communication_sections(r: ProfileResult, rows: int) -> list[Section]:
    """The share and overlap of communication, its split per step (a chart in HTML, a table
    in text; per rank in both where there are several), and the collectives."""
    if not r.has_communication:
        return []
    split = _split_table(r)
    sections: list[Section] = [
        Heading(
            "Communication",
            "collectives; overlap as Holistic Trace Analysis computes it (communication time "
            "during which computation runs); per step, the TensorBoard plugin's Distributed View",
        ),
        KeyValues(headline_items(r)),
        Figure(lambda: overlap_svg(r)),
        split if r.summary.ranks > 1 else only("text", split),
    ]
    frame = r.collectives
    if not frame.empty:
        sections += [
            Heading("Collectives", f"{fmt_count(int(frame['calls'].sum()))} calls"),
            Paragraph(
                "Device time of their NCCL/RCCL kernels, host time of the backend's span (on "
                "gloo, the collective itself); size S and bandwidths as nccl-tests defines them "
                "(algbw = S/t, busbw = algbw × the collective's factor for its group size)"
            ),
            _collectives_table(r, rows),
        ]
    return sections
