"""``gpumagic.watch()``: start the one watcher, over this machine's sources or a job's.

The sources are built first, and so checked (a GPU index that is not visible; a Prometheus
URL that does not answer, a selector that matches no GPU), before the running watcher is
stopped: a typo never costs the watch already running.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from gpumagic.monitor.alerts import Alert
from gpumagic.monitor.job.prometheus import DEFAULT_TIMEOUT_S
from gpumagic.monitor.job.source import PrometheusSource
from gpumagic.monitor.source import Source
from gpumagic.monitor.watcher import Watcher, machine_sources


def sources_for(
    gpus: int | str | Sequence[int] | None = None,
    prometheus: str | None = None,
    selector: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> list[Source]:
    """The sources ``watch()`` reads: this machine's GPUs and host, or (``prometheus``) the
    GPUs of a job that Prometheus's DCGM series show."""
    if prometheus is None:
        if selector is not None:
            raise ValueError(
                "selector picks GPUs among Prometheus's series: give prometheus=URL too"
            )
        return machine_sources(gpus)
    if gpus is not None:
        raise ValueError(
            "gpus names this machine's CUDA devices; with prometheus, pick the job's GPUs with "
            'selector (e.g. gpu="0", Hostname="node-1")'
        )
    return [PrometheusSource(prometheus, selector, timeout)]


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
) -> Watcher:
    """Start watching (replacing any running watcher) and return the started ``Watcher``.

    ``interval``: seconds between samples (floor 0.1; default 1, or 5 with ``prometheus``).
    ``log``: CSV path. ``gpus``: CUDA indexes to watch (default every visible GPU).
    ``window``: seconds of history kept in memory and drawn. ``shell``: the IPython shell
    whose cells to mark (``get_ipython()`` in a notebook; none are marked without it). Bad
    input raises ValueError before any thread starts. ``stop()`` on the watcher returns a
    ``WatchResult``. ``price`` ($/h), ``idle_alert`` (``"30m"``) and ``on_idle(alert)``:
    the cost of each cell and of the idle time, and an alert when the instance sits idle.
    Without an NVIDIA GPU it samples the host's CPU and RAM, and ``reason`` says why.

    With ``prometheus="http://prometheus:9090"``: every GPU of a job, on every node, from the
    DCGM exporter series Prometheus holds (:mod:`gpumagic.monitor.job`). ``selector``:
    PromQL label matchers picking the job's GPUs (``Hostname=~"node-[0-3]"``); ``price``:
    dollars per GPU-hour; ``timeout``: seconds each request may take. An unreachable URL, a
    selector that matches nothing or a server without DCGM series raise ValueError naming
    it, before anything is stopped.
    """
    if prometheus is not None and (idle_alert is not None or on_idle is not None):
        raise ValueError("idle_alert watches this kernel's GPUs: not with prometheus")
    return Watcher(
        sources_for(gpus, prometheus, selector, timeout),
        interval=interval,
        window=window,
        log=log,
        cells=cells,
        shell=shell,
        price=price,
        idle_alert=idle_alert,
        on_idle=on_idle,
    ).start()
