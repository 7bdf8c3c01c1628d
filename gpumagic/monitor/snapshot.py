"""The data of a watch: a :class:`Layout` (what its sources' rows and columns are) and a
:class:`Snapshot` (a consistent copy of its state, the one thing results and renderers read).

A watch of this machine and a watch of a job through Prometheus differ in their layout, not
in their code: the metric table their rows fill (nvidia-smi's columns, or DCGM's fields),
the labels a row is known by (``device``, ``cuda_index``; or ``Hostname``, ``gpu``), the
CSV's shape, the default interval, what ``--price`` is per, and the frames and view the
result offers. Each source names its layout; the watcher's sources share one.

A module of its own so that results (``result.py``) and the renderers can name it without
importing the sampler, which builds results: no import circle inside the core (issue 8).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gpumagic.device_kinds import CUDA, HOST
from gpumagic.monitor.alerts import Alert
from gpumagic.monitor.cells import CellRecord
from gpumagic.monitor.cost import CostState
from gpumagic.monitor.devices import WatchedDevice
from gpumagic.monitor.metrics import Metric
from gpumagic.monitor.processes import ProcessTable

if TYPE_CHECKING:
    import pandas as pd

Frame = Callable[["Snapshot"], "pd.DataFrame"]


@dataclass(frozen=True)
class Label:
    """One label of a row, as the frames and the CSV name it."""

    column: str  # in the frames
    csv: str  # in the CSV
    read: Callable[[WatchedDevice], str | int | None]  # its value for a device (None: blank)
    integer: bool = False  # an integer column (pandas' nullable Int64)


@dataclass(frozen=True)
class Layout:
    """What a source's samples are, for everything that reads them."""

    view: str  # the presentation that draws it (gpumagic.render.watch_views)
    metrics: tuple[Metric, ...]  # the columns of every row, in the ring's order
    labels: tuple[Label, ...]  # how a row is named in the frames and the CSV
    time_column: str  # the CSV's time column
    per_value: bool  # the CSV holds one row per value (a series) rather than per row per sample
    interval_s: float  # the default seconds between samples
    price_per_gpu: bool  # --price is dollars per GPU-hour (times the GPUs), not per hour
    cells: Frame  # the result's .cells
    frames: Mapping[str, Frame] = field(default_factory=dict)  # what else it offers (.gpus, ...)

    def index(self, key: str) -> int:
        """The column of metric ``key``."""
        for i, metric in enumerate(self.metrics):
            if metric.key == key:
                return i
        raise KeyError(f"{key!r}: the columns are {[m.key for m in self.metrics]}")


@dataclass
class Snapshot:
    """A consistent copy of a watcher's state: what renderers and results read."""

    layout: Layout
    devices: tuple[WatchedDevice, ...]
    times: np.ndarray  # (samples,) time.time() seconds, oldest first, within the window
    values: np.ndarray  # (samples, devices, len(layout.metrics)) float64, NaN = missing
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
    origin: str = ""  # where the samples come from, beyond this machine ("Prometheus URL")
    # Issue 12: cost and idle totals (every snapshot), and the GPUs' compute processes (read
    # only for a status or a result: None in live frames).
    cost: CostState | None = None
    processes: ProcessTable | None = None

    @property
    def gpu_rows(self) -> list[int]:
        return [i for i, d in enumerate(self.devices) if d.kind == CUDA]

    @property
    def host_row(self) -> int | None:
        return next((i for i, d in enumerate(self.devices) if d.kind == HOST), None)

    @property
    def has_gpus(self) -> bool:
        return any(d.kind == CUDA for d in self.devices)

    @property
    def hosts(self) -> list[str]:
        """The nodes of a job's GPUs, in the order their GPUs were first seen."""
        return list(dict.fromkeys(d.host for d in self.devices if d.host is not None))

    def column(self, key: str) -> np.ndarray:
        """(samples, devices) of one metric."""
        return self.values[:, :, self.layout.index(key)]

    def has(self, key: str) -> bool:
        """Whether any sample has a value of metric ``key``."""
        return bool(len(self.times)) and not np.isnan(self.column(key)).all()

    def latest(self) -> np.ndarray:
        """(devices, metrics) of the latest sample (NaN: no value then). Not the last value
        ever seen: a device that stopped reporting shows nothing, rather than an old number."""
        if not len(self.times):
            return np.full(self.values.shape[1:], np.nan)
        return self.values[-1].copy()
