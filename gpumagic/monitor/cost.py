"""What the watched time cost: dollars at a price per hour, energy per cell, and idle time.

A cloud GPU is billed by the hour whether it computes or not, so the one number worth
knowing is how much of the bill went to GPUs doing nothing. Definitions, named here so the
summary, the alert and the docs agree:

- **idle** (GPU path): every watched GPU's ``utilization.gpu`` is below ``IDLE_UTIL_PCT``
  at a sample; the interval up to that sample counts as idle. NVML's utilisation is the
  share of its last sampling period in which any kernel ran, so one sample per interval
  describes the interval. A sample with a GPU's utilisation missing counts as unknown.
- **idle** (host path, no NVIDIA GPU): no cell was running; the machine is waiting on the
  user. Time covered by cells is busy, whatever the CPU did.
- **cost**: ``price`` dollars per hour times wall time, for the whole watch and per cell.
- **energy**: NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ since
  the driver loaded; Volta and later) of every watched GPU, whoever used it. Each interval's
  energy is spread over the cells that ran in it in proportion to their time in it (the
  power is taken as constant within one interval), so a cell shorter than the interval
  still gets its share, and the number survives the ring buffer dropping old samples.
- **idle alert**: every watched GPU idle for ``idle_alert`` seconds while this kernel holds
  GPU memory (on the host path: while no cell runs): the instance is paid for and unused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpumagic.device_kinds import CUDA
from gpumagic.monitor import metrics as M
from gpumagic.monitor.alerts import Alert
from gpumagic.monitor.cells import CellMarks
from gpumagic.monitor.devices import WatchedDevice
from gpumagic.units import fmt_us

IDLE_UTIL_PCT = 5.0
IDLE_KIND = "idle"
IDLE_DEVICE = "instance"  # Alert.device of the idle alert: it is about the whole machine

GPU_IDLE_MEANING = f"every watched GPU below {IDLE_UTIL_PCT:g}% utilisation"
HOST_IDLE_MEANING = "no cell running (no GPU to read: idle means waiting on you)"

_NOT_SUPPORTED = 3
_FUNCTION_NOT_FOUND = 13
_NO_PERMISSION = 4

@dataclass(frozen=True)
class CostState:
    """A copy of the meter for a snapshot: what the summary and the status read."""

    price: float | None  # $/h
    metered_s: float  # wall seconds covered by samples (first sample to last)
    idle_s: float
    unknown_s: float  # intervals whose idleness could not be told (utilisation missing)
    idle_meaning: str
    energy_mj: float  # all watched GPUs since the first sample; NaN when not available
    energy_note: str | None  # why energy is not available
    idle_alert_s: float | None
    idle_since: float | None  # start of the current idle stretch (as the alert counts it)

    @property
    def total_usd(self) -> float:
        return math.nan if self.price is None else self.price * self.metered_s / 3600.0

    @property
    def idle_usd(self) -> float:
        return math.nan if self.price is None else self.price * self.idle_s / 3600.0

    @property
    def idle_share(self) -> float:
        """Share of the metered time (and so of the bill) spent idle, 0-1 (NaN: nothing yet)."""
        known = self.metered_s
        return self.idle_s / known if known > 0 else math.nan

    @property
    def energy_wh(self) -> float:
        return self.energy_mj / 3.6e6


class EnergyReader:
    """NVML's total-energy counters of the watched GPUs, summed; never raises."""

    def __init__(
        self, module: Any, gpus: Sequence[tuple[WatchedDevice, Any]], unavailable: str | None = None
    ) -> None:
        self._nv = module
        self._gpus = list(gpus)
        self.note: str | None = unavailable
        self.errors = 0
        fn = getattr(module, "nvmlDeviceGetTotalEnergyConsumption", None) if gpus else None
        self._fn = fn
        if gpus and fn is None and self.note is None:
            self.note = "energy per cell not available: this nvidia-ml-py has no nvmlDeviceGetTotalEnergyConsumption"

    def read(self) -> float:
        """mJ of every watched GPU together, or NaN (for good once a GPU has no counter)."""
        if self._fn is None or self.note is not None:
            return math.nan
        total = 0.0
        for device, handle in self._gpus:
            try:
                total += float(self._fn(handle))
            except Exception as exc:
                code = getattr(exc, "value", None)
                if code in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND, _NO_PERMISSION) or code is None:
                    self.note = (
                        f"energy per cell not available: {device.label} has no total-energy "
                        f"counter (NVML reports it on Volta and later GPUs; {exc or type(exc).__name__})"
                    )
                else:
                    self.errors += 1  # transient: this interval's energy is lost, not the rest
                return math.nan
        return total


class CostMeter:
    """Folds every sample into the cost, idle and energy totals and the idle alert.

    Runs on the sampler thread, after the cell marks have taken the sample; state copied out
    with :meth:`state`. ``on_idle`` is called once per idle stretch, when the alert fires.
    """

    def __init__(
        self,
        devices: Sequence[WatchedDevice],
        gpus: Sequence[tuple[WatchedDevice, Any]],
        module: Any,
        price: float | None,
        idle_alert_s: float | None,
        on_idle: Callable[[Alert], object] | None = None,
        energy_unavailable: str | None = None,
    ) -> None:
        self.price = price
        self.idle_alert_s = idle_alert_s
        self.on_idle = on_idle
        self.has_gpus = bool(gpus)
        self._gpu_rows = [i for i, d in enumerate(devices) if d.kind == CUDA]
        self._energy = EnergyReader(module, gpus, energy_unavailable)
        self._prev_t: float | None = None
        self._prev_energy = math.nan
        self.energy_mj = math.nan
        self.metered_s = 0.0
        self.idle_s = 0.0
        self.unknown_s = 0.0
        self.idle_since: float | None = None
        self.alert: Alert | None = None  # active now
        # (alert, until): the last stretch that alerted and ended, for the status of the
        # cell that ended it (on the host path, running `%gpuwatch status` ends the idleness).
        self.ended: tuple[Alert, float] | None = None
        self.callback_error: str | None = None
        self._start = math.nan  # the first sample's time

    @property
    def energy_note(self) -> str | None:
        return self._energy.note if self.has_gpus else None

    # -- per sample ----------------------------------------------------------------------
    def sample(self, t: float, block: np.ndarray, marks: CellMarks, cuda_in_use: bool) -> None:
        energy = self._energy.read() if self.has_gpus else math.nan
        prev_t = self._prev_t
        if prev_t is not None and t > prev_t:
            dt = t - prev_t
            self.metered_s += dt
            if self.has_gpus:
                state = self._gpu_idle(block)
                if state is None:
                    self.unknown_s += dt
                elif state:
                    self.idle_s += dt
            else:
                self.idle_s += max(0.0, dt - marks.busy_seconds(prev_t, t))
            d_energy = energy - self._prev_energy
            if math.isfinite(d_energy) and d_energy >= 0:  # < 0: the driver reloaded
                self.energy_mj = (0.0 if math.isnan(self.energy_mj) else self.energy_mj) + d_energy
                marks.add_energy(prev_t, t, d_energy)
        if prev_t is None:
            self._start = t  # the host path's idleness counts from the first sample
        self._prev_t = t
        self._prev_energy = energy
        self._update_idle_alert(t, prev_t, block, marks, cuda_in_use)

    def _gpu_idle(self, block: np.ndarray) -> bool | None:
        util = block[self._gpu_rows, M.UTIL_GPU]
        if np.isnan(util).any():
            # A busy GPU makes the interval busy even if another one's value is missing.
            finite = util[~np.isnan(util)]
            return False if len(finite) and finite.max() >= IDLE_UTIL_PCT else None
        return bool(util.max() < IDLE_UTIL_PCT)

    def _holds_gpu_memory(self, block: np.ndarray, cuda_in_use: bool) -> bool:
        proc = block[self._gpu_rows, M.PROC_MEM]
        if np.isnan(proc).all():
            # NVML could not tell (a container's PID namespace): torch having CUDA up is the
            # best evidence left that this kernel holds memory.
            return cuda_in_use
        return bool(np.nansum(proc) > 0)

    def _update_idle_alert(
        self,
        t: float,
        prev_t: float | None,
        block: np.ndarray,
        marks: CellMarks,
        cuda_in_use: bool,
    ) -> None:
        running = marks.running()
        if self.has_gpus:
            idle = self._gpu_idle(block) is True and self._holds_gpu_memory(block, cuda_in_use)
            if idle and self.idle_since is None:
                # The interval up to this sample was idle; its start is the first idle moment.
                self.idle_since = prev_t if prev_t is not None else t
        else:
            idle = running is None
            if idle:
                last = marks.last_end()
                self.idle_since = max(self._start, last) if last is not None else self._start
        if idle and self.alert is not None and self.alert.since != self.idle_since:
            # A cell ran and ended between two samples: that stretch is over, a new one began.
            self.ended = (self.alert, self.idle_since if self.idle_since is not None else t)
            self.alert = None
        if not idle:
            if self.alert is not None:
                until = running.start if (running is not None and not self.has_gpus) else t
                self.ended = (self.alert, until)
            self.alert = None
            self.idle_since = None
            return
        if self.idle_alert_s is None or self.idle_since is None:
            return
        if t - self.idle_since < self.idle_alert_s:
            return
        if self.alert is None:
            self.alert = Alert(IDLE_KIND, IDLE_DEVICE, self.idle_message(), self.idle_since)
            if self.on_idle is not None:
                try:
                    self.on_idle(self.alert)
                except Exception as exc:  # the user's callback must not stop the sampling
                    self.callback_error = f"on_idle failed: {type(exc).__name__}: {exc}"

    def idle_message(self) -> str:
        assert self.idle_alert_s is not None
        what = "every watched GPU idle" if self.has_gpus else "no cell has run"
        while_ = " while this kernel holds GPU memory" if self.has_gpus else ""
        cost = (
            f"the instance is idle and costing ${self.price:,.2f}/h"
            if self.price is not None
            else "the instance is idle (give --price to see what it costs)"
        )
        return f"{what} for {fmt_us(self.idle_alert_s * 1e6)} or more{while_}: {cost}"

    def state(self) -> CostState:
        return CostState(
            price=self.price,
            metered_s=self.metered_s,
            idle_s=self.idle_s,
            unknown_s=self.unknown_s,
            idle_meaning=GPU_IDLE_MEANING if self.has_gpus else HOST_IDLE_MEANING,
            energy_mj=self.energy_mj,
            energy_note=self.energy_note,
            idle_alert_s=self.idle_alert_s,
            idle_since=self.idle_since,
        )

    def status_alert(self, running_start: float | None) -> Alert | None:
        """The idle alert for a status: the active one, or the stretch that the running cell
        ended (on the host path, asking for the status is itself a cell)."""
        if self.alert is not None:
            return self.alert
        if self.ended is None or running_start is None:
            return None
        alert, until = self.ended
        if abs(until - running_start) > 1e-6:
            return None
        lasted = fmt_us(max(0.0, until - alert.since) * 1e6)
        return Alert(
            alert.kind,
            alert.device,
            f"idle for {lasted} until this cell started: " + alert.message.split(": ", 1)[-1],
            alert.since,
        )
