"""``%gpuwatch`` core (``gpumagic.watch(...)`` is :func:`watch` here): sample GPUs (NVML) or the host (psutil) in a background thread.

Script use::

    w = gpumagic.watch(interval=1.0, log="gpu.csv")
    ...                       # train
    result = w.stop()         # result.samples, result.cells, result.log

No NVIDIA driver or GPU: the same calls sample host CPU and RAM, and ``reason`` says why
there is no GPU panel. Only one watcher runs per process; starting another replaces it.
"""

from __future__ import annotations

from gpumagic.monitor.alerts import Alert
from gpumagic.monitor.devices import WatchedDevice
from gpumagic.monitor.result import WatchResult, WatchStatus
from gpumagic.monitor.watcher import Watcher, current, stop_current, watch

# The name this class had before memory's traced device got a class of its own: kept so that
# code written against it keeps working.
Device = WatchedDevice

__all__ = [
    "Alert",
    "Device",
    "WatchResult",
    "WatchStatus",
    "WatchedDevice",
    "Watcher",
    "current",
    "stop_current",
    "watch",
]
