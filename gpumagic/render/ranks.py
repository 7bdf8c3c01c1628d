"""The slowest ranks of a job and what makes them slow: a block of the ``%%gpuprofile``
report for a directory of rank traces (see :func:`gpumagic.profile.ranks.slow_ranks`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumagic.render.html import escape
from gpumagic.units import fmt_us

if TYPE_CHECKING:
    from gpumagic.profile.result import ProfileResult

# Named in the report; .slow_ranks has them all.
SHOWN = 5


def _lines(r: ProfileResult) -> tuple[str, list[str]]:
    from gpumagic.profile.ranks import SLOW_SHARE

    frame = r.slow_ranks
    if frame.empty:
        return (
            f"Slowest ranks: none is more than {SLOW_SHARE:.0%} of a step behind the median rank",
            [],
        )
    more = f" ({len(frame) - SHOWN} more in .slow_ranks)" if len(frame) > SHOWN else ""
    title = f"Slowest ranks: {len(frame)} of {len(r.ranks)} behind the median rank{more}"
    body = [
        f"rank {row.rank}: {fmt_us(row.behind_us_per_step)} per step behind; {row.reason}"
        for row in frame.head(SHOWN).itertuples()
    ]
    return title, body


def slow_ranks_text(r: ProfileResult) -> list[str]:
    if len(r.ranks) < 2:
        return []
    title, body = _lines(r)
    return ["", title, *(f"  {line}" for line in body)]


def slow_ranks_html(r: ProfileResult) -> str:
    if len(r.ranks) < 2:
        return ""
    title, body = _lines(r)
    items = "".join(f"<li>{escape(line)}</li>" for line in body)
    return f"<div class='gm-box gm-info'><b>{escape(title)}</b>" + (
        f"<ul>{items}</ul></div>" if items else "</div>"
    )
