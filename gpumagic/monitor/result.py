"""What a watcher hands back: ``WatchStatus`` (the values now) and ``WatchResult`` (the
window's samples and the cells that ran), as plain data plus a mime bundle.

The frames come from the snapshot's layout (:mod:`gpumagic.monitor.snapshot`): ``samples``
and ``series`` from its columns and labels, ``cells`` and the frames a view offers beyond
them (a job's ``gpus``, ``stragglers``, ``xid_errors``) from the functions it names. A
frame the layout does not offer is an AttributeError that says which watch has it. pandas
is imported when a frame is first asked for.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpumagic.monitor.frames import device_values, samples_frame, series_frame
from gpumagic.render.html import Rendered

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.monitor.alerts import Alert
    from gpumagic.monitor.cost import CostState
    from gpumagic.monitor.snapshot import Snapshot
    from gpumagic.render.sections import Report


def offered(snapshot: Snapshot, name: str) -> pd.DataFrame:
    """The frame ``name`` of the snapshot's view, or an AttributeError naming who offers it."""
    build = snapshot.layout.frames.get(name)
    if build is None:
        offers = ", ".join(f".{n}" for n in ("samples", "series", "cells", *snapshot.layout.frames))
        raise AttributeError(
            f".{name} is a frame of a job's watch (gpumagic.watch(prometheus=URL)); this "
            f"watch ({snapshot.layout.view}) has {offers}"
        )
    return build(snapshot)


def _process_frame(snapshot: Snapshot) -> pd.DataFrame:
    from gpumagic.monitor.processes import ProcessTable

    table = snapshot.processes if snapshot.processes is not None else ProcessTable()
    return table.frame()


class _Watched(Rendered):
    """What a status and a result share: the snapshot and what it says about the watch."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.reason = snapshot.reason
        self.notes = snapshot.notes
        self.cost: CostState | None = snapshot.cost

    @property
    def processes(self) -> pd.DataFrame:
        """Each watched GPU's compute processes (now, or at the stop for a result): pid, user,
        GPU memory (bytes), command line, ``this_kernel``; user and command are missing for
        host PIDs seen from a container."""
        return _process_frame(self.snapshot)

    @property
    def gpus(self) -> pd.DataFrame:
        """A job's GPUs: labels, latest values, mean utilisation, energy, ``straggler``."""
        return offered(self.snapshot, "gpus")


class WatchStatus(_Watched):
    """The latest sample of every device, the alerts active now and why anything is missing."""

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__(snapshot)
        self.devices: list[dict[str, Any]] = device_values(snapshot)
        self.alerts: list[Alert] = snapshot.alerts
        self.time = snapshot.now
        self.running = snapshot.running

    def __getitem__(self, device: str) -> dict[str, Any]:
        """``status["cuda:0"]`` or ``status["host"]``."""
        for entry in self.devices:
            if entry["device"] == device:
                return entry
        raise KeyError(f"{device!r}: devices are {[e['device'] for e in self.devices]}")

    def _report(self) -> Report:
        from gpumagic.render.watch_views import status_report

        return status_report(self)


class WatchResult(_Watched):
    """A stopped (or snapshotted) watch: ``samples``, ``series`` and ``cells`` frames, the
    log path, alerts seen, energy and cost, and a static summary chart as its mime bundle."""

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__(snapshot)
        self.devices = snapshot.devices
        self.log: str | None = snapshot.log_path
        self.interval = snapshot.interval
        self.window = snapshot.window
        self.alerts: list[tuple[Alert, float, int]] = snapshot.alerts_seen
        self.samples_taken = snapshot.samples_taken
        self._frames: dict[str, pd.DataFrame] = {}

    def _frame(self, name: str) -> pd.DataFrame:
        if name not in self._frames:
            snap = self.snapshot
            builders = {
                "samples": samples_frame,
                "series": series_frame,
                "cells": snap.layout.cells,
            }
            self._frames[name] = builders[name](snap)
        return self._frames[name]

    @property
    def has_gpus(self) -> bool:
        return self.snapshot.has_gpus

    @property
    def sample_cpu_mean_s(self) -> float:
        """Mean CPU seconds one sample cost the sampler thread."""
        n = self.snapshot.samples_taken
        return self.snapshot.sample_cpu_s / n if n else math.nan

    @property
    def energy_wh(self) -> float:
        """The watched GPUs' energy while watched (NaN without an energy counter)."""
        return self.cost.energy_wh if self.cost is not None else math.nan

    @property
    def cost_usd(self) -> float:
        """The price times the time watched (per GPU-hour for a job: times its GPUs); NaN
        without a price."""
        return self.cost.total_usd if self.cost is not None else math.nan

    @property
    def samples(self) -> pd.DataFrame:
        """Every sample in the window, one row per device per sample."""
        return self._frame("samples")

    @property
    def series(self) -> pd.DataFrame:
        """Every value in the window, one row each, with its labels (a job's CSV's columns)."""
        return self._frame("series")

    @property
    def cells(self) -> pd.DataFrame:
        """One row per cell that ran while watching: its peaks (this machine) or the job's
        utilisation and stragglers while it ran, its energy and, with a price, its cost."""
        return self._frame("cells")

    @property
    def stragglers(self) -> pd.DataFrame:
        """A job's GPUs whose utilisation over the window fell well below the job's median."""
        return offered(self.snapshot, "stragglers")

    @property
    def xid_errors(self) -> pd.DataFrame:
        """A job's GPUs whose last XID error is not zero, since when."""
        return offered(self.snapshot, "xid_errors")

    def _report(self) -> Report:
        from gpumagic.render.watch_views import result_report

        return result_report(self)
