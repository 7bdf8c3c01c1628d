"""``gpumagic.watch()``: start this machine's NVML watcher, or a job's through Prometheus.

One watcher runs per process, whichever kind: starting one stops the other (two would
fight over the cell marks and the live slot). The job watcher is built, and so checked
(the URL answers, the selector matches GPUs), before the running watcher is stopped, so a
typo in a URL never costs the watch already running.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from gpumagic.monitor import watcher as _local
from gpumagic.monitor.alerts import Alert
from gpumagic.monitor.job import JobWatcher
from gpumagic.monitor.job_result import JobResult
from gpumagic.monitor.prometheus import DEFAULT_TIMEOUT_S
from gpumagic.monitor.result import WatchResult
from gpumagic.monitor.watcher import Watcher

# Defaults: NVML refreshes utilisation up to 6 times a second; Prometheus scrapes
# dcgm-exporter every 15-30 s on most clusters, so polling it every second only repeats values.
LOCAL_INTERVAL_S = 1.0
JOB_INTERVAL_S = 5.0

_job: JobWatcher | None = None
_lock = threading.RLock()


def watch(
    interval: float | None = None,
    log: str | os.PathLike[str] | None = None,
    gpus: int | str | Sequence[int] | None = None,
    window: float = 300.0,
    *,
    cells: bool = True,
    shell: Any = None,
    price: float | None = None,
    idle_alert: float | str | None = None,
    on_idle: Callable[[Alert], object] | None = None,
    prometheus: str | None = None,
    selector: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Watcher | JobWatcher:
    """Start watching (replacing any running watcher) and return the started watcher.

    Without ``prometheus``: this machine's GPUs through NVML (host CPU and RAM without one);
    see :func:`gpumagic.monitor.watcher.watch` (``interval`` defaults to 1 s, ``price`` is
    dollars per hour of the instance).

    With ``prometheus="http://prometheus:9090"``: every GPU of a job, on every node, from the
    DCGM exporter series Prometheus holds (:class:`~gpumagic.monitor.job.JobWatcher`).
    ``selector``: PromQL label matchers picking the job's GPUs (``Hostname=~"node-[0-3]"``);
    ``price``: dollars per GPU-hour; ``interval`` defaults to 5 s; ``timeout``: seconds each
    request may take. An unreachable URL, a selector that matches nothing or a server
    without DCGM series raise ValueError naming it, before anything is stopped.
    """
    global _job
    if prometheus is None:
        if selector is not None:
            raise ValueError(
                "selector picks GPUs among Prometheus's series: give prometheus=URL too"
            )
        with _lock:
            stop_job()
            return _local.watch(
                LOCAL_INTERVAL_S if interval is None else interval,
                log,
                gpus,
                window,
                cells=cells,
                shell=shell,
                price=price,
                idle_alert=idle_alert,
                on_idle=on_idle,
            )
    if gpus is not None:
        raise ValueError(
            "gpus names this machine's CUDA devices; with prometheus, pick the job's GPUs with "
            'selector (e.g. gpu="0", Hostname="node-1")'
        )
    if idle_alert is not None or on_idle is not None:
        raise ValueError("idle_alert watches this kernel's GPUs: not with prometheus")
    job = JobWatcher(
        prometheus,
        selector,
        JOB_INTERVAL_S if interval is None else interval,
        window,
        log,
        cells=cells,
        shell=shell,
        price=price,
        timeout=timeout,
    )
    with _lock:
        _local.stop_current()
        stop_job()
        job.start()
        _job = job
    return job


def stop_job() -> JobResult | None:
    """Stop the running job watcher, if any."""
    global _job
    with _lock:
        job, _job = _job, None
    return job.stop() if job is not None else None


def current() -> Watcher | JobWatcher | None:
    """The running watcher, of either kind."""
    job = _job
    if job is not None and job.running:
        return job
    return _local.current()


def stop_current() -> WatchResult | JobResult | None:
    """Stop whatever watcher runs (``%unload_ext`` and kernel shutdown); a metrics endpoint
    serving it stops with it."""
    job = stop_job()
    local = _local.stop_current()
    return job if job is not None else local
