"""``%gpuwatch`` and ``%gpuselect`` core (``gpumagic.watch(...)`` is :func:`watch` here):
one watcher that samples its sources in a background thread.

Script use::

    w = gpumagic.watch(interval=1.0, log="gpu.csv")
    ...                       # train
    result = w.stop()         # result.samples, result.cells, result.log

The sources are this machine's GPUs (NVML) and host (psutil); with no NVIDIA driver or GPU
the same calls sample host CPU and RAM, and ``reason`` says why there is no GPU panel. Only
one watcher runs per process; starting another replaces it.

A job on many nodes: ``gpumagic.watch(prometheus="http://prometheus:9090",
selector='job="dcgm"')`` reads every GPU's DCGM series through Prometheus, a source of its
own (:mod:`gpumagic.monitor.job`); ``gpumagic.serve_metrics(port)`` serves this kernel's
samples for Prometheus to scrape (:mod:`gpumagic.monitor.exporter`).

The rooms, from the top: ``exporter`` (serve_metrics) over ``start`` (``watch()``) over
``watcher`` (the lifecycle, the current watcher) over ``result``, ``health`` (failures,
counted) and ``publisher`` (subscribers) over the sources
(``nvml_source``, ``host``, ``job``) over the data they share (``source``, ``snapshot``,
``machine``, ``frames``, ``csvlog``, ``cells``, ``cost``, ``alerts``, ``ring``, ``metrics``,
``devices``, ``nvml``, ``processes``); ``choose`` (``%gpuselect``) stands beside them.
"""

from __future__ import annotations

from gpumagic._lazy import lazy_exports

_LAZY = {
    "Alert": ("gpumagic.monitor.alerts", "Alert"),
    "WatchedDevice": ("gpumagic.monitor.devices", "WatchedDevice"),
    "MetricsServer": ("gpumagic.monitor.exporter.server", "MetricsServer"),
    "serve_metrics": ("gpumagic.monitor.exporter.server", "serve_metrics"),
    "PrometheusError": ("gpumagic.monitor.job.prometheus", "PrometheusError"),
    "PrometheusSource": ("gpumagic.monitor.job.source", "PrometheusSource"),
    "WatchResult": ("gpumagic.monitor.result", "WatchResult"),
    "WatchStatus": ("gpumagic.monitor.result", "WatchStatus"),
    "Source": ("gpumagic.monitor.source", "Source"),
    "SourceBase": ("gpumagic.monitor.source", "SourceBase"),
    "watch": ("gpumagic.monitor.start", "watch"),
    "Watcher": ("gpumagic.monitor.watcher", "Watcher"),
    "current": ("gpumagic.monitor.watcher", "current"),
    "machine_sources": ("gpumagic.monitor.watcher", "machine_sources"),
    "stop_current": ("gpumagic.monitor.watcher", "stop_current"),
}

__all__ = [*_LAZY, "stop_all"]


def stop_all() -> None:
    """Stop the watcher and the metrics endpoints, if any run, without importing the monitor's
    modules to find out (``%unload_ext``): they import numpy, about 90 ms of a ~110 ms
    ``%load_ext``, and nothing can run before its module was imported."""
    import sys

    watcher = sys.modules.get("gpumagic.monitor.watcher")  # the one registry, whatever it reads
    if watcher is not None:
        watcher.stop_current()
    exporter = sys.modules.get("gpumagic.monitor.exporter.server")
    if exporter is not None:
        exporter.stop_serving()


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
