"""``%gpuselect`` on screen: what was chosen, what was set, and every GPU with why (not)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumagic.render.sections import Paragraph, Report
from gpumagic.render.table import Column, Table
from gpumagic.units import fmt_bytes, fmt_percent

if TYPE_CHECKING:
    from gpumagic.monitor.choose import Candidate, GpuChoice

def _verdict(choice: GpuChoice, c: Candidate) -> str:
    if c.chosen:
        return f"chosen: cuda:{choice.indices.index(c.index)}"
    if c.skipped:
        return "skipped: " + "; ".join(c.skipped)
    return f"eligible, ranked {c.rank}"


def _others(c: Candidate) -> str:
    others = c.others
    if not others:
        return c.process_note or "none"
    total = sum(p.gpu_memory for p in others if p.gpu_memory == p.gpu_memory)
    return f"{len(others)}: {', '.join(c.users)} ({fmt_bytes(total)})"


def _table(choice: GpuChoice) -> Table:
    columns = [
        Column("GPU", lambda c: f"GPU {c.index}", align="left"),
        Column("name", "name", align="left"),
        Column("free / total", lambda c: f"{fmt_bytes(c.free)} / {fmt_bytes(c.total)}"),
        Column("util", "utilization", fmt_percent),
        Column("other processes", _others, align="left"),
        Column("verdict", lambda c: _verdict(choice, c), align="left"),
    ]
    return Table(columns, choice.candidates, highlight=lambda c: "hot" if c.chosen else "")


def headline(choice: GpuChoice) -> str:
    chosen = [c for c in choice.candidates if c.chosen]
    picks = "; ".join(f"GPU {c.index} ({c.name}): {c.load()}" for c in chosen)
    head = f"Chose {picks}."
    why = (
        f" Criteria: {', '.join(choice.criteria)}."
        if choice.criteria
        else " Least loaded first: no other process, most free memory, lowest utilisation."
    )
    return head + why


def env_line(choice: GpuChoice) -> str:
    if not choice.env:
        return "Not applied (apply=False): set CUDA_VISIBLE_DEVICES yourself before CUDA starts."
    sets = " ".join(f"{k}={v}" for k, v in choice.env.items())
    return f"Set {sets}: cuda:0 is GPU {choice.indices[0]}, numbered as nvidia-smi numbers it."


def choice_report(choice: GpuChoice) -> Report:
    """The headline (what was chosen, on which criteria), then every GPU with why (not)."""
    return Report(
        "select",
        "gpuselect",
        env_line(choice),
        [
            Paragraph(headline(choice), "info"),
            _table(choice),
            *(Paragraph(n, prefix="note: ") for n in choice.notes),
        ],
    )
