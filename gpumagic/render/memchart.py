"""The cell's memory over time, stacked by category, as an SVG string.

One column per statement execution (a loop's hits each get one, up to the tracer's 4096
points): memory after the statement by category, and inside it a spike to its peak, also by
category, so temporaries show where they lived. Vertical rules mark the statement
boundaries (the top-level statements' when there are too many to draw), labelled with the
cell's line numbers; a marker names the cell's peak. Drawn as a string, like
:mod:`gpumagic.render.svg`: no matplotlib, and the same in a saved notebook.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpumagic.memory.census.categories import NAMES
from gpumagic.render.html import escape
from gpumagic.render.svg import svg_image, svg_open
from gpumagic.units import fmt_bytes

if TYPE_CHECKING:
    from gpumagic.cell import Statement
    from gpumagic.memory.trace.tracer import Point

__all__ = ["CATEGORY_COLORS", "memory_chart", "memory_chart_image"]

# One colour per category (torch's _memory_profiler uses the same hues for the same
# categories), chosen to read on light and dark themes.
CATEGORY_COLORS = (
    "#2e8b57",  # parameters
    "#3b7dd8",  # gradients
    "#d4a017",  # optimizer state
    "#d9534f",  # activations
    "#9467bd",  # temporaries
    "#7f7f7f",  # inputs
    "#c7c7c7",  # other
)
# Above this many columns, only boundaries between top-level statements are ruled.
_ALL_RULES_MAX = 80
_LABELS_MAX = 40


def _stack(cats: Sequence[int] | None) -> list[float]:
    """Cumulative tops of the categories, bottom to top."""
    tops, total = [], 0.0
    for c in range(len(NAMES)):
        total += max(cats[c], 0) if cats is not None else 0
        tops.append(total)
    return tops


def memory_chart(
    points: Sequence[Point],
    statements: Sequence[Statement],
    title: str = "",
    width: int = 640,
    height: int = 180,
) -> str:
    """The stacked chart of a traced cell (module docstring); "" when there is nothing to draw."""
    if len(points) < 2 or all(p[4] is None for p in points):
        return ""
    pad_l, pad_r, pad_t, pad_b = 58, 8, 18, 28
    pw, ph = width - pad_l - pad_r, height - pad_t - pad_b
    n = len(points) - 1
    # x of point k's end: k; its peak: k - 0.5 (the spike inside the statement)
    columns: list[tuple[float, list[float], int]] = [(0.0, _stack(points[0][4]), -1)]
    for k in range(1, n + 1):
        _, _, index, _, after, at_peak = points[k]
        if at_peak is not None:
            columns.append((k - 0.5, _stack(at_peak), index))
        columns.append((float(k), _stack(after), index))
    y_max = max(max(col[1][-1] for col in columns), 1.0)

    def px(x: float) -> float:
        return pad_l + x / n * pw

    def py(y: float) -> float:
        return pad_t + ph - y / y_max * ph

    out = [
        svg_open(width, height)
    ]
    if title:
        out.append(f'<text x="{pad_l}" y="11" font-size="10" class="fg">{escape(title)}</text>')
    for c in range(len(NAMES)):
        if all(col[1][c] == (col[1][c - 1] if c else 0) for col in columns):
            continue  # nothing in this category anywhere
        top = " ".join(f"{px(x):.1f},{py(tops[c]):.1f}" for x, tops, _ in columns)
        bottom = " ".join(
            f"{px(x):.1f},{py(tops[c - 1] if c else 0):.1f}" for x, tops, _ in reversed(columns)
        )
        out.append(
            f'<polygon points="{top} {bottom}" fill="{CATEGORY_COLORS[c]}" fill-opacity="0.8" '
            f'stroke="none"><title>{escape(NAMES[c])}</title></polygon>'
        )
    out += _rules(points, statements, n, px, pad_t, ph)
    out += _frame_and_axis(pad_l, pad_t, pw, ph, y_max)
    out += _peak_marker(columns, statements, px, py)
    out.append(_legend(columns, pad_l, height - 4))
    out.append("</svg>")
    return "".join(out)


def _rules(
    points: Sequence[Point], statements: Sequence[Statement], n: int, px: object, pad_t: int, ph: int
) -> list[str]:
    """Statement boundaries: a rule at each point (only where a top-level statement begins
    when there are many), and the line numbers of as many as fit."""
    assert callable(px)
    out: list[str] = []
    many = n > _ALL_RULES_MAX
    labelled: list[float] = []
    for k in range(1, n + 1):
        index = points[k][2]
        if index < 0:
            continue
        s = statements[index]
        if many and s.depth > 0:
            continue
        x0 = px(k - 1)
        out.append(
            f'<line x1="{x0:.1f}" y1="{pad_t}" x2="{x0:.1f}" y2="{pad_t + ph}" '
            f'stroke="rgba(128,128,128,0.35)" stroke-width="0.5">'
            f"<title>line {s.line}: {escape(s.source.splitlines()[0] if s.source else '')}</title></line>"
        )
        xm = (px(k - 1) + px(k)) / 2
        if len(labelled) < _LABELS_MAX and (not labelled or xm - labelled[-1] >= 14):
            labelled.append(xm)
            out.append(
                f'<text x="{xm:.1f}" y="{pad_t + ph + 10}" text-anchor="middle" fill="#888">{s.line}</text>'
            )
    return out


def _frame_and_axis(pad_l: int, pad_t: int, pw: int, ph: int, y_max: float) -> list[str]:
    return [
        f'<rect x="{pad_l}" y="{pad_t}" width="{pw}" height="{ph}" fill="none" '
        'stroke="rgba(128,128,128,0.5)" stroke-width="0.5"/>',
        f'<text x="{pad_l - 3}" y="{pad_t + ph}" text-anchor="end" fill="#888">0 B</text>',
        f'<text x="{pad_l - 3}" y="{pad_t + 3}" text-anchor="end" fill="#888">'
        f"{escape(fmt_bytes(y_max))}</text>",
        f'<text x="{pad_l - 3}" y="{pad_t + ph + 11}" text-anchor="end" fill="#888">line</text>',
    ]


def _peak_marker(
    columns: list[tuple[float, list[float], int]],
    statements: Sequence[Statement],
    px: object,
    py: object,
) -> list[str]:
    assert callable(px) and callable(py)
    x, tops, index = max(columns, key=lambda col: col[1][-1])
    if index < 0:
        return []
    label = f"peak {fmt_bytes(tops[-1])}, line {statements[index].line}"
    cx, cy = px(x), py(tops[-1])
    anchor = "end" if cx > 480 else "start"
    dx = -5 if anchor == "end" else 5
    return [
        f'<path d="M{cx - 4:.1f},{cy - 7:.1f} L{cx + 4:.1f},{cy - 7:.1f} L{cx:.1f},{cy - 1:.1f} Z" '
        'class="fg"/>',
        f'<text x="{cx + dx:.1f}" y="{cy - 3:.1f}" text-anchor="{anchor}" class="fg">'
        f"{escape(label)}</text>",
    ]


def _legend(columns: list[tuple[float, list[float], int]], x0: int, y: int) -> str:
    parts: list[str] = []
    x = float(x0)
    for c, name in enumerate(NAMES):
        if all(col[1][c] == (col[1][c - 1] if c else 0) for col in columns):
            continue
        parts.append(
            f'<rect x="{x:.0f}" y="{y - 7}" width="8" height="8" fill="{CATEGORY_COLORS[c]}"/>'
            f'<text x="{x + 11:.0f}" y="{y}" class="fg">{escape(name)}</text>'
        )
        x += 16 + 5.2 * len(name)
    return "".join(parts)


def memory_chart_image(
    points: Sequence[Point], statements: Sequence[Statement], title: str = ""
) -> str:
    """:func:`memory_chart` as an ``<img>`` (shared notebooks drop inline ``<svg>``)."""
    svg = memory_chart(points, statements, title)
    if not svg:
        return ""
    alt = title or "memory by category over the cell"
    return svg_image(svg, 640, 180, alt + " (stacked: parameters, gradients, optimizer state, "
                     "activations, temporaries, inputs, other)", "gm-memchart")
