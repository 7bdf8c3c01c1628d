"""How a watcher tells front ends what changed, without knowing who they are (issue 8).

A subscriber is told ``"sample"`` after every sample, on the thread that took it, and
``"stop"`` once, when the result is final; nothing is told after the stop. A subscriber that
raises (``SystemExit`` included) never reaches the sampler or ``stop()``'s caller: its
error is kept for the notes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal

__all__ = ["Publisher", "WatchEvent"]

# What a subscriber is told: a new sample is in, or the watcher stopped (its result is final).
WatchEvent = Literal["sample", "stop"]


class Publisher:
    """The subscribers of one watcher."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: list[Callable[[WatchEvent], None]] = []
        self._stopped = False
        self.error: str | None = None  # the last subscriber's failure, for the notes

    def subscribe(self, callback: Callable[[WatchEvent], None]) -> Callable[[], None]:
        """Add ``callback``; returns the function that removes it. After the stop, it is told
        ``"stop"`` at once."""
        with self._lock:
            stopped = self._stopped
            if not stopped:
                self._subscribers.append(callback)
        if stopped:
            self._tell(callback, "stop")

        def unsubscribe() -> None:
            with self._lock:
                for i, cb in enumerate(self._subscribers):
                    if cb is callback:
                        del self._subscribers[i]
                        break

        return unsubscribe

    def publish(self, event: WatchEvent) -> None:
        with self._lock:
            if self._stopped:
                return
            subscribers = list(self._subscribers)
            if event == "stop":  # the last word: nothing is published after it
                self._stopped = True
                self._subscribers.clear()
        for callback in subscribers:
            self._tell(callback, event)

    def _tell(self, callback: Callable[[WatchEvent], None], event: WatchEvent) -> None:
        try:
            callback(event)
        except BaseException as exc:  # a front end's bug (even a sys.exit()) stops nothing
            if isinstance(exc, KeyboardInterrupt) and (
                threading.current_thread() is threading.main_thread()
            ):
                raise  # Ctrl-C while stop() tells the live view: the user's to have
            self.error = f"{event!r} subscriber failed: {type(exc).__name__}: {exc}"
