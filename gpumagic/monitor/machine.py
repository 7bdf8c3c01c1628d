"""This machine's layout: what its two sources (its GPUs through NVML, the host through
psutil) fill, how their rows are named, and the cells frame of their peaks.

The columns are ``metrics.METRICS`` (nvidia-smi's names in the CSV, one row per device per
sample); a row is named by its ``device`` (``cuda:0``, ``host``), its NVML ``index``, its
``cuda_index`` and its ``name``. A cell's row holds the peaks the sources folded into it
while it ran (utilisation of the GPUs this process used, memory, host CPU and RAM), the
clock-event reasons that held those GPUs and for what share of the cell, its energy and,
with a price per hour, its cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpumagic.monitor import metrics as M
from gpumagic.monitor.alerts import cell_note
from gpumagic.monitor.frames import local_times
from gpumagic.monitor.snapshot import Label, Layout

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.monitor.cells import CellRecord
    from gpumagic.monitor.snapshot import Snapshot

_GPU_CELL_COLUMNS = ("peak_utilization", "mean_utilization", "peak_memory", "peak_process_memory")
# Which GPUs a cell's utilisation is of: this process's (another user's busy GPU says
# nothing about this kernel's cells), or, where this process uses none, the busiest GPU's.
_UTILIZATION_OF = "utilization_of"
# {"cuda:0": {"sw_power_cap": 0.72}}: the share of the cell's samples in which each clock-event
# reason held a GPU (cells.MARKED_REASONS; {} for none, None where NVML read none).
_CLOCK_EVENTS = "clock_events"


def utilization_of(cell: CellRecord) -> str:
    """``cuda:0`` (the GPUs this process used during the cell) or ``busiest GPU``."""
    return ", ".join(cell.utilization_devices) or "busiest GPU"


def cells_frame(snap: Snapshot) -> pd.DataFrame:
    """One row per cell that ran while watching, with its peaks, energy and cost."""
    import pandas as pd

    rows = [
        {
            "execution_count": cell.execution_count,
            "source": cell.source,
            "start": cell.start,
            "duration_us": cell.duration(snap.now) * 1e6,
            "peak_utilization": cell.peak_utilization,
            "mean_utilization": cell.mean_utilization,
            _UTILIZATION_OF: utilization_of(cell),
            _CLOCK_EVENTS: cell.clock_event_shares(),
            "peak_memory": cell.peak_memory,
            "peak_process_memory": cell.peak_process_memory,
            "peak_host_cpu": cell.peak_host_cpu,
            "peak_host_memory": cell.peak_host_memory,
            "samples": cell.samples,
            "success": cell.success,
            "note": cell_note(cell),
        }
        for cell in snap.cells
    ]
    columns = [
        "execution_count",
        "source",
        "start",
        "duration_us",
        *_GPU_CELL_COLUMNS,
        _UTILIZATION_OF,
        _CLOCK_EVENTS,
        "peak_host_cpu",
        "peak_host_memory",
        "samples",
        "success",
        "note",
    ]
    frame = pd.DataFrame(rows, columns=columns)
    frame["execution_count"] = frame["execution_count"].astype("Int64")
    frame["start"] = local_times(frame["start"].to_numpy(dtype=float))
    if not snap.has_gpus:
        frame = frame.drop(columns=[*_GPU_CELL_COLUMNS, _UTILIZATION_OF, _CLOCK_EVENTS])
    # Issue 12: energy_wh per cell on the GPU path, cost_usd when a price was given.
    if snap.has_gpus:
        frame["energy_wh"] = np.array([c.energy_mj / 3.6e6 for c in snap.cells], dtype=float)
    cost = snap.cost
    if cost is not None and cost.price is not None:
        frame["cost_usd"] = cost.usd(frame["duration_us"].to_numpy(dtype=float) / 1e6)
    return frame


MACHINE = Layout(
    view="machine",
    metrics=M.METRICS,
    labels=(
        Label("device", "device", lambda d: d.key),
        Label("index", "index", lambda d: d.nvml_index, integer=True),
        Label("cuda_index", "cuda.index", lambda d: d.cuda_index, integer=True),
        Label("name", "name", lambda d: d.name),
    ),
    time_column="timestamp",
    per_value=False,
    # NVML refreshes utilisation up to 6 times a second (nvmlDeviceGetUtilizationRates)
    interval_s=1.0,
    price_per_gpu=False,
    cells=cells_frame,
)
