"""``%gpuselect`` on screen: what was chosen, what was set, and every GPU with why (not)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumagic.render.html import escape, table, text_table, wrap
from gpumagic.units import fmt_bytes, fmt_percent

if TYPE_CHECKING:
    from gpumagic.monitor.choose import Candidate, GpuChoice

_HEADERS = ["GPU", "name", "free / total", "util", "other processes", "verdict"]
_LEFT = (0, 1, 4, 5)


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


def _rows(choice: GpuChoice) -> list[list[str]]:
    return [
        [
            f"GPU {c.index}",
            c.name,
            f"{fmt_bytes(c.free)} / {fmt_bytes(c.total)}",
            fmt_percent(c.utilization),
            _others(c),
            _verdict(choice, c),
        ]
        for c in choice.candidates
    ]


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


def choice_text(choice: GpuChoice) -> str:
    lines = [headline(choice), env_line(choice), text_table(_HEADERS, _rows(choice), left=_LEFT)]
    lines.extend(f"note: {n}" for n in choice.notes)
    return "\n".join(lines)


def choice_html(choice: GpuChoice) -> str:
    rows = [[escape(v) for v in r] for r in _rows(choice)]
    body = (
        f'<h4>gpuselect <span class="gm-sub">{escape(env_line(choice))}</span></h4>'
        f'<div class="gm-box gm-info">{escape(headline(choice))}</div>'
        + table(
            _HEADERS,
            rows,
            left=_LEFT,
            row_classes=["gm-hot" if c.chosen else "" for c in choice.candidates],
        )
        + "".join(f'<div class="gm-note">{escape(n)}</div>' for n in choice.notes)
    )
    return wrap("select", body)
