"""``%gpuwatch`` now, on this machine: the live frame (the devices' current values, the
alerts, the cell running, the charts of the last window) and ``%gpuwatch status`` (the
same values, what the watch cost so far and who is on the GPUs).

Read from a snapshot only; ``watch_views.py`` picks these for a watch of this machine, and
its ``LiveFrame`` rebuilds the frame once per sample. The live view itself (IPython,
widgets) is ``watch_live.py``, never imported by the core's results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumagic.render import watch_panel as panel
from gpumagic.render.sections import Figure, Report, Section
from gpumagic.render.watch_chart import chart_block, chart_lines

if TYPE_CHECKING:
    from gpumagic.monitor.result import WatchStatus
    from gpumagic.monitor.snapshot import Snapshot


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
