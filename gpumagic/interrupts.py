"""Ctrl-C (SIGINT) held while a measured run's resources change hands.

Used by :func:`gpumagic.cell.run_measured`: :class:`HeldInterrupts` around the run, lifted
while the cell's own code runs; :func:`interruptible` for long work in a run's ending that
may be stopped (analysing a trace). No IPython here: cores may use :func:`interruptible`.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["HeldInterrupts", "interruptible"]


class HeldInterrupts:
    """Holds Ctrl-C (SIGINT) while a run acquires and releases its resources.

    Python raises KeyboardInterrupt at whichever bytecode runs when the signal arrives,
    also between a resource's acquisition and the assignment that records it, or at the
    first line of the function meant to release it: no ``try``/``finally`` can close those
    gaps. While held, the process's SIGINT handler only records the signal; the handler
    that was there (``signal.default_int_handler`` in IPython and ipykernel) is restored
    while the cell runs and at the end, and a recorded signal is raised again through it at
    the first point where nothing can leak. Signal handlers exist only on the main thread:
    elsewhere nothing is held (and no SIGINT is delivered there either).
    """

    def __init__(self) -> None:
        self.pending = False
        self._saved: Any = None
        self.active = False

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.pending = True

    def __enter__(self) -> HeldInterrupts:
        if threading.current_thread() is not threading.main_thread():
            return self
        saved = signal.getsignal(signal.SIGINT)
        if saved is None:  # a handler installed outside Python: it could not be restored
            return self
        self._saved = saved
        signal.signal(signal.SIGINT, self._record)
        self.active = True
        _holding.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active:
            self.active = False
            _holding.remove(self)
            signal.signal(signal.SIGINT, self._saved)

    @contextmanager
    def let_through(self) -> Iterator[None]:
        """Ctrl-C acts at once inside this block; one held so far is delivered first."""
        if not self.active:
            yield
            return
        signal.signal(signal.SIGINT, self._saved)
        try:
            if self.pending:
                self.pending = False
                signal.raise_signal(signal.SIGINT)
            yield
        finally:
            # the cell may have set a handler of its own: that one is restored at the end
            current = signal.getsignal(signal.SIGINT)
            if current is not None:
                self._saved = current
            signal.signal(signal.SIGINT, self._record)

    def deliver(self) -> None:
        """After the exit: raise a held Ctrl-C through the handler restored by then."""
        if self.pending:
            self.pending = False
            signal.raise_signal(signal.SIGINT)


_holding: list[HeldInterrupts] = []  # the runs holding now, innermost last


@contextmanager
def interruptible() -> Iterator[None]:
    """Inside :func:`run_measured`'s holding, let Ctrl-C act at once for this block: long
    work that holds no resource open (analysing a recorded trace), so that the user can stop
    it. Elsewhere it does nothing."""
    if not _holding or threading.current_thread() is not threading.main_thread():
        yield
        return
    with _holding[-1].let_through():
        yield
