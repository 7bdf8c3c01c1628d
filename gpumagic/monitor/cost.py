"""What the watched time cost: dollars at a price per hour, energy per cell, and idle time.

The meter is the watcher's; the sources tell it, sample by sample, what they know
(:class:`Metered`: whether their GPUs sat idle, whether this kernel holds memory on them,
what their energy counters moved), so the same arithmetic serves this machine and a job.

A cloud GPU is billed by the hour whether it computes or not, so the one number worth
knowing is how much of the bill went to GPUs doing nothing. Definitions, named here so the
summary, the alert and the docs agree:

- **idle** (GPU path): every watched GPU's ``utilization.gpu`` is below ``IDLE_UTIL_PCT``
  at a sample; the interval up to that sample counts as idle. NVML's utilisation is the
  share of its last sampling period in which any kernel ran, so one sample per interval
  describes the interval. A sample with a GPU's utilisation missing counts as unknown.
- **idle** (host path, no NVIDIA GPU): no cell was running; the machine is waiting on the
  user. Time covered by cells is busy, whatever the CPU did.
- **cost**: ``price`` dollars per hour times wall time, for the whole watch and per cell;
  for a job (``Layout.price_per_gpu``), dollars per GPU-hour times the GPUs watched. The
  metered time runs from the start of the watch to its stop.
- **energy**: what the sources' counters moved (NVML's total-energy counter,
  ``nvmlDeviceGetTotalEnergyConsumption``, or DCGM's, mJ since the driver loaded), of every
  watched GPU, whoever used it. Each interval's
  energy is spread over the cells that ran in it in proportion to their time in it (the
  power is taken as constant within one interval), so a cell shorter than the interval
  still gets its share, and the number survives the ring buffer dropping old samples.
- **idle alert**: every watched GPU idle for ``idle_alert`` seconds while this kernel holds
  GPU memory (on the host path: while no cell runs): the instance is paid for and unused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpumagic.device_kinds import CUDA
from gpumagic.monitor.alerts import Alert
from gpumagic.monitor.cells import CellMarks
from gpumagic.monitor.devices import WatchedDevice
from gpumagic.units import fmt_us

IDLE_UTIL_PCT = 5.0
IDLE_KIND = "idle"
IDLE_DEVICE = "instance"  # Alert.device of the idle alert: it is about the whole machine

GPU_IDLE_MEANING = f"every watched GPU below {IDLE_UTIL_PCT:g}% utilisation"
HOST_IDLE_MEANING = "no cell running (no GPU to read: idle means waiting on you)"


def gpus_idle(util: np.ndarray) -> bool | None:
    """Whether GPUs with these utilisations (%) sit idle: every one below ``IDLE_UTIL_PCT``.
    A busy GPU makes the sample busy even if another one's value is missing; otherwise a
    missing value makes it unknown (None)."""
    if np.isnan(util).any():
        finite = util[~np.isnan(util)]
        return False if len(finite) and finite.max() >= IDLE_UTIL_PCT else None
    return bool(util.max() < IDLE_UTIL_PCT) if len(util) else None


@dataclass(frozen=True)
class Metered:
    """What one source's sample tells the meter (the defaults: it tells nothing)."""

    idle: bool | None = None  # its GPUs all idle (None: it cannot tell, or has no GPU)
    holds_memory: bool = False  # this kernel holds memory on its GPUs
    energy_mj: np.ndarray | None = None  # per row, mJ moved since its last sample; None: no counter


def combine(
    parts: Sequence[tuple[int, bool, Metered]],
) -> tuple[bool | None, bool, np.ndarray | None]:
    """(idle, holds memory, energy per row) of a sample from its sources' ``(rows, whether
    they are GPUs, Metered)``: busy if any source's GPUs were busy, idle if all were idle
    (sources without a GPU have no say); energy NaN where unknown."""
    states = [m.idle for _, gpus, m in parts if gpus]
    idle = False if False in states else (True if states and all(states) else None)
    holds = any(m.holds_memory for _, _, m in parts)
    if all(m.energy_mj is None for _, _, m in parts):
        return idle, holds, None
    energy = np.concatenate(
        [m.energy_mj if m.energy_mj is not None else np.full(n, np.nan) for n, _, m in parts]
    )
    return idle, holds, energy


@dataclass(frozen=True)
class CostState:
    """A copy of the meter for a snapshot: what the summary and the status read."""

    price: float | None  # $/h, or $/GPU-hour where per_gpu
    metered_s: float  # wall seconds from the start of the watch to its last sample (or stop)
    idle_s: float
    unknown_s: float  # intervals whose idleness could not be told (utilisation missing)
    idle_meaning: str
    energy_mj: float  # all watched GPUs since the start; NaN when not available
    idle_alert_s: float | None
    idle_since: float | None  # start of the current idle stretch (as the alert counts it)
    per_gpu: bool = False  # the price is per GPU-hour (a job's), times ``units`` GPUs
    units: int = 1
    device_energy_mj: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per row

    def usd(self, seconds: Any) -> Any:
        """What ``seconds`` of the watched instance (or GPUs) cost (NaN without a price)."""
        return math.nan if self.price is None else self.price * self.units * seconds / 3600.0

    @property
    def total_usd(self) -> float:
        return self.usd(self.metered_s)

    @property
    def idle_usd(self) -> float:
        return self.usd(self.idle_s)

    @property
    def idle_share(self) -> float:
        """Share of the metered time (and so of the bill) spent idle, 0-1 (NaN: nothing yet)."""
        known = self.metered_s
        return self.idle_s / known if known > 0 else math.nan

    @property
    def energy_wh(self) -> float:
        return self.energy_mj / 3.6e6


class CostMeter:
    """Folds every sample into the cost, idle and energy totals and the idle alert.

    Runs on the sampler thread, after the cell marks have taken the sample; state copied out
    with :meth:`state`. ``on_idle`` is called once per idle stretch, when the alert fires.
    ``start(t)`` and ``close(t)`` bound the metered time: the watch's start and its stop.
    """

    def __init__(
        self,
        devices: Sequence[WatchedDevice],
        price: float | None,
        idle_alert_s: float | None,
        on_idle: Callable[[Alert], object] | None = None,
        per_gpu: bool = False,
    ) -> None:
        self.price = price
        self.idle_alert_s = idle_alert_s
        self.on_idle = on_idle
        self.per_gpu = per_gpu
        self.devices = tuple(devices)
        self.has_gpus = any(d.kind == CUDA for d in devices)
        self._prev_t: float | None = None
        self._last_idle: bool | None = None  # the last sample's state, for the stretch to the stop
        self.energy_mj = math.nan
        self.device_energy_mj = np.full(len(devices), np.nan)
        self.metered_s = 0.0
        self.idle_s = 0.0
        self.unknown_s = 0.0
        self.idle_since: float | None = None
        self.alert: Alert | None = None  # active now
        # (alert, until): the last stretch that alerted and ended, for the status of the
        # cell that ended it (on the host path, running `%gpuwatch status` ends the idleness).
        self.ended: tuple[Alert, float] | None = None
        self.callback_error: str | None = None
        self._start = math.nan  # when metering began

    def widen(self, devices: Sequence[WatchedDevice], positions: Sequence[int]) -> None:
        """A source found more devices: per-device totals follow their rows."""
        totals = np.full(len(devices), np.nan)
        totals[list(positions)] = self.device_energy_mj
        self.devices, self.device_energy_mj = tuple(devices), totals

    # -- per sample ----------------------------------------------------------------------
    def start(self, t: float) -> None:
        """The watch starts: the first interval runs from here to the first sample."""
        self._prev_t = self._start = t

    def sample(
        self,
        t: float,
        marks: CellMarks,
        idle: bool | None,
        holds_memory: bool,
        energy_mj: np.ndarray | None,
    ) -> None:
        """One sample: ``idle`` (the GPUs' state, None: unknown), whether this kernel holds
        GPU memory, and the mJ each row's counter moved since the previous sample."""
        prev_t = self._prev_t
        if prev_t is not None and t > prev_t:
            self._meter(prev_t, t, idle, marks)
            if energy_mj is not None and not np.isnan(energy_mj).all():
                moved = float(np.nansum(energy_mj))
                self.energy_mj = (0.0 if math.isnan(self.energy_mj) else self.energy_mj) + moved
                n = min(len(energy_mj), len(self.device_energy_mj))
                known = ~np.isnan(energy_mj[:n])
                totals = self.device_energy_mj[:n]  # a view: written in place
                totals[known] = np.fmax(totals[known], 0.0) + energy_mj[:n][known]  # NaN: 0
                marks.add_energy(prev_t, t, moved)
        if prev_t is None:
            self._start = t  # the host path's idleness counts from the first sample
        self._prev_t = t
        self._last_idle = idle
        self._update_idle_alert(t, prev_t, idle is True and holds_memory, marks)

    def close(self, t: float, marks: CellMarks) -> None:
        """The watch stops at ``t``: the time since the last sample is metered as it stood."""
        if self._prev_t is not None and t > self._prev_t:
            self._meter(self._prev_t, t, self._last_idle, marks)
            self._prev_t = t

    def _meter(self, t0: float, t1: float, idle: bool | None, marks: CellMarks) -> None:
        dt = t1 - t0
        self.metered_s += dt
        if self.has_gpus:
            if idle is None:
                self.unknown_s += dt
            elif idle:
                self.idle_s += dt
        else:
            self.idle_s += max(0.0, dt - marks.busy_seconds(t0, t1))

    def _update_idle_alert(
        self, t: float, prev_t: float | None, gpus_wasted: bool, marks: CellMarks
    ) -> None:
        running = marks.running()
        if self.has_gpus:
            idle = gpus_wasted
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
            idle_alert_s=self.idle_alert_s,
            idle_since=self.idle_since,
            per_gpu=self.per_gpu,
            units=sum(d.kind == CUDA for d in self.devices) if self.per_gpu else 1,
            device_energy_mj=self.device_energy_mj.copy(),
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
