"""A dry run's time limit, raised into the cell when it expires, wherever the cell is.

Checking the clock at each statement and each operation (:class:`.dry_run._Clock`) misses a
cell that waits without either: ``time.sleep(4)`` under ``--timeout 1`` returned after 4 s
(issue 25, item 5). On the main thread, where IPython and ipykernel run cells, the limit is a
``SIGALRM`` from ``signal.setitimer``: its handler raises :class:`DryRunTimeout` at the next
bytecode, which also ends a ``sleep`` or a blocking wait early (PEP 475: the call is retried
only when the handler returns). After the first expiry the timer repeats every
:data:`REPEAT_S`, so a cell whose ``except Exception`` swallows the first still stops.

The handler and timer that were there before are put back when the block ends. Where no
alarm can be set (another thread, a platform without ``setitimer``, a handler installed
outside Python, or a timer already running that this one would replace), the clock checks at
statements and operations are the limit, and :attr:`Deadline.alarm` is False so the report
can say so.
"""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["REPEAT_S", "Deadline", "DryRunTimeout", "check_timeout", "deadline"]

REPEAT_S = 0.2
# setitimer takes a C double of seconds into a timeval: beyond about a year the limit means
# "never" anyway, and very large values overflow it.
_LONGEST_ALARM_S = 366 * 24 * 3600.0


class DryRunTimeout(RuntimeError):
    """The dry run ran past its time limit."""


def check_timeout(seconds: float) -> float:
    """``seconds`` as a time limit: a finite number above 0 (nan, inf, 0 and negatives are a
    ValueError that says so)."""
    value = float(seconds)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"the time limit must be a finite number of seconds above 0, not {seconds!r}")
    return value


class Deadline:
    """``alarm``: whether the limit is enforced by an alarm (else only at the clock checks);
    ``expired``: the alarm went off."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s  # the limit as the user gave it, for the message
        self.alarm = False
        self.expired = False
        self.armed = False

    def _ring(self, signum: int, frame: FrameType | None) -> None:
        # a signal already caught in C when the timer was turned off still calls this once
        if self.armed:
            self.expired = True
            raise DryRunTimeout(f"the dry run took longer than {self.timeout_s:g} s")


def _can_alarm() -> bool:
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGALRM) is not None  # None: a handler set outside Python
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0.0  # nobody's timer is running
    )


@contextmanager
def deadline(remaining_s: float, timeout_s: float) -> Iterator[Deadline]:
    """Raise :class:`DryRunTimeout` into the block when ``remaining_s`` has passed (of a limit
    of ``timeout_s``, see the module docstring); the previous SIGALRM handler is restored
    however the block ends."""
    state = Deadline(timeout_s)
    if not _can_alarm():
        yield state
        return
    previous: Any = signal.signal(signal.SIGALRM, state._ring)
    state.alarm = state.armed = True
    try:
        signal.setitimer(signal.ITIMER_REAL, max(min(remaining_s, _LONGEST_ALARM_S), 1e-3), REPEAT_S)
        yield state
    finally:
        # An alarm may land on any bytecode here, also before the handler is disarmed: the
        # disarming is retried until it went through, so the timer and the handler are
        # always put back (a repeating alarm left behind would break every later cell).
        while True:
            try:
                state.armed = False
                signal.setitimer(signal.ITIMER_REAL, 0.0)
                signal.signal(signal.SIGALRM, previous)
                break
            except DryRunTimeout:
                continue
