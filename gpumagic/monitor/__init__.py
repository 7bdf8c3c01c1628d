"""``%gpuwatch`` core (``gpumagic.watch(...)`` is :func:`watch` here): sample GPUs (NVML) or the host (psutil) in a background thread.

Script use::

    w = gpumagic.watch(interval=1.0, log="gpu.csv")
    ...                       # train
    result = w.stop()         # result.samples, result.cells, result.log

No NVIDIA driver or GPU: the same calls sample host CPU and RAM, and ``reason`` says why
there is no GPU panel. Only one watcher runs per process; starting another replaces it.

A job on many nodes: ``gpumagic.watch(prometheus="http://prometheus:9090",
selector='job="dcgm"')`` reads every GPU's DCGM series through Prometheus
(:mod:`gpumagic.monitor.job`); ``gpumagic.serve_metrics(port)`` serves this kernel's samples
for Prometheus to scrape (:mod:`gpumagic.monitor.exporter`).
"""

from __future__ import annotations

from gpumagic.monitor.alerts import Alert
from gpumagic.monitor.devices import WatchedDevice
from gpumagic.monitor.exporter import MetricsServer, serve_metrics
from gpumagic.monitor.job import JobWatcher
from gpumagic.monitor.job_result import JobResult, JobStatus
from gpumagic.monitor.prometheus import PrometheusError
from gpumagic.monitor.result import WatchResult, WatchStatus
from gpumagic.monitor.start import current, stop_current, watch
from gpumagic.monitor.watcher import Watcher

# The name this class had before memory's traced device got a class of its own: kept so that
# code written against it keeps working.
Device = WatchedDevice

__all__ = [
    "Alert",
    "Device",
    "JobResult",
    "JobStatus",
    "JobWatcher",
    "MetricsServer",
    "PrometheusError",
    "WatchResult",
    "WatchStatus",
    "WatchedDevice",
    "Watcher",
    "current",
    "serve_metrics",
    "stop_current",
    "watch",
]
