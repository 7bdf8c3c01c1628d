"""Alerts shown in the watcher's header: pure functions over the latest samples.

Thresholds are rules of thumb, named here so the header, the tests and the docs agree:

- low utilisation while a cell runs: a training loop that keeps the GPU busy less than
  ``LOW_UTIL_PCT`` of the time over ``LOW_UTIL_SPAN_S`` is usually waiting on input (data
  loading, host-side preprocessing, host-device copies), which ``%%gpuprofile`` can show.
  Only for GPUs this process holds memory on (or when that is unknown), so a pandas cell
  on a machine with an idle GPU raises nothing.
- memory above ``MEMORY_PCT`` of the board: the next allocation spike is likely an OOM.
- thermal or power throttling: NVML's clock event reasons say the clocks are being held
  down, so step times will be slower than the GPU's rating. ``sw_power_cap`` alone is not
  one: an H100/H200 at full load runs at its power limit for most of a healthy training
  run (the driver trims clocks to stay within it), so only the hardware power brake,
  thermal and hardware slowdowns raise an alert; the status still lists the bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpumagic.clock_events import POWER, REASONS, THERMAL, name_reasons
from gpumagic.device_kinds import HOST
from gpumagic.monitor import metrics as M
from gpumagic.monitor.cells import CellRecord
from gpumagic.monitor.devices import WatchedDevice
from gpumagic.units import fmt_percent

LOW_UTIL_PCT = 30.0
LOW_UTIL_SPAN_S = 10.0
LOW_UTIL_MIN_RUN_S = 5.0
LOW_UTIL_MIN_SAMPLES = 3
MEMORY_PCT = 90.0
# The clock-event reasons that raise an alert: those that hold a card below what it can do
# (gpumagic.clock_events), except the power cap (normal at full load, above) and applications
# clocks (a setting someone chose, not a fault); an unknown bit raises none.
_NOT_FAULTS = {"sw_power_cap", "applications_clocks_setting"}
ALERTED = frozenset(r.name for r in REASONS if r.slows) - _NOT_FAULTS


@dataclass(frozen=True)
class Alert:
    kind: str  # "low_utilization", "memory", "host_memory", "thermal", "power", "slowdown"
    device: str  # WatchedDevice.key: "cuda:0", "host"
    message: str
    since: float = math.nan  # time.time() of the sample that raised it

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.device)


def _cell_name(cell: CellRecord) -> str:
    return (
        f"cell [{cell.execution_count}]" if cell.execution_count is not None else "the running cell"
    )


def compute_alerts(
    devices: Sequence[WatchedDevice],
    times: np.ndarray,
    values: np.ndarray,
    running: CellRecord | None,
    cuda_in_use: bool = False,
) -> list[Alert]:
    """Alerts for the latest sample in ``values`` (``(samples, devices, metrics)``, oldest first)."""
    if len(times) == 0:
        return []
    now = float(times[-1])
    latest = values[-1]
    out: list[Alert] = []
    for row, device in enumerate(devices):
        v = latest[row]
        if device.kind == HOST:
            used, total = v[M.HOST_MEM_USED], v[M.HOST_MEM_TOTAL]
            if total > 0 and 100.0 * used / total > MEMORY_PCT:
                out.append(
                    Alert(
                        "host_memory",
                        device.key,
                        f"host RAM {fmt_percent(100.0 * used / total)} used",
                        now,
                    )
                )
            continue
        used, total = v[M.MEM_USED], v[M.MEM_TOTAL]
        if total > 0 and 100.0 * used / total > MEMORY_PCT:
            out.append(
                Alert(
                    "memory",
                    device.key,
                    f"{device.label} memory {fmt_percent(100.0 * used / total)} used: "
                    "close to out of memory",
                    now,
                )
            )
        throttled = _throttle_alert(device, v[M.THROTTLE], now)
        if throttled is not None:
            out.append(throttled)
        low = _low_utilization(row, device, times, values, running, cuda_in_use)
        if low is not None:
            out.append(low)
    return out


def _throttle_alert(device: WatchedDevice, mask: float, now: float) -> Alert | None:
    if math.isnan(mask):
        return None
    active = [n for n in name_reasons(int(mask)).names if n in ALERTED]
    if not active:
        return None
    names = ", ".join(active)
    if THERMAL.intersection(active):
        return Alert("thermal", device.key, f"{device.label} thermal throttling ({names})", now)
    if POWER.intersection(active):
        return Alert("power", device.key, f"{device.label} power throttling ({names})", now)
    return Alert("slowdown", device.key, f"{device.label} clocks slowed ({names})", now)


def _low_utilization(
    row: int,
    device: WatchedDevice,
    times: np.ndarray,
    values: np.ndarray,
    running: CellRecord | None,
    cuda_in_use: bool,
) -> Alert | None:
    if running is None:
        return None
    now = float(times[-1])
    if now - running.start < LOW_UTIL_MIN_RUN_S:
        return None
    proc = values[-1, row, M.PROC_MEM]
    if not math.isnan(proc) and proc <= 0:
        return None  # this process has nothing on this GPU: it is not the GPU the cell uses
    if math.isnan(proc) and not cuda_in_use:
        return None
    recent = times >= max(running.start, now - LOW_UTIL_SPAN_S)
    util = values[recent, row, M.UTIL_GPU]
    util = util[~np.isnan(util)]
    if len(util) < LOW_UTIL_MIN_SAMPLES:
        return None
    mean = float(util.mean())
    if mean >= LOW_UTIL_PCT:
        return None
    return Alert(
        "low_utilization",
        device.key,
        f"{device.label} busy {fmt_percent(mean)} while {_cell_name(running)} runs: "
        "likely waiting on data or the host; try %%gpuprofile",
        now,
    )


def cell_note(cell: CellRecord) -> str:
    """A short verdict for one finished cell in the summary table ("" when nothing stands out)."""
    if (
        cell.holds_gpu_memory
        and cell.duration() >= LOW_UTIL_MIN_RUN_S
        and cell.n_utilization >= LOW_UTIL_MIN_SAMPLES
        and cell.mean_utilization < LOW_UTIL_PCT
    ):
        return f"GPU busy {fmt_percent(cell.mean_utilization)} on average: likely data-bound, try %%gpuprofile"
    return ""
