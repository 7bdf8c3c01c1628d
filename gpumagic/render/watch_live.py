"""``%gpuwatch``'s live view: a ``LiveView`` that follows a ``Watcher`` from the front end,
whatever it reads (this machine, or a job through Prometheus).

The sampler core publishes (``seq``, ``subscribe()``) and never draws (issue 8). This module
is the other side: the view polls ``LiveFrame``, which rebuilds the frame only when ``seq``
moved, and it subscribes to the watcher's stop to freeze the slot into a one-line note (the
summary shows where ``stop`` was called). Only the glue imports this module; the core's
results render through ``watch_views.py``, which stays free of IPython and widgets.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gpumagic.render.html import Note
from gpumagic.render.live import LiveView
from gpumagic.render.watch_summary import StoppedNote
from gpumagic.render.watch_views import LiveFrame
from gpumagic.units import fmt_clock, fmt_seconds

if TYPE_CHECKING:
    from gpumagic.monitor.watcher import Watcher, WatchEvent

# A widget update is a comm message to the browser: more often than every 0.5 s is noise for
# the eye and load for the front end, even when sampling faster.
MIN_REFRESH_S = 0.5


def start_view(watcher: Watcher, delay: float = 0.0) -> LiveView:
    """Show ``watcher``'s live frame in the current output, until the watcher stops.

    In a terminal (or with ``GPUMAGIC_LIVE=off``) the view is off: it exists and renders on
    ``refresh()``, but shows nothing.
    """
    view = LiveView(
        LiveFrame(watcher),
        delay=delay,
        interval=max(watcher.interval, MIN_REFRESH_S),
        name="gpumagic-watch-view",
    )

    def on_event(event: WatchEvent) -> None:
        if event == "stop":  # on the thread that called stop(): the main thread, in a notebook
            stopped = watcher.stopped_at if watcher.stopped_at is not None else time.time()
            view.finish(StoppedNote(watcher.result(), watcher.started, stopped))

    view.start()
    view.refresh()  # the first frame now, not one interval later
    # After start(): a watcher that stopped already finishes the view at once.
    watcher.subscribe(on_event)
    return view


def _watching(watcher: Watcher) -> str:
    """What a watcher watches, in words: its GPUs, a job's GPUs and where from, or the host."""
    gpus = watcher.gpus
    hosts = {d.host for d in gpus if d.host is not None}
    if hosts:
        return f"{len(gpus)} GPUs on {len(hosts)} node(s) through {watcher.origin}"
    if gpus:
        return ", ".join(d.label for d in gpus)
    return f"host CPU and RAM (no GPU panel: {watcher.reason})"


def started_note(watcher: Watcher, previous: Watcher | None, live: bool) -> Note | None:
    """The line a start shows beside (or, in a terminal, instead of) the live chart: that
    the watch started, what it watches, and what became of the watch it replaced."""
    replaced = ""
    if previous is not None and previous is not watcher:
        replaced = (
            f"replaced the watch started at {fmt_clock(previous.started)} "
            f"({previous.samples_taken} samples); its result is in _gpuwatch"
        )
    if live:  # the chart says it started
        return Note(f"%gpuwatch: {replaced}", "watch-note") if replaced else None
    line = (
        f"%gpuwatch started: every {fmt_seconds(watcher.interval)}, watching {_watching(watcher)}"
        + (f", logging to {watcher.log_path}" if watcher.log_path else "")
        + "; %gpuwatch status shows the values now, %gpuwatch stop the summary"
    )
    return Note(f"{line}; {replaced}" if replaced else line, "watch-note")
