"""What went wrong while sampling, counted: each source's failed reads, and the rest.

A watch goes on through failures (a bad answer from Prometheus, a source that raises, a
sample that breaks part-way): each costs what it touched, the sampling goes on, and the
notes say so once per source with a count, how long it has been failing and the last error,
never one note per sample (issue 25 item 10). A source's read that raises, or that returns
values of the wrong shape, leaves that source's rows of that sample empty (NaN) while the
other sources' rows are kept; a sample whose every read failed is not kept at all.

The sampler thread must never die of what a source or a subscriber does: a read that raises
anything (``SystemExit`` included, which would otherwise end the thread without a word) is
counted here; only Ctrl-C on the main thread (a user interrupting a slow first sample)
passes through.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from gpumagic.monitor.source import Source
from gpumagic.units import fmt_clock

__all__ = ["Failures", "Health"]

# From this many failures in a row, a note says the source is failing now, not just that it
# failed at times.
REPEATED = 3


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class Failures:
    """One kind of failure, counted: how many, how many in a row now, since when, the last."""

    what: str  # who failed: a source's origin, or "sampling"
    tries: int = 0
    count: int = 0
    in_a_row: int = 0
    since: float = math.nan  # when the current run of failures began
    at: float = math.nan  # the latest failure
    last: str = ""

    def ok(self) -> None:
        self.tries += 1
        self.in_a_row = 0

    def failed(self, t: float, exc: BaseException) -> None:
        self.tries += 1
        self.count += 1
        if self.in_a_row == 0:
            self.since = t
        self.in_a_row += 1
        self.at = t
        self.last = describe(exc)

    def note(self, lost: str) -> str | None:
        """``lost``: what each failure cost, in words."""
        if not self.count:
            return None
        now = (
            f"; failing at every sample since {fmt_clock(self.since)} ({self.in_a_row} in a row)"
            if self.in_a_row >= REPEATED
            else ""
        )
        return f"{self.what}: {self.count} of {self.tries} {lost}{now}; last: {self.last}"


def source_name(source: Source) -> str:
    return source.origin or type(source).__name__


class Health:
    """The failures of one watcher: its sources' reads, whole samples, the thread itself."""

    def __init__(self, sources: tuple[Source, ...]) -> None:
        self.reads = [Failures(source_name(s)) for s in sources]
        self.sampling = Failures("sampling")  # errors part-way through a sample
        self.lost = 0  # samples not kept: every read failed
        self.thread_error: str | None = None
        self._lock = threading.Lock()

    def read(self, i: int, source: Source, t: float, columns: int) -> np.ndarray | None:
        """Source ``i``'s rows at ``t``, or None (counted) when its read failed."""
        try:
            rows = np.asarray(source.read(t), dtype=float)
            expected = (len(source.devices), columns)
            if rows.shape != expected:
                raise ValueError(
                    f"read gave values of shape {rows.shape}, not {expected} (a row per device, "
                    "a column per metric of its layout)"
                )
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt) and (
                threading.current_thread() is threading.main_thread()
            ):
                raise
            with self._lock:
                self.reads[i].failed(t, exc)
            return None
        with self._lock:
            self.reads[i].ok()
        return rows

    def sample_lost(self) -> None:
        with self._lock:
            self.lost += 1

    def sample_failed(self, t: float, exc: BaseException) -> None:
        with self._lock:
            self.sampling.failed(t, exc)

    def sample_ok(self) -> None:
        with self._lock:
            self.sampling.ok()

    def thread_stopped(self, t: float, exc: BaseException) -> None:
        self.thread_error = (
            f"the sampling thread stopped at {fmt_clock(t)}: {describe(exc)}; no sample was "
            "taken after it (start the watch again)"
        )

    @property
    def errors(self) -> int:
        """Samples lost or broken part-way."""
        return self.lost + self.sampling.count

    @property
    def last_error(self) -> str | None:
        found = [f for f in (*self.reads, self.sampling) if f.count]
        return max(found, key=lambda f: f.at).last if found else None

    def notes(self) -> list[str]:
        lost = "reads failed (each a sample without its values)"
        out = [n for f in self.reads if (n := f.note(lost)) is not None]
        sampling = self.sampling.note("samples failed part-way")
        if sampling is not None:
            out.append(sampling)
        if self.thread_error is not None:
            out.append(self.thread_error)
        return out
