"""Which report draws a watch: the view its layout names (``Layout.view``), and the one live
frame that follows any watcher.

A watch of this machine is drawn as a row of charts per device with the devices' table
(``watch_status.py`` now, ``watch_summary.py`` at the stop); a job's as its GPUs grouped by
node, with stragglers and job-wide cells (``job.py``); a layout no view is written for yet
(a new source's) as its rows' latest values, by its own labels and columns. Everything else
(the live slot, the note it freezes into, the status and result objects) is one, whatever
the watcher reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gpumagic.render import job, watch_status, watch_summary
from gpumagic.render import watch_panel as panel
from gpumagic.render.sections import Report, Section
from gpumagic.render.table import Column, Table
from gpumagic.units import fmt_seconds

if TYPE_CHECKING:
    from gpumagic.monitor.result import WatchResult, WatchStatus
    from gpumagic.monitor.snapshot import Snapshot


@dataclass(frozen=True)
class View:
    """The reports of one kind of watch."""

    live: Callable[[Snapshot], Report]  # the live frame: the last window
    status: Callable[[WatchStatus], Report]  # %gpuwatch status
    summary: Callable[[WatchResult], Report]  # %gpuwatch stop


VIEWS: dict[str, View] = {
    "machine": View(watch_status.live_report, watch_status.status_report, watch_summary.result_report),
    "job": View(job.live_report, job.status_report, job.result_report),
}


def _in(unit: str) -> Callable[[float], str]:
    """A value with its unit, as the layout names it."""
    return lambda v: "–" if math.isnan(v) else f"{v:g} {unit}".rstrip()


def _latest(snap: Snapshot, title: str) -> Report:
    """Any layout: each row's labels and latest values, the alerts, the notes."""
    layout = snap.layout
    columns = [Column(label.column, i, align="left") for i, label in enumerate(layout.labels)]
    width = len(layout.labels)
    columns += [
        Column(m.key, width + j, _in(m.unit))
        for j, m in enumerate(layout.metrics)
    ]
    latest = snap.latest()
    rows = [
        [*(label.read(d) for label in layout.labels), *latest[r].tolist()]
        for r, d in enumerate(snap.devices)
    ]
    sections: list[Section] = [
        *panel.alerts([a.message for a in snap.alerts]),
        Table(columns, rows),
        *panel.notes(snap.notes),
    ]
    sub = " · ".join(
        p
        for p in (snap.origin, f"every {fmt_seconds(snap.interval)}", f"{snap.samples_taken} samples")
        if p
    )
    return Report("watch", title, sub, sections)


def _latest_status(status: WatchStatus) -> Report:
    snap: Snapshot = status.snapshot
    return _latest(snap, "gpuwatch status")


def _latest_summary(result: WatchResult) -> Report:
    snap: Snapshot = result.snapshot
    return _latest(snap, "gpuwatch summary")


# A layout that no view is written for yet: its rows' latest values, as its layout names them.
LATEST = View(lambda snap: _latest(snap, "gpuwatch"), _latest_status, _latest_summary)


def view_of(snapshot: Snapshot) -> View:
    return VIEWS.get(snapshot.layout.view, LATEST)


def live_html(snap: Snapshot) -> str:
    return view_of(snap).live(snap).html(style=False)


def status_report(status: WatchStatus) -> Report:
    return view_of(status.snapshot).status(status)


def result_report(result: WatchResult) -> Report:
    return view_of(result.snapshot).summary(result)


class Followed(Protocol):
    """What a live frame reads of a watcher: its version, whether it runs, its snapshot."""

    @property
    def seq(self) -> int: ...

    @property
    def running(self) -> bool: ...

    def snapshot(self) -> Snapshot: ...


class LiveFrame:
    """LiveView callback: ``frame()`` is the live frame of ``watcher``'s latest sample, built
    once per sample (the watcher's ``seq`` is the version polled) and once more at the stop."""

    def __init__(self, watcher: Followed) -> None:
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
