"""Durations no profiler records: an event longer than a day is a corrupt number.

One op with ``"dur": 1e308`` loaded, then made every sum and share of the report infinite
or NaN, and rendering failed (an OverflowError, issue 25). Such an event ends where the
trace's other events end, and a note names the file and the event.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpumagic.profile.trace.model import GpuEvents, HostEvents, RuntimeEvents, SyncEvents

__all__ = ["MAX_EVENT_US", "clip_absurd_durations"]

# No profiler window lasts a day (Kineto's buffers fill in minutes): a longer duration is
# a corrupt or hand-edited number.
MAX_EVENT_US = 86_400e6


def clip_absurd_durations(
    source: str, events: tuple[HostEvents | RuntimeEvents | GpuEvents | SyncEvents, ...]
) -> list[str]:
    """End every event longer than :data:`MAX_EVENT_US` (or of no finite length) where the
    trace's other events end, in place: the recording stopped there, whatever the number
    written. A note names the file (one of a job's ranks) and the first such event."""
    bad = [~(x.end - x.ts <= MAX_EVENT_US) for x in events]  # NaN and inf are bad too
    count = sum(int(b.sum()) for b in bad)
    if not count:
        return []
    ends = [x.end[~b] for x, b in zip(events, bad) if (~b).any()]
    last = max(float(e.max()) for e in ends) if ends else -np.inf
    first = ""
    for x, b in zip(events, bad):
        rows = np.flatnonzero(b)
        if len(rows) and not first:
            r = int(rows[0])
            first = f"{x.name.at(r)}, written as {float(x.end[r] - x.ts[r]):.3g} µs"
        x.end[rows] = np.maximum(x.ts[rows], last)
    what = "1 event lasts" if count == 1 else f"{count} events last"
    return [
        f"{Path(source).name}: {what} longer than a day ({first}), which no profiler records: "
        f"{'it ends' if count == 1 else 'they end'} where the trace's other events end."
    ]
