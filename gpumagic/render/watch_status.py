"""``%gpuwatch`` now: the live frame (the devices' current values, the alerts, the cell
running, the charts of the last window) and ``%gpuwatch status`` (the same values, what
the watch cost so far and who is on the GPUs).

``LiveFrame`` is the LiveView callback; it returns the cached frame when no new sample
arrived, so a view refreshing faster than the sampler costs nothing. Only the watcher's
public ``seq``, ``running`` and ``snapshot()`` are read here; the live view itself
(IPython, widgets) is ``watch_live.py``, never imported by the core's results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumagic.render import watch_panel as panel
from gpumagic.render.sections import Figure, Report, Section
from gpumagic.render.watch_chart import chart_block, chart_lines

if TYPE_CHECKING:
    from gpumagic.monitor.result import WatchStatus
    from gpumagic.monitor.snapshot import Snapshot
    from gpumagic.monitor.watcher import Watcher


def live_report(snap: Snapshot) -> Report:
    """The live frame: current values and alerts on top, the charts of the last window."""
    sections: list[Section] = [
        *panel.reason(snap),
        *panel.alerts([a.message for a in snap.alerts]),
        *panel.devices(snap),
        *panel.running(snap),
        Figure(lambda: chart_block(snap, live=True), lambda: chart_lines(snap, live=True)),
        *panel.notes(snap.notes),
    ]
    return Report("watch", "gpuwatch", panel.subtitle(snap, live=True), sections)


def live_html(snap: Snapshot) -> str:
    return live_report(snap).html(style=False)


class LiveFrame:
    """LiveView callback: ``frame()`` is the live frame of ``watcher``'s latest sample, built
    once per sample (the watcher's ``seq`` is the version polled) and once more at the stop."""

    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher
        # (seq, running, html) in one tuple: the view's thread and a caller may both ask.
        self._cached: tuple[int, bool, str] | None = None

    def __call__(self) -> str:
        seq, running = self.watcher.seq, self.watcher.running
        cached = self._cached
        if cached is not None and cached[:2] == (seq, running):
            return cached[2]
        html = live_html(self.watcher.snapshot())
        self._cached = (seq, running, html)
        return html


def status_report(status: WatchStatus) -> Report:
    """``%gpuwatch status``: the values now, the alerts active, the cost so far, the
    processes on the watched GPUs."""
    snap = status.snapshot
    sections: list[Section] = [
        *panel.reason(snap),
        *panel.alerts([a.message for a in status.alerts]),
        *panel.devices(snap),
        *panel.running(snap),
        *panel.cost(snap.cost, so_far=True),
        *panel.processes(snap.processes),
        *panel.notes(status.notes),
    ]
    return Report("watch-status", "gpuwatch status", panel.subtitle(snap, live=True), sections)
