"""One table model for every report: a :class:`Table` is rows of raw values and the
:class:`Column` s that know what to do with them, and both the text and the HTML form come
from it.

A column knows its header, how to read its raw value from a row (a field of a DataFrame
record, a dict key, an attribute, or a function of the row), how to format that value
(a formatter from :mod:`gpumagic.units`), how to align it, and what HTML adds to the same
text: a bar scaled to the value, a colour or a swatch that names a category, a tooltip. The
raw value also sorts the HTML table when a header is clicked, so a size sorts as bytes and a
duration as microseconds, never as their text.

The HTML carries the styling that has meaning (alignment, highlighted rows, bars, colours)
in ``style=`` attributes: untrusted notebooks, GitHub and nbviewer drop ``<style>`` blocks
but keep those, so a shared report still shows which row is the hot one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpumagic.render.html import ALIGN_STYLE, ROW_STYLE, bar, escape, swatch
from gpumagic.units import fmt_text

Align = Literal["left", "right", "code"]
# The text form marks highlighted rows only in tables that ask for it (``Table.marks``): most
# tables already say it in a column ("chosen", "failed", "(slowest)").
_MARKS = {"hot": "*", "error": "!"}


def finite(fmt: Callable[[Any], str]) -> Callable[[Any], str]:
    """``fmt`` for a value that may be missing or infinite, which shows as "–"."""
    return lambda v: fmt(v) if v is not None and math.isfinite(v) else "–"


def cut(text: str, chars: int | None) -> str:
    """``text`` cut to ``chars`` characters, the last one an ellipsis (kernel names run to
    thousands of characters)."""
    if chars is None or len(text) <= chars:
        return text
    return text[: chars - 1] + "…"


@dataclass(frozen=True)
class Bar:
    """A bar after the cell's text in HTML, as long as the raw value is against ``scale``
    (the text form has the number alone). ``color`` is one colour or a function of the value
    (growth red, release green)."""

    scale: float
    color: str | Callable[[Any], str]
    width_px: int = 60

    def html(self, value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return ""
        color = self.color(value) if callable(self.color) else self.color
        return bar(abs(float(value)) / max(self.scale, 1e-12), color, self.width_px)


@dataclass(frozen=True)
class Column:
    """One column: header, raw value, formatter, alignment, and what HTML adds.

    ``value``: the row's field (a dict key, an attribute, a tuple's index) or a function of
    the row.
    ``align``: ``"left"``, ``"right"`` (numbers) or ``"code"`` (left, monospace, spaces kept).
    ``chars`` / ``html_chars``: cut the text to this many characters in the text / HTML form
    (HTML keeps the uncut text as the cell's tooltip).
    ``bar``, ``color`` (the text's colour by value), ``swatch`` (a coloured square before the
    text, by value): HTML only, for meaning the text already states.
    ``html``: the cell's HTML from the raw value, where it is more than escaped text.
    ``tooltip``: a function of the row giving the cell's HTML tooltip.
    """

    header: str
    value: str | int | Callable[[Any], Any]
    fmt: Callable[[Any], str] = fmt_text
    align: Align = "right"
    chars: int | None = None
    html_chars: int | None = None
    bar: Bar | None = None
    color: Callable[[Any], str | None] | None = None
    swatch: Callable[[Any], str] | None = None
    html: Callable[[Any], str] | None = None
    tooltip: Callable[[Any], str] | None = None

    def raw(self, row: Any) -> Any:
        if callable(self.value):
            return self.value(row)
        if isinstance(row, Mapping) or isinstance(self.value, int):
            return row[self.value]
        return getattr(row, self.value)

    def text_cell(self, raw: Any) -> str:
        return cut(self.fmt(raw), self.chars)

    def html_cell(self, raw: Any) -> str:
        if self.html is not None:
            return self.html(raw)
        text = self.fmt(raw)
        body = escape(cut(text, self.html_chars))
        if self.color is not None and (color := self.color(raw)):
            body = f'<span style="color:{color}">{body}</span>'
        if self.swatch is not None:
            body = f"{swatch(self.swatch(raw))} {body}"
        if self.bar is not None:
            body = f"{body} {self.bar.html(raw)}"
        return body


@dataclass
class Table:
    """Rows and their columns; ``text()`` and ``html()`` are the two forms of one table.

    ``highlight``: a function of the row giving ``"hot"`` (the heaviest rows), ``"error"``
    (the row that failed) or ``""``; HTML shades the row, and with ``marks`` the text form
    prefixes ``*`` or ``!`` to its first cell. ``sortable``: the HTML headers sort the rows
    by their raw values on click (where the front end runs an output's handlers).
    """

    columns: Sequence[Column]
    rows: Sequence[Any]
    highlight: Callable[[Any], str] | None = None
    sortable: bool = False
    marks: bool = False

    def _raws(self) -> list[list[Any]]:
        return [[c.raw(row) for c in self.columns] for row in self.rows]

    def _kinds(self) -> list[str]:
        return [self.highlight(row) if self.highlight else "" for row in self.rows]

    def text(self) -> list[str]:
        """Columns padded to their widest cell, numbers right and text left."""
        headers = [c.header for c in self.columns]
        body = [[c.text_cell(v) for c, v in zip(self.columns, raws)] for raws in self._raws()]
        if self.marks:
            for cells, kind in zip(body, self._kinds()):
                cells[0] = _MARKS.get(kind, " ") + cells[0]
        widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(headers)]
        left = [c.align != "right" for c in self.columns]

        def line(cells: Sequence[str]) -> str:
            parts = [
                s.ljust(w) if is_left else s.rjust(w) for s, w, is_left in zip(cells, widths, left)
            ]
            return "  ".join(parts).rstrip()

        rule = "  ".join("-" * w for w in widths).rstrip()
        return [line(headers), rule, *(line(r) for r in body)]

    def html(self) -> str:
        onclick = f' onclick="{escape(_SORT_JS)}" title="click to sort"' if self.sortable else ""
        head = "".join(
            f"<th{_align_attrs('left' if c.align == 'code' else c.align)}{onclick}>"
            f"{escape(c.header)}</th>"
            for c in self.columns
        )
        body = []
        for row, raws, kind in zip(self.rows, self._raws(), self._kinds()):
            cells = []
            for c, raw in zip(self.columns, raws):
                attrs = _align_attrs(c.align)
                tip = c.tooltip(row) if c.tooltip is not None else _cut_off(c, raw)
                if tip:
                    attrs += f' title="{escape(tip)}"'
                if self.sortable:
                    attrs += f' data-v="{escape(_sort_value(raw, c))}"'
                cells.append(f"<td{attrs}>{c.html_cell(raw)}</td>")
            style = f' class="gm-{kind}" style="{ROW_STYLE[kind]}"' if kind in ROW_STYLE else ""
            body.append(f"<tr{style}>{''.join(cells)}</tr>")
        klass = "gm-table gm-sortable" if self.sortable else "gm-table"
        return (
            f'<table class="{klass}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>"
        )


def _align_attrs(align: Align) -> str:
    klass = {"left": ' class="gm-left"', "code": ' class="gm-code"'}.get(align, "")
    return f'{klass} style="{ALIGN_STYLE[align]}"'


def _cut_off(column: Column, raw: Any) -> str:
    """The uncut text, as the tooltip of a cell HTML cut short."""
    if column.html_chars is None or column.html is not None:
        return ""
    text = column.fmt(raw)
    return text if len(text) > column.html_chars else ""


def _sort_value(raw: Any, column: Column) -> str:
    if raw is None or (isinstance(raw, float) and math.isnan(raw)):
        return ""  # missing sorts last
    if isinstance(raw, (bool, int, float, str)):
        return str(raw)
    try:
        return str(float(raw))  # numpy scalars
    except (TypeError, ValueError):
        return column.fmt(raw)


# Click-to-sort, inline in each header so it needs no script element and no global name:
# where the front end runs trusted output's handlers (JupyterLab, classic Notebook, VS Code
# for outputs made in the session) a click sorts by that column's raw values, descending then
# ascending; where it does not (an untrusted notebook), the table stays in its server-side
# order (largest first).
_SORT_JS = (
    "var th=this,t=th.closest('table'),b=t.tBodies[0],i=Array.prototype.indexOf.call(th.parentNode.children,th),"
    "d=th.getAttribute('data-dir')==='d'?'a':'d',r=Array.prototype.slice.call(b.rows);"
    "th.setAttribute('data-dir',d);r.sort(function(x,y){var p=x.cells[i].getAttribute('data-v'),"
    "q=y.cells[i].getAttribute('data-v'),m=parseFloat(p),n=parseFloat(q),"
    "k=(isNaN(m)||isNaN(n))?String(p).localeCompare(String(q)):m-n;return d==='d'?-k:k;});"
    "r.forEach(function(e){b.appendChild(e);});"
)
