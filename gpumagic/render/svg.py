"""SVG charts drawn as strings: cheap enough to redraw every second in a live view
(no matplotlib per frame), and self-contained in saved notebooks and HTML exports.

Every chart reaches the page as an image, never as inline ``<svg>``: untrusted notebooks
(every notebook someone else saved), GitHub and nbviewer drop inline ``<svg>`` elements and
``<style>`` blocks, and keep ``<img src="data:image/svg+xml;base64,...">``. :func:`svg_image`
is that one step for any drawing (``svg_open`` starts one); :func:`chart_image` draws a
:class:`Chart` through it. The image's ``alt`` text (also its tooltip) says in words what the
chart shows, for readers that get no image: screen readers, a markdown export's reader.

Inside an image the page's text colour does not reach the drawing (``currentColor`` is
black there), so text is drawn in a class whose colour follows the reader's light or dark
preference (``prefers-color-scheme``, which an SVG image sees).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpumagic.render.html import escape

# The one stylesheet a drawing carries, inside the image where no sanitiser reaches it.
_SVG_STYLE = (
    "<style>.fg{fill:#333}.dim{fill:#777}"
    "@media (prefers-color-scheme: dark){.fg{fill:#ddd}.dim{fill:#aaa}}</style>"
)


def svg_open(width: int, height: int, font_size: int = 9) -> str:
    """The start of a standalone drawing: namespace, size, font, the text classes ``fg``
    (labels) and ``dim`` (axis values); close it with ``</svg>``."""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="{font_size}">'
        f"{_SVG_STYLE}"
    )


def svg_image(svg: str, width: int, height: int, alt: str, css: str = "") -> str:
    """``svg`` (a whole ``<svg>`` document) as an ``<img>`` with a data URI, ``width`` ×
    ``height`` CSS pixels (narrower where the output area is), ``alt`` its text and tooltip;
    ``css`` a class that tests and the browser find it by."""
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    klass = f' class="{escape(css)}"' if css else ""
    return (
        f'<img{klass} src="data:image/svg+xml;base64,{data}" width="{width}" height="{height}" '
        f'alt="{escape(alt)}" title="{escape(alt)}" '
        'style="max-width:100%;height:auto;vertical-align:middle">'
    )


@dataclass
class Series:
    """One line of a chart: y values over x values (same length), drawn in ``color``."""

    name: str
    x: Sequence[float]
    y: Sequence[float | None]
    color: str = "#3b7dd8"
    fill: bool = False


@dataclass
class Band:
    """A shaded x-interval (a cell that ran, a step, a failing statement)."""

    x0: float
    x1: float
    label: str = ""
    color: str = "rgba(128,128,128,0.15)"


@dataclass
class Chart:
    series: list[Series]
    width: int = 320
    height: int = 90
    title: str = ""
    y_label: str = ""
    y_min: float | None = 0.0
    y_max: float | None = None
    x_min: float | None = None
    x_max: float | None = None
    bands: list[Band] = field(default_factory=list)
    y_format: object = None  # callable(float) -> str for the axis labels
    alt: str = ""  # what the chart shows, in words (the image's alt text; the title if empty)


def render_chart(chart: Chart) -> str:
    """Render one chart to an ``<svg>`` string. Gaps (``None`` y values) break the line."""
    pad_l, pad_r, pad_t, pad_b = 46, 6, 16 if chart.title else 6, 14
    w, h = chart.width, chart.height
    pw, ph = max(w - pad_l - pad_r, 10), max(h - pad_t - pad_b, 10)
    xs = [float(x) for s in chart.series for x in s.x]
    ys = [float(y) for s in chart.series for y in s.y if y is not None]
    x_lo = chart.x_min if chart.x_min is not None else (min(xs) if xs else 0.0)
    x_hi = chart.x_max if chart.x_max is not None else (max(xs) if xs else 1.0)
    if x_hi <= x_lo:
        x_hi = x_lo + 1.0
    y_lo = chart.y_min if chart.y_min is not None else (min(ys) if ys else 0.0)
    y_hi = chart.y_max if chart.y_max is not None else (max(ys) if ys else 1.0)
    if ys and chart.y_max is None:
        y_hi = max(y_hi, max(ys))
    if y_hi <= y_lo:
        y_hi = y_lo + 1.0

    def px(x: float) -> float:
        return pad_l + (x - x_lo) / (x_hi - x_lo) * pw

    def py(y: float) -> float:
        return pad_t + ph - (y - y_lo) / (y_hi - y_lo) * ph

    fmt = chart.y_format if callable(chart.y_format) else (lambda v: f"{v:g}")
    out = [svg_open(w, h)]
    if chart.title:
        out.append(
            f'<text x="{pad_l}" y="11" font-size="10" class="fg">{escape(chart.title)}</text>'
        )
    for band in chart.bands:
        x0, x1 = max(px(band.x0), pad_l), min(px(band.x1), pad_l + pw)
        if x1 > x0:
            title = f"<title>{escape(band.label)}</title>" if band.label else ""
            out.append(
                f'<rect x="{x0:.1f}" y="{pad_t}" width="{x1 - x0:.1f}" height="{ph}" '
                f'fill="{band.color}">{title}</rect>'
            )
    out.append(
        f'<rect x="{pad_l}" y="{pad_t}" width="{pw}" height="{ph}" fill="none" '
        f'stroke="rgba(128,128,128,0.5)" stroke-width="0.5"/>'
    )
    for value in (y_lo, y_hi):
        out.append(
            f'<text x="{pad_l - 3}" y="{py(value) + 3:.1f}" text-anchor="end" class="dim">'
            f"{escape(fmt(value))}</text>"
        )
    for s in chart.series:
        segments: list[list[tuple[float, float]]] = [[]]
        for x, y in zip(s.x, s.y):
            if y is None:
                if segments[-1]:
                    segments.append([])
                continue
            segments[-1].append((px(float(x)), py(min(max(float(y), y_lo), y_hi))))
        for seg in segments:
            if not seg:
                continue
            pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in seg)
            if s.fill and len(seg) > 1:
                base = py(y_lo)
                poly = f"{seg[0][0]:.1f},{base:.1f} {pts} {seg[-1][0]:.1f},{base:.1f}"
                out.append(
                    f'<polygon points="{poly}" fill="{s.color}" fill-opacity="0.15" stroke="none"/>'
                )
            if len(seg) == 1:
                a, b = seg[0]
                out.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="1.5" fill="{s.color}"/>')
            else:
                out.append(
                    f'<polyline points="{pts}" fill="none" stroke="{s.color}" stroke-width="1.2"/>'
                )
    if chart.y_label:
        out.append(
            f'<text x="{pad_l + pw}" y="{h - 3}" text-anchor="end" class="dim">'
            f"{escape(chart.y_label)}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def chart_image(chart: Chart, css: str = "gm-chart") -> str:
    """``chart`` as an image (see the module's docstring)."""
    return svg_image(render_chart(chart), chart.width, chart.height, chart.alt or chart.title, css)


def render_small_multiples(charts: Sequence[Chart], gap: int = 6) -> str:
    """Charts side by side, wrapping to the next line when the output area is narrow
    (one row per GPU reads as a row on a wide screen and a column on a phone)."""
    body = "".join(chart_image(chart) for chart in charts)
    return f'<div style="display:flex;flex-wrap:wrap;gap:{gap}px;align-items:flex-start">{body}</div>'
