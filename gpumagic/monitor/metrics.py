"""What this machine's sources sample (its GPUs through NVML, its host): one table of
metrics shared by the ring buffer, the CSV log, the DataFrame and the charts, so a column
means the same thing everywhere. (A ``Metric`` is any layout's column: a job's are DCGM's
fields, ``gpumagic.monitor.job.dcgm``.)

Values are kept as float64 (NaN = missing) in internal units: bytes for memory, percent
for utilisation, °C, watts, MHz, and the raw NVML bit mask for throttle reasons. The CSV
uses nvidia-smi's ``--query-gpu`` names and its ``nounits`` convention (units in the
header, bare numbers in the cells, memory in MiB) so existing scripts that read
``nvidia-smi --format=csv`` logs read ours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpumagic.clock_events import name_reasons
from gpumagic.device_kinds import CUDA, HOST, DeviceKind

MIB = 1024 * 1024


@dataclass(frozen=True)
class Metric:
    key: str  # DataFrame column
    csv: str  # CSV column (nvidia-smi's query name where one exists)
    unit: str  # "%", "B", "°C", "W", "MHz", "mask"
    scope: DeviceKind  # CUDA (one value per GPU) or HOST (one value per machine/process)
    csv_scale: float = 1.0  # multiply the internal value by this for the CSV
    csv_digits: int = 0


METRICS: tuple[Metric, ...] = (
    Metric("utilization_gpu", "utilization.gpu [%]", "%", CUDA),
    Metric("utilization_memory", "utilization.memory [%]", "%", CUDA),
    Metric("memory_used", "memory.used [MiB]", "B", CUDA, 1 / MIB),
    Metric("memory_total", "memory.total [MiB]", "B", CUDA, 1 / MIB),
    # nvidia-smi --query-compute-apps calls it used_gpu_memory; "process." = this kernel.
    Metric("process_memory_used", "process.used_gpu_memory [MiB]", "B", CUDA, 1 / MIB),
    Metric("temperature", "temperature.gpu", "°C", CUDA),
    Metric("power_draw", "power.draw [W]", "W", CUDA, 1.0, 2),
    Metric("power_limit", "power.limit [W]", "W", CUDA, 1.0, 2),
    Metric("clock_sm", "clocks.sm [MHz]", "MHz", CUDA),
    Metric("clock_mem", "clocks.mem [MHz]", "MHz", CUDA),
    Metric("throttle_reasons", "clocks_throttle_reasons.active", "mask", CUDA),
    Metric("host_cpu", "host.cpu [%]", "%", HOST, 1.0, 1),
    Metric("host_memory_used", "host.memory.used [MiB]", "B", HOST, 1 / MIB),
    Metric("host_memory_total", "host.memory.total [MiB]", "B", HOST, 1 / MIB),
    # Share of the whole machine's CPU time (same 0-100 scale as host.cpu), not top's per-core %.
    Metric("process_cpu", "process.cpu [%]", "%", HOST, 1.0, 1),
    Metric("process_rss", "process.memory.rss [MiB]", "B", HOST, 1 / MIB),
)

INDEX: dict[str, int] = {m.key: i for i, m in enumerate(METRICS)}
N_METRICS = len(METRICS)
GPU_METRICS = tuple(m for m in METRICS if m.scope == CUDA)
HOST_METRICS = tuple(m for m in METRICS if m.scope == HOST)

UTIL_GPU = INDEX["utilization_gpu"]
UTIL_MEM = INDEX["utilization_memory"]
MEM_USED = INDEX["memory_used"]
MEM_TOTAL = INDEX["memory_total"]
PROC_MEM = INDEX["process_memory_used"]
TEMPERATURE = INDEX["temperature"]
POWER_DRAW = INDEX["power_draw"]
POWER_LIMIT = INDEX["power_limit"]
CLOCK_SM = INDEX["clock_sm"]
CLOCK_MEM = INDEX["clock_mem"]
THROTTLE = INDEX["throttle_reasons"]
HOST_CPU = INDEX["host_cpu"]
HOST_MEM_USED = INDEX["host_memory_used"]
HOST_MEM_TOTAL = INDEX["host_memory_total"]
PROC_CPU = INDEX["process_cpu"]
PROC_RSS = INDEX["process_rss"]


def throttle_names(mask: float | int | None) -> list[str]:
    """Decode a throttle-reason bit mask into nvidia-smi's names (``gpumagic.clock_events``,
    the one table of them that ``%gpucheck`` reads too); [] for none or missing."""
    if mask is None or (isinstance(mask, float) and math.isnan(mask)):
        return []
    return list(name_reasons(int(mask)).names)


def csv_value(metric: Metric, value: float) -> str:
    """One CSV cell: empty for missing (pandas reads NaN), hex for the throttle mask like nvidia-smi."""
    if math.isnan(value):
        return ""
    if metric.unit == "mask":
        return f"0x{int(value):016x}"
    scaled = value * metric.csv_scale
    if metric.csv_digits == 0:
        return str(round(scaled))
    return f"{scaled:.{metric.csv_digits}f}"
