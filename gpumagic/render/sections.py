"""A report declared once: a title and a list of sections, each of which gives its text
lines and its HTML, so the two forms of every report list the same things in the same order.

The sections are the few things reports are made of: a :class:`Heading`, a
:class:`~gpumagic.render.table.Table`, :class:`KeyValues`, a :class:`Paragraph` (a note, a
warning or an information box), :class:`Bullets`, a :class:`Figure` (a chart, with what the
text form says instead), a :class:`Box` or :class:`Details` around other sections. A report
with a part of its own (a finding with its fix, the module tree) writes a small class with
the same two methods. :func:`only` keeps a section to one form, for what one form shows
another way (a chart in HTML, its numbers as a table in text).

Meaningful styling is inline (``style=``), as in :mod:`gpumagic.render.table`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from gpumagic.render.html import (
    BOX_STYLE,
    KV_STYLE,
    NOTE_STYLE,
    WARN_STYLE,
    escape,
    escape_text,
    wrap,
)

Form = Literal["text", "html"]


class Section(Protocol):
    def text(self) -> list[str]: ...

    def html(self) -> str: ...


def indent(lines: Iterable[str], by: str = "  ") -> list[str]:
    return [by + line if line else line for line in lines]


def sub_span(sub: str) -> str:
    return f' <span class="gm-sub" style="{NOTE_STYLE}">{escape(sub)}</span>' if sub else ""


@dataclass
class Heading:
    """A section's title, with a grey subtitle; the text form has a blank line above it."""

    title: str
    sub: str = ""

    def text(self) -> list[str]:
        return ["", f"{self.title}: {self.sub}" if self.sub else self.title]

    def html(self) -> str:
        return f"<h4>{escape(self.title)}{sub_span(self.sub)}</h4>"


@dataclass
class KeyValues:
    """``label: value`` pairs: one per line in text (or, given ``inline``, one line under that
    label), a wrapping row in HTML. Keys in ``warn`` show their value as a warning."""

    items: Sequence[tuple[str, str]]
    inline: str | None = None  # the text form on one line, led by this label ("CPUs: ...")
    warn: Sequence[str] = ()

    def text(self) -> list[str]:
        if not self.items:
            return []
        if self.inline is not None:
            label = f"{self.inline}: " if self.inline else ""
            return [label + "; ".join(f"{k} {v}" for k, v in self.items)]
        return [f"  {k}: {v}" for k, v in self.items]

    def html(self) -> str:
        if not self.items:
            return ""
        cells = []
        for k, v in self.items:
            value = escape(v)
            if k in self.warn:
                value = f'<span class="gm-warn" style="{WARN_STYLE}">{value}</span>'
            cells.append(f"<span>{escape(k)}: <b>{value}</b></span>")
        return f'<div class="gm-kv" style="{KV_STYLE}">{"".join(cells)}</div>'


ParagraphKind = Literal["note", "plain", "warn", "box", "info"]


@dataclass
class Paragraph:
    """One paragraph: ``note`` (grey), ``plain``, ``warn`` (red text), ``box`` (a warning box),
    ``info`` (an information box). The text form prefixes ``prefix`` (``"note: "``).
    ``css`` adds classes that tests and the browser find it by."""

    text_: str
    kind: ParagraphKind = "note"
    prefix: str = ""
    css: str = ""

    def text(self) -> list[str]:
        return [self.prefix + self.text_] if self.text_ else []

    def html(self) -> str:
        if not self.text_:
            return ""
        return _block(self.kind, escape_text(self.text_), self.css)


def _block(
    kind: ParagraphKind, body: str, css: str = "", attrs: str = "", extra_style: str = ""
) -> str:
    klass = {"note": "gm-note", "warn": "gm-warn", "box": "gm-box", "info": "gm-box gm-info"}.get(
        kind, ""
    )
    klass = f"{klass} {css}".strip()
    style = {"note": NOTE_STYLE, "warn": WARN_STYLE}.get(kind) or BOX_STYLE.get(kind, "")
    style = ";".join(s for s in (style, extra_style) if s)
    klass_attr = f' class="{klass}"' if klass else ""
    style_attr = f' style="{style}"' if style else ""
    return f"<div{klass_attr}{style_attr}{attrs}>{body}</div>"


@dataclass
class Bullets:
    """A titled list (what to try): ``title:`` and ``  - item`` lines in text."""

    title: str
    items: Sequence[str]

    def text(self) -> list[str]:
        if not self.items:
            return []
        return [f"{self.title}:", *(f"  - {item}" for item in self.items)]

    def html(self) -> str:
        if not self.items:
            return ""
        items = "".join(f"<li>{escape(item)}</li>" for item in self.items)
        return f"<div>{escape(self.title)}:</div><ul>{items}</ul>"


@dataclass
class Figure:
    """A chart: its HTML (an image of its SVG, :func:`gpumagic.render.svg.svg_image`, never
    inline ``<svg>``, which shared notebooks drop; or a function drawing it, so the text form
    never pays for it), and the lines the text form shows instead (none when the tables
    around it already hold its numbers; a function, so the HTML form never pays for them)."""

    html_: str | Callable[[], str]
    text_: Sequence[str] | Callable[[], Sequence[str]] = ()

    def text(self) -> list[str]:
        return list(self.text_() if callable(self.text_) else self.text_)

    def html(self) -> str:
        return self.html_() if callable(self.html_) else self.html_


@dataclass
class Box:
    """Sections inside a box (``box``: a warning, ``info``); indented in the text form.
    ``attrs`` are extra HTML attributes (``data-rule="..."``), already escaped."""

    sections: Sequence[Section]
    kind: ParagraphKind = "box"
    css: str = ""
    attrs: str = ""
    border: str = ""  # a colour for the box's edge (a finding's severity)

    def text(self) -> list[str]:
        lines = text_of(self.sections)
        return [lines[0], *indent(lines[1:])] if lines else []

    def html(self) -> str:
        edge = f"border-left-color:{self.border}" if self.border else ""
        return _block(self.kind, html_of(self.sections), self.css, self.attrs, edge)


@dataclass
class Details:
    """Sections folded under a summary line in HTML (``open``: unfolded at first); in text,
    the summary line and the sections."""

    summary: str
    sections: Sequence[Section]
    open: bool = False
    css: str = ""

    def text(self) -> list[str]:
        lines = ["", self.summary]
        for i, section in enumerate(self.sections):
            lines += ([""] if i else []) + section.text()
        return lines

    def html(self) -> str:
        klass = f' class="{self.css}"' if self.css else ""
        opened = " open" if self.open else ""
        return (
            f"<details{klass}{opened}><summary>{escape(self.summary)}</summary>"
            f"{html_of(self.sections)}</details>"
        )


@dataclass
class _OneForm:
    section: Section
    form: Form

    def text(self) -> list[str]:
        return self.section.text() if self.form == "text" else []

    def html(self) -> str:
        return self.section.html() if self.form == "html" else ""


def only(form: Form, section: Section) -> Section:
    """``section`` in one form alone (what the other form shows another way)."""
    return _OneForm(section, form)


def text_of(sections: Iterable[Section]) -> list[str]:
    return [line for s in sections for line in s.text()]


def html_of(sections: Iterable[Section]) -> str:
    return "".join(s.html() for s in sections)


@dataclass
class Report:
    """A whole report: ``title`` (and a grey ``sub``) on top, then the sections. ``kind``
    names the HTML container (``class="gpumagic gpumagic-<kind>"``); ``warn`` is a failure
    shown beside the title; ``summary`` the one line a result's ``repr()`` shows (the title
    line where there is none)."""

    kind: str
    title: str
    sub: str = ""
    sections: list[Section] = field(default_factory=list)
    warn: str = ""
    summary: str = ""

    def head(self) -> str:
        head = f"{self.title}: {self.sub}" if self.sub else self.title
        return f"{head}  {self.warn}" if self.warn else head

    def headline(self) -> str:
        """One line that says what the report found."""
        if not self.summary:
            return self.head()
        return f"{self.summary}; {self.warn}" if self.warn else self.summary

    def text(self) -> str:
        lines = [self.head(), *text_of(self.sections)]
        return "\n".join(lines).strip("\n")

    def html(self, style: bool = True) -> str:
        warn = f' <span class="gm-warn" style="{WARN_STYLE}">{escape(self.warn)}</span>'
        title = f"<h4>{escape(self.title)}{sub_span(self.sub)}{warn if self.warn else ''}</h4>"
        return wrap(self.kind, title + html_of(self.sections), style=style)
