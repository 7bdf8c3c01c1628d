"""The communication part of a ``%%gpuprofile`` report: how much of the step collectives
take, how much of them compute hides (HTA's overlap, the TensorBoard plugin's
Distributed View per step and rank, drawn as SVG bars), and the collectives table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from gpumagic.render.html import escape, kv, table, text_table
from gpumagic.units import fmt_bytes, fmt_count, fmt_gbps, fmt_percent, fmt_us

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.profile.result import ProfileResult

COMMUNICATION_COLOR = "#17a2b8"
# the Distributed View's four parts, in the plugin's order
SPLIT = (
    ("computation_only_us", "computation only", "#3b7dd8"),
    ("overlap_us", "overlap", "#8e6bbf"),
    ("communication_only_us", "communication only", COMMUNICATION_COLOR),
    ("other_us", "other", "#b0b0b0"),
)


def has_communication(r: ProfileResult) -> bool:
    """Some rank ran collectives (kernels, CPU-backend spans, or recorded calls)."""
    return r.has_communication


def headline_items(r: ProfileResult) -> list[tuple[str, str]]:
    """``communication: 27% of the step (168 ms per step), 12% of it overlaps computation;
    152 ms per step not overlapped``; and the time waiting for other ranks."""
    if not has_communication(r):
        return []
    s = r.summary
    text = (
        f"{fmt_percent(s['communication_percent'])} of the step "
        f"({fmt_us(s['communication_us_per_step'])} per step)"
    )
    if s["communication_overlap_percent"] is not None:
        text += f", {fmt_percent(s['communication_overlap_percent'])} of it overlaps computation"
    text += f"; {fmt_us(s['communication_exposed_us_per_step'])} per step not overlapped"
    items = [("communication", text)]
    if s["collective_wait_us_per_step"] is not None:
        items.append(
            ("waiting in collectives", f"{fmt_us(s['collective_wait_us_per_step'])} per step")
        )
    return items


def _collective_rows(frame: pd.DataFrame, rows: int, ranks: bool) -> list[list[str]]:
    out = []
    for c in frame.head(rows).itertuples():
        row = [str(c.rank)] if ranks else []
        row += [
            str(c.name),
            str(c.backend),
            fmt_count(c.calls),
            fmt_us(c.device_us) if c.device_us > 0 else "–",
            fmt_us(c.host_us),
            fmt_bytes(c.bytes_per_call) if np.isfinite(c.bytes_per_call) else "–",
            f"{c.group_size:.0f}" if np.isfinite(c.group_size) else "–",
            fmt_gbps(c.algbw_gbps),
            fmt_gbps(c.busbw_gbps),
        ]
        out.append(row)
    return out


def _collective_headers(ranks: bool) -> list[str]:
    return (["rank"] if ranks else []) + [
        "collective",
        "backend",
        "calls",
        "device",
        "host",
        "size/call",
        "ranks",
        "algbw",
        "busbw",
    ]


def _split_rows(r: ProfileResult) -> list[list[str]]:
    out = []
    for row in r.per_rank.itertuples() if len(r.ranks) > 1 else []:
        out.append(
            [f"rank {row.rank}", _pct(row.communication_overlap_percent)]
            + [fmt_us(getattr(row, f"{k.removesuffix('_us')}_us_per_step")) for k, _, _ in SPLIT]
        )
    if not out:
        ov = r.overlap
        for row in ov.itertuples():
            out.append([f"step {row.step}", ""] + [fmt_us(getattr(row, k)) for k, _, _ in SPLIT])
    return out


def _pct(value: Any) -> str:
    return fmt_percent(value) if value is not None and np.isfinite(value) else "–"


def communication_text(r: ProfileResult, rows: int = 10) -> str:
    if not has_communication(r):
        return ""
    s = r.summary
    lines = ["Communication"]
    lines += [f"  {k}: {v}" for k, v in headline_items(r)]
    lines.append(
        text_table(
            ["", "overlap share"] + [f"{label} /step" for _, label, _ in SPLIT],
            _split_rows(r),
            left=[0],
        )
    )
    frame = r.collectives
    if not frame.empty:
        ranks = s["ranks"] > 1
        lines.append("")
        lines.append(f"Collectives ({fmt_count(int(frame['calls'].sum()))} calls)")
        lines.append(
            text_table(
                _collective_headers(ranks),
                _collective_rows(frame, rows, ranks),
                left=[0, 1, 2] if ranks else [0, 1],
            )
        )
    return "\n".join(lines)


def overlap_svg(r: ProfileResult, width: int = 640) -> str:
    """One stacked bar per step and rank: computation only, overlap, communication only,
    other (the TensorBoard plugin's Distributed View), scaled to the longest step."""
    ov = r.overlap
    if ov.empty:
        return ""
    label_w, row_h, gap = 110, 12, 4
    plot_w = width - label_w - 70
    height = 6 + (row_h + gap) * len(ov) + 16
    longest = float(ov["step_us"].max()) or 1.0
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="9" class="gm-overlap">'
    ]
    y = 4
    many = ov["rank"].nunique() > 1
    for row in ov.itertuples():
        label = (f"rank {row.rank} · " if many else "") + f"step {row.step}"
        out.append(
            f'<text x="{label_w - 4}" y="{y + row_h - 2}" text-anchor="end" fill="currentColor">'
            f"{escape(label)}</text>"
        )
        x = float(label_w)
        for key, name, color in SPLIT:
            us = float(getattr(row, key))
            w = plot_w * us / longest
            if w <= 0:
                continue
            out.append(
                f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h}" fill="{color}">'
                f"<title>{escape(label)}: {escape(name)} {escape(fmt_us(us))}</title></rect>"
            )
            x += w
        out.append(
            f'<text x="{x + 4:.2f}" y="{y + row_h - 2}" fill="#888">'
            f"{escape(fmt_us(float(row.step_us)))}</text>"
        )
        y += row_h + gap
    x = float(label_w)
    for _, name, color in SPLIT:
        out.append(
            f'<rect x="{x:.0f}" y="{y + 2}" width="9" height="9" fill="{color}"/>'
            f'<text x="{x + 12:.0f}" y="{y + 10}" fill="currentColor">{escape(name)}</text>'
        )
        x += 16 + 6 * len(name)
    out.append("</svg>")
    return "".join(out)


def communication_html(r: ProfileResult, rows: int = 15) -> str:
    if not has_communication(r):
        return ""
    s = r.summary
    parts = [
        "<h4>Communication <span class='gm-sub'>collectives; overlap as Holistic Trace "
        "Analysis computes it (communication time during which computation runs); per step, "
        "the TensorBoard plugin's Distributed View</span></h4>",
        kv((k, escape(v)) for k, v in headline_items(r)),
        overlap_svg(r),
    ]
    if s["ranks"] > 1:
        parts.append(
            table(
                ["rank", "overlap share"] + [f"{label} /step" for _, label, _ in SPLIT],
                [[escape(c) for c in row] for row in _split_rows(r)],
                left=[0],
            )
        )
    frame = r.collectives
    if not frame.empty:
        ranks = s["ranks"] > 1
        head = frame.head(rows)
        body = [[escape(c) for c in row] for row in _collective_rows(head, rows, ranks)]
        keys = [
            ([c.rank] if ranks else [])
            + [
                c.name,
                c.backend,
                c.calls,
                c.device_us,
                c.host_us,
                c.bytes_per_call,
                c.group_size,
                c.algbw_gbps,
                c.busbw_gbps,
            ]
            for c in head.itertuples()
        ]
        parts.append(
            "<div class='gm-note'>Collectives: device time of their NCCL/RCCL kernels, host "
            "time of the backend's span (on gloo, the collective itself); size S and bandwidths "
            "as nccl-tests defines them (algbw = S/t, busbw = algbw × the collective's factor "
            "for its group size)</div>"
        )
        parts.append(
            table(
                _collective_headers(ranks),
                body,
                left=[0, 1, 2] if ranks else [0, 1],
                sort_keys=keys,
            )
        )
    return "".join(parts)
