"""A job's GPUs on every node, through Prometheus and NVIDIA DCGM: a source for the watcher.

``gpumagic.watch(prometheus="http://prometheus:9090", selector='job="dcgm"')`` watches
them with the one :class:`~gpumagic.monitor.watcher.Watcher`; this room holds what is
particular to them, from the bottom up:

- ``prometheus``: a small client for Prometheus's HTTP API, every call with a deadline;
  :class:`PrometheusError` names the URL (and the query) whatever went wrong.
- ``dcgm``: DCGM's field names as dcgm-exporter publishes them, its labels, its blanks.
- ``stats``: what the fields say: stragglers, XID errors, a cell's job-wide numbers.
- ``frames``: the result's frames of a job (``cells``, ``gpus``, ``stragglers``,
  ``xid_errors``).
- ``source``: :class:`PrometheusSource`, and :data:`JOB`, the layout its samples fill.

The job view on screen is :mod:`gpumagic.render.job`.
"""

from __future__ import annotations

from gpumagic._lazy import lazy_exports

_LAZY = {
    "JOB": ("gpumagic.monitor.job.source", "JOB"),
    "PrometheusSource": ("gpumagic.monitor.job.source", "PrometheusSource"),
    "PrometheusError": ("gpumagic.monitor.job.prometheus", "PrometheusError"),
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
