"""The slowest ranks of a job and what makes them slow: a section of the ``%%gpuprofile``
report for a directory of rank traces (see :func:`gpumagic.profile.ranks.slow_ranks`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumagic.render.sections import Bullets, Paragraph, Section
from gpumagic.units import fmt_us

if TYPE_CHECKING:
    from gpumagic.profile.result import ProfileResult

# Named in the report; .slow_ranks has them all.
SHOWN = 5


def slow_ranks_sections(r: ProfileResult) -> list[Section]:
    """``Slowest ranks: 1 of 64 behind the median rank`` and one line per slow rank, why."""
    from gpumagic.profile.ranks import SLOW_SHARE

    if len(r.ranks) < 2:
        return []
    frame = r.slow_ranks
    if frame.empty:
        return [
            Paragraph(
                f"Slowest ranks: none is more than {SLOW_SHARE:.0%} of a step behind the median rank",
                "info",
            )
        ]
    more = f" ({len(frame) - SHOWN} more in .slow_ranks)" if len(frame) > SHOWN else ""
    return [
        Bullets(
            f"Slowest ranks: {len(frame)} of {len(r.ranks)} behind the median rank{more}",
            [
                f"rank {row.rank}: {fmt_us(row.behind_us_per_step)} per step behind; {row.reason}"
                for row in frame.head(SHOWN).itertuples()
            ],
        )
    ]
