"""The ``%%memfit`` report, declared once (text and HTML): the verdict, the peak by category
and by module, the headroom line by line, the batch fit and the what-ifs side by side."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumagic.memory.census.categories import NAME_OF_KEY
from gpumagic.memory.fit.accounting import FIT_KEYS
from gpumagic.render.html import PALETTE
from gpumagic.render.memfit_shard import shard_sections
from gpumagic.render.sections import Heading, KeyValues, Paragraph, Report, Section
from gpumagic.render.table import Bar, Column, Table
from gpumagic.units import fmt_bytes, fmt_count

if TYPE_CHECKING:
    from gpumagic.memory.fit.result import MemFit, WhatIf

_VERDICT = {True: "fits", False: "does not fit", None: "within the headroom's uncertainty"}
_MODULE_ROWS = 12


def verdict_text(fit: MemFit) -> str:
    if fit.error:
        # a cut-short run saw part of the cell: its peak is a floor, and nothing is judged
        on = f" on {fit.target.name}" if fit.target is not None else ""
        return (
            f"not judged{on}: the dry run did not finish, so the peak below is a lower bound "
            f"(at least {fmt_bytes(fit.need[0])} needed with the headroom)"
        )
    if fit.target is None:
        return "no GPU named (--gpu NAME or --memory SIZE): the cards below are judged"
    low, figure, high = fit.need[1], fit.need[0], fit.need[2]
    return (
        f"{_VERDICT[fit.fits]} on {fit.target.name} ({fmt_bytes(fit.target.capacity)}): needs "
        f"{fmt_bytes(figure)} (between {fmt_bytes(low)} and {fmt_bytes(high)} with the headroom)"
    )


def _summary(fit: MemFit) -> KeyValues:
    items = [
        ("predicted CUDA peak", f"at least {fmt_bytes(fit.peak_bytes)}" if fit.error else fmt_bytes(fit.peak_bytes)),
        ("at", f"line {fit.peak_line}" if fit.peak_line is not None else fit.peak_source or "–"),
        ("given to the cell", fmt_bytes(fit.start_bytes)),
        ("left after it", fmt_bytes(fit.end_bytes)),
        ("dry run", f"{fit.seconds:.2f} s"),
    ]
    if fit.max_batch is not None and fit.batch is not None:
        items.insert(1, (f"largest {fit.batch.variable}", fmt_count(fit.max_batch)))
    return KeyValues(items, inline="")


def _categories(fit: MemFit) -> Table:
    scale = max([*fit.categories.values(), 1])
    rows = [(NAME_OF_KEY[c], fit.categories.get(c, 0)) for c in FIT_KEYS]
    return Table(
        [
            Column("at the peak", 0, align="left"),
            Column("bytes", 1, fmt_bytes, bar=Bar(scale, PALETTE["accent"])),
            Column("share", 1, lambda v: f"{100 * v / max(fit.peak_bytes, 1):.0f}%"),
        ],
        rows,
    )


def _modules(fit: MemFit) -> Table:
    rows = [r for r in fit.module_rows if r[2] > 0][:_MODULE_ROWS]
    scale = max([r[2] for r in rows] + [1])
    return Table(
        [
            Column("module", lambda r: r[0] or "(no module)", align="code"),
            Column("category", lambda r: NAME_OF_KEY.get(r[1], r[1]), align="left"),
            Column("bytes", 2, fmt_bytes, bar=Bar(scale, PALETTE["peak"])),
        ],
        rows,
    )


def _headroom(fit: MemFit) -> Table:
    rows = [(line.what, line.bytes, line.low, line.high, line.why, line.source) for line in fit.headroom]
    if fit.target is not None:
        rows.insert(0, ("tensors at the peak (dry run)", fit.peak_bytes, fit.peak_bytes, fit.peak_bytes, "512-byte blocks included", ""))
        rows.append(("total needed", fit.need[0], fit.need[1], fit.need[2], "", ""))
        rows.append((f"{fit.target.name}", fit.target.capacity, fit.target.capacity - fit.target.uncertainty,
                     fit.target.capacity + fit.target.uncertainty, fit.target.how, fit.target.source))
    return Table(
        [
            Column("line", 0, align="left"),
            Column("figure", 1, fmt_bytes),
            Column("range", lambda r: f"{fmt_bytes(r[2])} – {fmt_bytes(r[3])}" if r[2] != r[3] else "", align="left"),
            Column("why", 4, align="left", chars=70, html_chars=90),
            Column("source", 5, align="left", chars=60, html_chars=60),
        ],
        rows,
        highlight=lambda r: "hot" if r[0] == "total needed" else "",
    )


def _verdicts(fit: MemFit) -> Table:
    return Table(
        [
            Column("GPU", 0, align="left"),
            Column("memory", 1, fmt_bytes),
            Column("verdict", lambda r: _VERDICT[r[2]], align="left"),
        ],
        fit.verdicts,
        highlight=lambda r: "hot" if r[2] is True else "",
    )


def _batch(fit: MemFit) -> list[Section]:
    b = fit.batch
    if b is None:
        return []
    line = (
        f"line through the sizes given: {fmt_bytes(b.slope)} per unit of {b.variable} over "
        f"{fmt_bytes(b.intercept)}; it predicted {fmt_count(b.guess)}" if b.guess is not None else ""
    )
    found = (
        f"largest {b.variable} that fits: {fmt_count(b.largest)}, confirmed by dry runs "
        f"(the next size does not fit)" if b.largest else
        (f"even {b.variable} = 1 does not fit" if b.largest == 0 else f"not confirmed: {b.note}")
    )
    table = Table(
        [
            Column(b.variable, "value"),
            Column("peak", "peak", fmt_bytes),
            Column("needs (top of headroom)", "need", fmt_bytes),
            Column("fits", lambda p: p.error or ("yes" if p.fits else "no"), align="left"),
        ],
        b.points,
        highlight=lambda p: "hot" if p.value == b.largest else "",
    )
    return [Heading("Batch size", f"{b.variable}, against {fit.target.name if fit.target else '?'}"),
            Paragraph(f"{found}. {line}.", "plain"), table]


def _what_ifs(fit: MemFit) -> list[Section]:
    if not fit.what_ifs:
        return []
    scale = max([abs(w.saving_bytes or 0) for w in fit.what_ifs] + [1])

    def changed_by(w: WhatIf) -> str:
        """The change at the peak, by category: negative is memory saved."""
        if w.peak_bytes is None:
            return ""
        parts = [
            f"{NAME_OF_KEY[c]} {fmt_bytes(w.categories.get(c, 0) - fit.categories.get(c, 0), signed=True)}"
            for c in FIT_KEYS
            if fit.categories.get(c, 0) != w.categories.get(c, 0)
        ]
        return ", ".join(parts) or "no change at the peak"

    table = Table(
        [
            Column("fix", "fix", align="left"),
            Column("what the dry run changed", lambda w: w.changed or f"not tried: {w.unavailable}", align="left", chars=60, html_chars=90),
            Column("peak", "peak_bytes", fmt_bytes),
            Column("saves", "saving_bytes", fmt_bytes, bar=Bar(scale, PALETTE["free"])),
            Column("change at the peak, by category", changed_by, align="left", chars=70, html_chars=120),
        ],
        fit.what_ifs,
        highlight=lambda w: "hot" if w.saving_bytes and w.saving_bytes == max((x.saving_bytes or 0) for x in fit.what_ifs) else "",
    )
    return [Heading("What each fix would save", "each a dry run with the change made"), table]


def _where(fit: MemFit) -> str:
    first = fit.peak_source.splitlines()[0] if fit.peak_source else ""
    return f"line {fit.peak_line}: {first}" if fit.peak_line is not None else first


def memfit_report(fit: MemFit) -> Report:
    sections: list[Section] = [
        Paragraph(verdict_text(fit), "plain"),
        _summary(fit),
        Heading("At the peak", _where(fit)),
        _categories(fit),
        _modules(fit),
        Heading("Headroom", "what the GPU needs beyond the tensors"),
        _headroom(fit),
    ]
    if fit.verdicts:
        sections.append(_verdicts(fit))
    sections += _batch(fit)
    sections += _what_ifs(fit)
    sections += shard_sections(fit.shard)
    sections += [Paragraph(n, prefix="note: ") for n in fit.notes]
    warn = f"dry run stopped: {fit.error}" if fit.error else ""
    sub = fit.target.name if fit.target else "no target"
    return Report("memfit", "%%memfit", sub, sections, warn=warn)
