"""The job view's live slot: a ``LiveView`` that follows a ``JobWatcher`` (front end only).

As ``watch_live.py`` does for the NVML watcher: the core publishes (``seq``, ``subscribe()``),
this module draws; only the glue imports it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gpumagic.render.job import JobLiveFrame, JobStoppedNote
from gpumagic.render.live import LiveView

if TYPE_CHECKING:
    from gpumagic.monitor.job import JobWatcher
    from gpumagic.monitor.watcher import WatchEvent

# A frame is a comm message to the browser; Prometheus scrapes every few seconds anyway.
MIN_REFRESH_S = 1.0


def start_job_view(watcher: JobWatcher, delay: float = 0.0) -> LiveView:
    """Show ``watcher``'s live frame in the current output until it stops (off in a terminal)."""
    view = LiveView(
        JobLiveFrame(watcher),
        delay=delay,
        interval=max(watcher.interval, MIN_REFRESH_S),
        name="gpumagic-job-view",
    )

    def on_event(event: WatchEvent) -> None:
        if event == "stop":
            stopped = watcher.stopped_at if watcher.stopped_at is not None else time.time()
            view.finish(JobStoppedNote(watcher.result(), watcher.started, stopped))

    view.start()
    view.refresh()
    watcher.subscribe(on_event)
    return view
