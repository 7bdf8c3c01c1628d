"""``%gpuwatch``'s live chart: a ``LiveView`` that follows a ``Watcher`` from the front end.

The sampler core publishes (``seq``, ``subscribe()``) and never draws (issue 8). This module
is the other side: the view polls ``LiveFrame``, which rebuilds the frame only when ``seq``
moved, and it subscribes to the watcher's stop to freeze the slot into a one-line note (the
summary shows where ``stop`` was called). Only the glue imports this module; the core's
results render through ``watch_status.py`` and ``watch_summary.py``, which stays free of IPython and widgets.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gpumagic.render.live import LiveView
from gpumagic.render.watch_status import LiveFrame
from gpumagic.render.watch_summary import StoppedNote

if TYPE_CHECKING:
    from gpumagic.monitor.watcher import Watcher, WatchEvent

# A widget update is a comm message to the browser: more often than every 0.5 s is noise for
# the eye and load for the front end, even when sampling faster.
MIN_REFRESH_S = 0.5


def start_live_view(watcher: Watcher, delay: float = 0.0) -> LiveView:
    """Show ``watcher``'s live chart in the current output, until the watcher stops.

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
