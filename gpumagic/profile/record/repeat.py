"""``%%gpuprofile --repeat N``: the runs of one cell, merged into one result.

Each run of the cell is a :class:`~.run.ProfileRun` of its own. A run before the last that
completed and was analysed is kept as samples of the step time and shows nothing; the last
run, or the first that failed (the cell's error ends the repeats) or could not be analysed,
ends with a result that holds the runs kept before it
(:meth:`~gpumagic.profile.result.ProfileResult.with_earlier_runs`): its tables describe
its own run, its step statistics and a comparison's interval count every run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpumagic.profile.record.finish import Finished
    from gpumagic.profile.result import ProfileResult


class Repeats:
    """The ``count`` runs of one profiled cell (``--repeat N``)."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError("--repeat must be at least 1")
        self.count = count
        self.earlier: list[ProfileResult] = []  # the runs kept as samples, oldest first

    def __iter__(self) -> Iterator[bool]:
        """For each run, whether it is the last (which alone writes ``--trace`` and shows a
        live view)."""
        return (i == self.count - 1 for i in range(self.count))

    def end(self, done: Finished, last: bool) -> Finished | None:
        """One run's ending: None for a run kept as samples (nothing to show or keep), else
        ``done``, its result holding the runs kept before it."""
        if not last and not done.cell_error and done.analysed and done.result is not None:
            self.earlier.append(done.result)
            return None
        if done.result is not None and self.earlier:
            done.result = done.result.with_earlier_runs(self.earlier)
        return done
