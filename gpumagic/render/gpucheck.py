"""Text and HTML for ``%gpucheck``: the findings first (cause, evidence, fix), or a plain
"nothing found"; what could not be checked; then each card's readings against its defaults
and its figures against its specification; then the host."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumagic.render.env import LEVEL_MARK
from gpumagic.render.html import escape
from gpumagic.render.sections import (
    Box,
    Bullets,
    Details,
    Heading,
    KeyValues,
    Paragraph,
    Report,
    Section,
)
from gpumagic.render.table import Column, Table
from gpumagic.units import (
    fmt_bytes,
    fmt_celsius,
    fmt_flops,
    fmt_gbps,
    fmt_mhz,
    fmt_text,
    fmt_us,
    fmt_watts,
)

if TYPE_CHECKING:
    from gpumagic.environment.check.facts import CardCheck, HostFacts
    from gpumagic.environment.check.findings import CheckFinding
    from gpumagic.environment.check.measurements import Measurement
    from gpumagic.environment.check.readings import CardReading
    from gpumagic.environment.check.result import GpuCheck

_EDGE = {"error": "#d9534f", "warning": "#f0ad4e"}


def fmt_figure(value: float | None, unit: str) -> str:
    """A measured figure in its unit's words."""
    if value is None:
        return "–"
    if unit == "FLOP/s":
        return fmt_flops(value)
    if unit == "B/s":
        return fmt_gbps(value / 1e9)
    return fmt_us(value)


def _finding(f: CheckFinding) -> Box:
    cost = f" (may cost up to {f.cost:.0%} of {f.cost_of})" if f.cost and f.cost >= 0.01 else ""
    return Box(
        [
            Paragraph(f"{LEVEL_MARK.get(f.level, '-')} {f.level} · {f.device}: {f.title}{cost}", "plain"),
            Paragraph(f"cause: {f.cause}"),
            Paragraph(f"evidence: {f.evidence}") if f.evidence else Paragraph(""),
            Paragraph(f"fix: {f.fix}"),
        ],
        "info" if f.level == "info" else "box",
        attrs=f' data-level="{escape(f.level)}" data-code="{escape(f.code)}"',
        border=_EDGE.get(f.level, ""),
    )


def _nothing_found(r: GpuCheck) -> Paragraph:
    if not r.cards:
        return Paragraph("Nothing found on the host.", "info", css="gm-nothing-found")
    what = "the readings match each card's defaults"
    what += " and the figures its specification" if r.measured else ""
    return Paragraph(f"Nothing found: {what}.", "info", css="gm-nothing-found")


def _on_off(value: bool | None) -> str:
    return "–" if value is None else ("on" if value else "off")


def _reading_rows(c: CardCheck) -> list[tuple[str, str, str]]:
    r: CardReading = c.reading
    load, link = c.load, c.link_load
    spec = c.specs
    under = f" ({fmt_mhz(load.sm_clock)} under load)" if load and load.sm_clock else ""
    events = ", ".join(r.clock_events.names) if r.clock_events and r.clock_events.names else "none"
    if load and load.clock_events is not None:
        events += f" (under load: {', '.join(load.clock_events) or 'none'})"
    rated = f"; rated {fmt_watts(spec.power_default_w.value)}" if spec and spec.power_default_w else ""
    allowed = f", allowed {fmt_watts(r.power_min)}–{fmt_watts(r.power_max)}" if r.power_max is not None else ""
    gen_now = f"Gen {fmt_text(r.pcie.gen)} x{fmt_text(r.pcie.width)}"
    if link and link.pcie_gen:
        gen_now += f" (Gen {link.pcie_gen} x{fmt_text(link.pcie_width)} under a copy)"
    card_link = f"; card Gen {r.pcie.gen_card_max}" if r.pcie.gen_card_max else ""
    if spec and spec.pcie_gen and spec.pcie_width:
        card_link += f" (specification Gen {spec.pcie_gen.value:.0f} x{spec.pcie_width.value:.0f})"
    rows = [
        ("SM clock", fmt_mhz(r.sm_clock) + under, f"max {fmt_mhz(r.sm_clock_max)}"),
        ("memory clock", fmt_mhz(r.memory_clock), f"max {fmt_mhz(r.memory_clock_max)}"),
        ("clock-event reasons", events, ""),
        ("power", f"limit {fmt_watts(r.power_limit)}, drawing {fmt_watts(r.power_draw)}",
         f"default {fmt_watts(r.power_default)}{allowed}{rated}"),
        ("temperature", fmt_celsius(r.temperature),
         f"slowdown {fmt_celsius(r.slowdown_temperature)}, shutdown {fmt_celsius(r.shutdown_temperature)}"),
        ("PCIe link", gen_now, f"slot Gen {fmt_text(r.pcie.gen_max)} x{fmt_text(r.pcie.width_max)}{card_link}"),
        ("persistence mode", _on_off(r.persistence), ""),
        ("compute mode", fmt_text(r.compute_mode), ""),
        ("MIG", _mig(r), ""),
        ("ECC", _ecc(r), ""),
        ("load", _load(r), f"memory {fmt_bytes(r.memory_used)} of {fmt_bytes(r.memory_total)}"),
    ]  # fmt: skip
    return rows


def _mig(r: CardReading) -> str:
    if r.mig is None:
        return "not supported" if "MIG mode" not in r.unreadable else "–"
    if not r.mig.enabled:
        return "off"
    return "on: " + (", ".join(s.name for s in r.mig.slices) or "no slice visible")


def _ecc(r: CardReading) -> str:
    e = r.ecc
    if e.enabled is None:
        return "not supported" if r.unreadable.get("ECC mode") == "not supported on this card" else "–"
    if not e.enabled:
        return "off"
    parts = [f"uncorrectable {fmt_text(e.volatile_uncorrected)} now, {fmt_text(e.aggregate_uncorrected)} ever"]
    if e.rows_remapped is not None:
        parts.append(f"{e.rows_remapped} rows remapped" + (", remap pending" if e.remap_pending else ""))
    if e.retired_pages is not None:
        parts.append(f"{e.retired_pages} pages retired" + (", retirement pending" if e.retired_pending else ""))
    return "on: " + "; ".join(parts)


def _load(r: CardReading) -> str:
    util = f"{r.utilization}% busy" if r.utilization is not None else "utilisation –"
    others = r.other_processes
    who = "–" if others is None else (f"other processes {', '.join(map(str, others))}" if others else "no other process")
    return f"{util}, {who}"


def _readings_table(c: CardCheck) -> Table:
    return Table(
        [Column("reading", 0, align="left"), Column("now", 1, align="left"), Column("against", 2, align="left")],
        _reading_rows(c),
    )


def _ratio(m: Measurement) -> str:
    return f"{m.ratio:.0%}" if m.ratio is not None else "–"


def _figures_table(found: list[Measurement], specs: bool) -> Table:
    columns = [
        Column("figure", lambda m: m.name, align="left"),
        Column("measured", lambda m: fmt_figure(m.value, m.unit)),
        Column("timed", lambda m: m.size, align="left"),
    ]
    if specs:
        columns += [
            Column("specification", lambda m: fmt_figure(m.spec, m.unit) if m.spec else "–"),
            Column("ratio", _ratio),
            Column("source", lambda m: m.spec_source or "–", align="left", chars=60, html_chars=60),
        ]
    return Table(columns, found)


def _card(c: CardCheck) -> list[Section]:
    r = c.reading
    sub = f"specification: {c.spec_name} ({c.specs.form})" if c.specs else f"no specification: {c.no_specs}"
    sections: list[Section] = [Heading(f"{c.label} · {r.name}", sub), _readings_table(c)]
    if c.measurements:
        sections.append(_figures_table(c.measurements, True))
    if r.unreadable:
        listed = "; ".join(f"{what}: {why}" for what, why in r.unreadable.items())
        sections.append(Paragraph(f"not readable here: {listed}", prefix="  "))
    return sections


def _host(h: HostFacts) -> list[Section]:
    sub = f"torch {fmt_text(h.torch_version)} ({h.torch_build})"
    items = [
        ("torch threads", fmt_text(h.torch_threads)),
        ("usable CPUs", str(h.usable_cpus)),
        ("affinity", fmt_text(h.affinity)),
    ]
    sections: list[Section] = [Heading("host", sub), KeyValues(items, inline="CPUs")]
    if h.measurements:
        sections.append(_figures_table(h.measurements, False))
    return sections


def _sources(r: GpuCheck) -> list[str]:
    seen: dict[str, None] = {}
    for c in r.cards:
        for m in c.measurements:
            if m.spec_source:
                seen[m.spec_source] = None
    return list(seen)


def _headline(r: GpuCheck) -> str:
    cards = ", ".join(dict.fromkeys(f"{c.label} {c.reading.name}" for c in r.cards)) or "no GPU checked"
    count = len(r.findings)
    found = f"{count} finding{'s' if count != 1 else ''}" if count else "nothing found"
    return f"{cards}; {found}"


def gpucheck_report(r: GpuCheck) -> Report:
    sections: list[Section] = [_finding(f) for f in r.findings] or [_nothing_found(r)]
    sections += [Paragraph(line, "note", css="gm-unchecked") for line in r.unchecked]
    for c in r.cards:
        sections += _card(c)
    sections += _host(r.host)
    sources = _sources(r)
    if sources:
        sections.append(Details("specification sources", [Bullets("each figure's source", sources)]))
    sub = f"{'measured' if r.measured else 'read'} in {r.seconds:.1f} s"
    return Report("gpucheck", "%gpucheck", sub, sections, summary=_headline(r))
