"""``serve_metrics``: this kernel's ``%gpuwatch`` samples as a Prometheus endpoint.

The other direction from :mod:`gpumagic.monitor.job`: there a notebook reads a job's GPUs
from Prometheus; here Prometheus scrapes this kernel like a node's dcgm-exporter. Two
modules, the second over the first:

- ``collector``: what a scrape reads, the running watcher's latest sample, under DCGM's
  names and dcgm-exporter's labels for GPU series and ``gpumagic_*`` names for the host,
  this kernel and its running cell;
- ``server``: :func:`serve_metrics` and :class:`MetricsServer` (``prometheus_client``'s
  HTTP server), one endpoint per kernel, stopped with its watcher.
"""

from __future__ import annotations

from gpumagic._lazy import lazy_exports

_LAZY = {
    "MetricsServer": ("gpumagic.monitor.exporter.server", "MetricsServer"),
    "serve_metrics": ("gpumagic.monitor.exporter.server", "serve_metrics"),
    "stop_serving": ("gpumagic.monitor.exporter.server", "stop_serving"),
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
