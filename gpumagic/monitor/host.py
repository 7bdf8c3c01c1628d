"""The host as a source of samples (psutil): the machine's CPU % and RAM, and this
process's CPU share and RSS, in one row after this machine's GPUs.

CPU percentages are computed from our own ``cpu_times()`` deltas instead of
``psutil.cpu_percent(interval=None)``: that function keeps its "since the last call"
baseline in module state, so any other caller in the kernel (a progress bar, another
monitor) would silently shorten our measuring window and vice versa.
"""

from __future__ import annotations

import math
import os
import platform
import time
from typing import Any

import numpy as np

from gpumagic.device_kinds import HOST
from gpumagic.monitor import metrics as M
from gpumagic.monitor.alerts import Alert, compute_alerts
from gpumagic.monitor.cells import CellRecord
from gpumagic.monitor.devices import WatchedDevice
from gpumagic.monitor.machine import MACHINE
from gpumagic.monitor.source import Recent, SourceBase

# A delta over less wall time than this is mostly timer granularity (clock ticks are
# 10 ms on Linux), so the first sample right after start reports CPU % as missing.
_MIN_CPU_WINDOW_S = 0.05


def _busy_total(times: Any) -> tuple[float, float]:
    """(busy, total) seconds from a psutil cpu_times tuple, the way psutil.cpu_percent counts.

    On Linux guest time is already included in user/nice, so it is taken out of the total;
    iowait is idle time for CPU % purposes.
    """
    total = sum(times)
    total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


class HostReader:
    """Fills the host row of a sample; never raises (missing values stay NaN)."""

    def __init__(self) -> None:
        self.device = WatchedDevice(HOST, platform.node() or "host")
        self.error: str | None = None
        try:
            import psutil
        except ImportError:
            self._psutil: Any = None
            self.error = "host metrics unavailable: psutil is not installed (pip install psutil)"
            return
        self._psutil = psutil
        self._proc = psutil.Process(os.getpid())
        self._ncpu = psutil.cpu_count() or 1
        self._last_wall = time.monotonic()
        self._last_busy, self._last_total = _busy_total(psutil.cpu_times())
        self._last_proc = self._proc_cpu_seconds()

    @staticmethod
    def _proc_cpu_seconds() -> float:
        # os.times() is one syscall; psutil's Process.cpu_times() parses /proc/<pid>/stat,
        # which costs ~0.2 ms of kernel time per call on a cold cache.
        t = os.times()
        return float(t.user + t.system)

    def read(self, row: np.ndarray) -> None:
        if self._psutil is None:
            return
        try:
            self._read(row)
        except Exception as exc:  # /proc hiccup, process table race: missing for this sample
            self.error = f"host metrics: {type(exc).__name__}: {exc}"

    def _read(self, row: np.ndarray) -> None:
        ps = self._psutil
        vm = ps.virtual_memory()
        # total - available is the RAM programs actually hold (psutil's `used` leaves out
        # reclaimable buffers/caches differently per platform).
        row[M.HOST_MEM_USED] = float(vm.total - vm.available)
        row[M.HOST_MEM_TOTAL] = float(vm.total)
        row[M.PROC_RSS] = float(self._proc.memory_info().rss)

        now = time.monotonic()
        if now - self._last_wall < _MIN_CPU_WINDOW_S:
            return  # keep the old baseline so the next sample measures a real window
        busy, total = _busy_total(ps.cpu_times())
        proc = self._proc_cpu_seconds()
        d_total = total - self._last_total
        if d_total > 0:
            row[M.HOST_CPU] = min(100.0, max(0.0, 100.0 * (busy - self._last_busy) / d_total))
        wall = now - self._last_wall
        share = 100.0 * (proc - self._last_proc) / (wall * self._ncpu)
        row[M.PROC_CPU] = min(100.0, max(0.0, share)) if math.isfinite(share) else math.nan
        self._last_wall, self._last_busy, self._last_total, self._last_proc = now, busy, total, proc


class HostSource(SourceBase):
    """The host's row: what a cell's peak CPU and RAM are, and the host-memory alert."""

    layout = MACHINE

    def __init__(self) -> None:
        self.reader = HostReader()
        self._devices = (self.reader.device,)

    @property
    def devices(self) -> tuple[WatchedDevice, ...]:
        return self._devices

    def read(self, t: float) -> np.ndarray:
        rows = np.full((1, M.N_METRICS), np.nan)
        self.reader.read(rows[0])
        return rows

    def fold(self, cell: CellRecord, rows: np.ndarray) -> None:
        cell.fold_host(rows[0])

    def alerts(self, recent: Recent, running: CellRecord | None) -> list[Alert]:
        times, values = recent(0.0)
        return compute_alerts(self._devices, times, values, running)

    def notes(self) -> list[str]:
        return [self.reader.error] if self.reader.error else []
