"""What the endpoint serves: a collector over the watcher's latest sample, in DCGM's names.

A notebook on a cluster node can then be scraped like the node's dcgm-exporter, and the
dashboards built for dcgm-exporter read it: GPU series carry DCGM's field names and
dcgm-exporter's labels (``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname``; ``GPU_I_ID``
for a MIG instance), converted to DCGM's units (MiB for framebuffer memory). What NVML
gives and DCGM has no field for, and everything about the host or this kernel, goes under
names of its own (``gpumagic_*``): a host's CPU is never passed off as a GPU metric, and on
a machine without a GPU the endpoint has no DCGM series at all. Which cell is running is
``gpumagic_cell_running`` and ``gpumagic_cell_info{execution_count, source}``.

Each scrape reads the watcher's latest sample (nothing is measured at scrape time); a
value NVML did not give is left out, never exported as 0.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpumagic.monitor import metrics as M

if TYPE_CHECKING:
    from gpumagic.monitor.snapshot import Snapshot
    from gpumagic.monitor.watcher import Watcher

_MIB = 1024 * 1024


@dataclass(frozen=True)
class Exported:
    """One exported series: its name, help, and how to read it from a sample row."""

    name: str
    help: str
    metric: int  # index in metrics.METRICS
    scale: float = 1.0


# GPU rows, under DCGM's names (dcgm-exporter's default-counters.csv help texts)
DCGM_SERIES: tuple[Exported, ...] = (
    Exported("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", M.UTIL_GPU),
    Exported("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", M.UTIL_MEM),
    Exported("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", M.MEM_USED, 1 / _MIB),
    Exported("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", M.TEMPERATURE),
    Exported("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", M.POWER_DRAW),
    Exported(
        "DCGM_FI_DEV_POWER_MGMT_LIMIT", "Current power limit for the device (in W).", M.POWER_LIMIT
    ),
    Exported("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", M.CLOCK_SM),
    Exported("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", M.CLOCK_MEM),
    Exported(
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "Current clock throttle reasons (a bitmask of nvmlClocksThrottleReasons).",
        M.THROTTLE,
    ),
)
FB_FREE = "DCGM_FI_DEV_FB_FREE"
# GPU rows with no DCGM field: this kernel's own memory on the GPU
OWN_GPU_SERIES = (
    Exported(
        "gpumagic_kernel_gpu_memory_used_bytes",
        "GPU memory held by this Jupyter kernel's process (NVML's process list), bytes.",
        M.PROC_MEM,
    ),
)
# the host row: names of our own
HOST_SERIES: tuple[Exported, ...] = (
    Exported("gpumagic_host_cpu_percent", "The machine's CPU utilisation, %.", M.HOST_CPU),
    Exported("gpumagic_host_memory_used_bytes", "The machine's used RAM, bytes.", M.HOST_MEM_USED),
    Exported("gpumagic_host_memory_total_bytes", "The machine's RAM, bytes.", M.HOST_MEM_TOTAL),
    Exported(
        "gpumagic_kernel_cpu_percent",
        "This kernel's share of the machine's CPU time, %.",
        M.PROC_CPU,
    ),
    Exported("gpumagic_kernel_rss_bytes", "This kernel's resident memory, bytes.", M.PROC_RSS),
)
_SOURCE_CHARS = 80


class SnapshotCollector:
    """A prometheus_client collector over a watcher's latest sample."""

    def __init__(self, watcher: Watcher, hostname: str | None = None) -> None:
        self.watcher = watcher
        self.hostname = hostname or socket.gethostname()

    def describe(self) -> list[Any]:
        return []  # unchecked collector: the series depend on the GPUs present at scrape time

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self.watcher.snapshot()
        yield from self._gpus(snap, GaugeMetricFamily)
        yield from self._host(snap, GaugeMetricFamily)
        yield from self._cells(snap, GaugeMetricFamily)
        samples = CounterMetricFamily(
            "gpumagic_watch_samples", "Samples the watcher took.", labels=["Hostname"]
        )
        samples.add_metric([self.hostname], float(snap.samples_taken))
        yield samples
        if len(snap.times):
            at = GaugeMetricFamily(
                "gpumagic_watch_sample_time_seconds",
                "When the sample served was taken (Unix time).",
                labels=["Hostname"],
            )
            at.add_metric([self.hostname], float(snap.times[-1]))
            yield at

    def _gpus(self, snap: Snapshot, gauge: Any) -> Iterator[Any]:
        rows = snap.gpu_rows
        if not rows or not len(snap.times):
            return
        labels = ["gpu", "UUID", "device", "modelName", "Hostname", "GPU_I_ID"]
        latest = snap.values[-1]

        def label_values(row: int) -> list[str]:
            d = snap.devices[row]
            index = "" if d.nvml_index is None else str(d.nvml_index)
            mig = "" if d.mig_index is None else str(d.mig_index)
            return [index, d.uuid or "", f"nvidia{index}", d.name, self.hostname, mig]

        for series in (*DCGM_SERIES, *OWN_GPU_SERIES):
            family = gauge(series.name, series.help, labels=labels)
            for row in rows:
                value = float(latest[row, series.metric])
                if not math.isnan(value):
                    family.add_metric(label_values(row), value * series.scale)
            yield family
        free = gauge(FB_FREE, "Framebuffer memory free (in MiB).", labels=labels)
        for row in rows:
            total, used = float(latest[row, M.MEM_TOTAL]), float(latest[row, M.MEM_USED])
            if not (math.isnan(total) or math.isnan(used)):
                free.add_metric(label_values(row), (total - used) / _MIB)
        yield free

    def _host(self, snap: Snapshot, gauge: Any) -> Iterator[Any]:
        if not len(snap.times) or snap.host_row is None:
            return
        row = snap.values[-1, snap.host_row]
        for series in HOST_SERIES:
            family = gauge(series.name, series.help, labels=["Hostname"])
            value = float(row[series.metric])
            if not math.isnan(value):
                family.add_metric([self.hostname], value * series.scale)
            yield family

    def _cells(self, snap: Snapshot, gauge: Any) -> Iterator[Any]:
        running = [c for c in snap.cells if c.end is None]
        flag = gauge(
            "gpumagic_cell_running",
            "1 while a notebook cell runs in this kernel.",
            labels=["Hostname"],
        )
        flag.add_metric([self.hostname], 1.0 if running else 0.0)
        yield flag
        info = gauge(
            "gpumagic_cell_info",
            "The cell running now: its execution count and first line.",
            labels=["Hostname", "execution_count", "source"],
        )
        if running:
            cell = running[-1]
            count = "" if cell.execution_count is None else str(cell.execution_count)
            info.add_metric([self.hostname, count, cell.source[:_SOURCE_CHARS]], 1.0)
        yield info
