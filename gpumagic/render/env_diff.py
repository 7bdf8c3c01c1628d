"""Text and HTML for ``%gpuenv --diff`` and ``gpumagic.env_diff``: what differs and is known
to change speed first, each with why; what may matter next; what cannot, folded."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from gpumagic.render.sections import Details, Heading, Paragraph, Report, Section
from gpumagic.render.table import Column, Table

if TYPE_CHECKING:
    from gpumagic.environment.diff import Difference, EnvDiff

_TITLES = {
    "speed": "known to change speed",
    "measured": "measured figures that differ",
    "maybe": "may matter",
    "none": "cannot change speed",
}


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M") if t else "time unknown"


def _table(rows: list[Difference], a: str, b: str, why: bool = True) -> Table:
    columns = [
        Column("setting", lambda d: d.setting, align="code"),
        Column(a, lambda d: d.a, align="left", chars=48, html_chars=60),
        Column(b, lambda d: d.b, align="left", chars=48, html_chars=60),
    ]
    if why:
        columns.append(Column("why it matters", lambda d: d.why, align="left"))
    return Table(columns, rows)


def env_diff_report(d: EnvDiff) -> Report:
    speed, measured = d.tier("speed"), d.tier("measured")
    maybe, none = d.tier("maybe"), d.tier("none")
    count = len(d.differences) - len(measured)
    parts = []
    if count:
        verb = "differs" if count == 1 else "differ"
        parts.append(f"{count} setting{'s' if count != 1 else ''} {verb}, {len(speed)} known to change speed")
    if measured:
        parts.append(f"{len(measured)} measured figure{'s' if len(measured) != 1 else ''} beyond the noise")
    summary = "; ".join(parts) or "nothing differs"
    sections: list[Section] = [Paragraph(f"{summary}; {d.same} the same.", "plain")]
    sections += [Paragraph(note) for note in d.notes]
    if speed:
        sections += [Heading(_TITLES["speed"], "each with why it matters"), _table(speed, d.a, d.b)]
    if measured:
        sections += [
            Heading(_TITLES["measured"], f"by %gpucheck on each side, beyond {d.tolerance:.0%}"),
            _table(measured, d.a, d.b, why=False),
        ]
    if maybe:
        sections += [Heading(_TITLES["maybe"]), _table(maybe, d.a, d.b)]
    if none:
        sections.append(Details(f"{_TITLES['none']} ({len(none)})", [_table(none, d.a, d.b, why=False)]))
    sub = f"{d.a} ({_when(d.a_saved_at)}) vs {d.b} ({_when(d.b_saved_at)})"
    return Report("envdiff", "%gpuenv --diff", sub, sections, summary=f"{d.a} vs {d.b}: {summary}")
