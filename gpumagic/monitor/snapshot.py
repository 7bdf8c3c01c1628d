"""``Snapshot``: a consistent copy of a watcher's state, the one thing renderers and results read.

A module of its own so that results (``result.py``) and the renderers can name it without
importing the sampler, which builds results: no import circle inside the core (issue 8).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpumagic.device_kinds import CUDA
from gpumagic.monitor.alerts import Alert
from gpumagic.monitor.cells import CellRecord
from gpumagic.monitor.cost import CostState
from gpumagic.monitor.devices import WatchedDevice
from gpumagic.monitor.processes import ProcessTable


@dataclass
class Snapshot:
    """A consistent copy of a watcher's state: what renderers and results read."""

    devices: tuple[WatchedDevice, ...]
    times: np.ndarray  # (samples,) time.time() seconds, oldest first, within the window
    values: np.ndarray  # (samples, devices, metrics) float64, NaN = missing
    cells: list[CellRecord]
    alerts: list[Alert]  # active at the latest sample
    alerts_seen: list[tuple[Alert, float, int]]  # (first occurrence, last time, samples)
    reason: str | None  # why there is no GPU panel (None when GPUs are watched)
    notes: list[str]
    interval: float
    window: float
    started: float
    now: float
    running: bool
    log_path: str | None
    samples_taken: int
    sample_cpu_s: float  # CPU seconds the samples cost, all together
    seq: int  # samples ever pushed: changes exactly when there is something new to draw
    # Issue 12: cost and idle totals (every snapshot), and the GPUs' compute processes (read
    # only for a status or a result: None in live frames).
    cost: CostState | None = None
    processes: ProcessTable | None = None

    @property
    def gpu_rows(self) -> list[int]:
        return [i for i, d in enumerate(self.devices) if d.kind == CUDA]

    @property
    def host_row(self) -> int:
        return len(self.devices) - 1
