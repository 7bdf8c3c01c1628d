"""What a watcher hands back: ``WatchStatus`` (the values now) and ``WatchResult`` (the
window's samples and the cells that ran), as plain data plus a mime bundle.

DataFrame columns are in internal units, named once in ``UNITS``: bytes for memory,
percent, °C, W, MHz, microseconds for durations; ``time``/``start`` are timezone-aware
local timestamps. pandas is imported when a frame is first asked for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from gpumagic.device_kinds import CUDA
from gpumagic.monitor import metrics as M
from gpumagic.monitor.alerts import Alert, cell_note
from gpumagic.render.html import Rendered

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.monitor.cells import CellRecord
    from gpumagic.monitor.cost import CostState
    from gpumagic.monitor.devices import WatchedDevice
    from gpumagic.monitor.snapshot import Snapshot
    from gpumagic.render.sections import Report

UNITS: dict[str, str] = {m.key: m.unit for m in M.METRICS} | {
    "duration_us": "µs",
    "peak_utilization": "%",
    "mean_utilization": "%",
    "peak_memory": "B",
    "peak_process_memory": "B",
    "peak_host_cpu": "%",
    "peak_host_memory": "B",
    "energy_wh": "Wh",
    "cost_usd": "$",
    "gpu_memory": "B",
}

_GPU_CELL_COLUMNS = ("peak_utilization", "mean_utilization", "peak_memory", "peak_process_memory")
# Which GPUs a cell's utilisation is of: this process's (another user's busy GPU says
# nothing about this kernel's cells), or, where this process uses none, the busiest GPU's.
_UTILIZATION_OF = "utilization_of"


def utilization_of(cell: CellRecord, devices: Sequence[WatchedDevice]) -> str:
    """``cuda:0`` (the GPUs this process used during the cell) or ``busiest GPU``."""
    keys = [devices[r].key for r in cell.utilization_rows if r < len(devices)]
    return ", ".join(keys) if keys else "busiest GPU"


def _local_times(times: np.ndarray) -> pd.DatetimeIndex:
    import pandas as pd

    tz = datetime.now().astimezone().tzinfo
    return pd.DatetimeIndex(pd.to_datetime(times, unit="s", utc=True)).tz_convert(tz)


def device_values(snapshot: Snapshot, sample: int = -1) -> list[dict[str, Any]]:
    """One dict per device for one sample (the latest by default): ids, metrics, throttle names."""
    if len(snapshot.times) == 0:
        return []
    out = []
    for row, device in enumerate(snapshot.devices):
        v = snapshot.values[sample, row]
        entry: dict[str, Any] = {
            "device": device.key,
            "label": device.label,
            "name": device.name,
            "index": device.nvml_index,
            "cuda_index": device.cuda_index,
        }
        for metric in M.METRICS:
            if (metric.scope == CUDA) == (device.kind == CUDA):
                entry[metric.key] = float(v[M.INDEX[metric.key]])
        if device.kind == CUDA:
            entry["throttle"] = M.throttle_names(v[M.THROTTLE])
        out.append(entry)
    return out


class WatchStatus(Rendered):
    """The latest sample of every device, the alerts active now and why anything is missing."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.devices: list[dict[str, Any]] = device_values(snapshot)
        self.alerts: list[Alert] = snapshot.alerts
        self.reason = snapshot.reason
        self.notes = snapshot.notes
        self.time = snapshot.now
        self.running = snapshot.running
        self.cost: CostState | None = snapshot.cost

    @property
    def processes(self) -> pd.DataFrame:
        """Each watched GPU's compute processes now: pid, user, GPU memory (bytes), command
        line, ``this_kernel``; user and command are missing for host PIDs seen from a container."""
        return _process_frame(self.snapshot)

    def __getitem__(self, device: str) -> dict[str, Any]:
        """``status["cuda:0"]`` or ``status["host"]``."""
        for entry in self.devices:
            if entry["device"] == device:
                return entry
        raise KeyError(f"{device!r}: devices are {[e['device'] for e in self.devices]}")

    def _report(self) -> Report:
        from gpumagic.render.watch_status import status_report

        return status_report(self)


class WatchResult(Rendered):
    """A stopped (or snapshotted) watch: ``samples`` and ``cells`` frames, the log path,
    alerts seen, and a static summary chart as its mime bundle."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.devices = snapshot.devices
        self.log: str | None = snapshot.log_path
        self.reason = snapshot.reason
        self.notes = snapshot.notes
        self.interval = snapshot.interval
        self.window = snapshot.window
        self.alerts: list[tuple[Alert, float, int]] = snapshot.alerts_seen
        self.samples_taken = snapshot.samples_taken
        self._samples: pd.DataFrame | None = None
        self._cells: pd.DataFrame | None = None
        self.cost: CostState | None = snapshot.cost

    @property
    def processes(self) -> pd.DataFrame:
        """Each watched GPU's compute processes when the result was taken (at the stop)."""
        return _process_frame(self.snapshot)

    @property
    def has_gpus(self) -> bool:
        return any(d.kind == CUDA for d in self.devices)

    @property
    def sample_cpu_mean_s(self) -> float:
        """Mean CPU seconds one sample cost the sampler thread."""
        n = self.snapshot.samples_taken
        return self.snapshot.sample_cpu_s / n if n else math.nan

    @property
    def samples(self) -> pd.DataFrame:
        """Every sample in the window, one row per device per sample."""
        if self._samples is None:
            self._samples = self._build_samples()
        return self._samples

    @property
    def cells(self) -> pd.DataFrame:
        """One row per cell that ran while watching, with its peaks."""
        if self._cells is None:
            self._cells = self._build_cells()
        return self._cells

    def _build_samples(self) -> pd.DataFrame:
        import pandas as pd

        snap = self.snapshot
        n, d = len(snap.times), len(snap.devices)
        keep = [m for m in M.METRICS if self.has_gpus or m.scope != CUDA]
        flat = snap.values.reshape(n * d, M.N_METRICS)
        data: dict[str, Any] = {
            "time": _local_times(np.repeat(snap.times, d)),
            "device": np.tile(np.array([x.key for x in snap.devices], dtype=object), n),
            "index": pd.array(np.tile([x.nvml_index for x in snap.devices], n), dtype="Int64"),
            "cuda_index": pd.array(np.tile([x.cuda_index for x in snap.devices], n), dtype="Int64"),
            "name": np.tile(np.array([x.name for x in snap.devices], dtype=object), n),
        }
        for metric in keep:
            column = flat[:, M.INDEX[metric.key]]
            if metric.key == "throttle_reasons":
                data[metric.key] = pd.array(
                    [None if math.isnan(x) else int(x) for x in column], dtype="Int64"
                )
                data["throttle"] = [";".join(M.throttle_names(x)) for x in column]
            else:
                data[metric.key] = column
        return pd.DataFrame(data)

    def _build_cells(self) -> pd.DataFrame:
        import pandas as pd

        rows = []
        for cell in self.snapshot.cells:
            rows.append(
                {
                    "execution_count": cell.execution_count,
                    "source": cell.source,
                    "start": cell.start,
                    "duration_us": cell.duration(self.snapshot.now) * 1e6,
                    "peak_utilization": cell.peak_utilization,
                    "mean_utilization": cell.mean_utilization,
                    _UTILIZATION_OF: utilization_of(cell, self.snapshot.devices),
                    "peak_memory": cell.peak_memory,
                    "peak_process_memory": cell.peak_process_memory,
                    "peak_host_cpu": cell.peak_host_cpu,
                    "peak_host_memory": cell.peak_host_memory,
                    "samples": cell.samples,
                    "success": cell.success,
                    "note": cell_note(cell),
                }
            )
        columns = [
            "execution_count",
            "source",
            "start",
            "duration_us",
            *_GPU_CELL_COLUMNS,
            _UTILIZATION_OF,
            "peak_host_cpu",
            "peak_host_memory",
            "samples",
            "success",
            "note",
        ]
        frame = pd.DataFrame(rows, columns=columns)
        frame["execution_count"] = frame["execution_count"].astype("Int64")
        frame["start"] = _local_times(frame["start"].to_numpy(dtype=float))
        if not self.has_gpus:
            frame = frame.drop(columns=[*_GPU_CELL_COLUMNS, _UTILIZATION_OF])
        return _add_cost_columns(frame, self.snapshot, self.has_gpus)

    def _report(self) -> Report:
        from gpumagic.render.watch_summary import result_report

        return result_report(self)



def _process_frame(snapshot: Snapshot) -> pd.DataFrame:
    from gpumagic.monitor.processes import ProcessTable

    table = snapshot.processes if snapshot.processes is not None else ProcessTable()
    return table.frame()


def _add_cost_columns(frame: pd.DataFrame, snapshot: Snapshot, has_gpus: bool) -> pd.DataFrame:
    """Issue 12: ``energy_wh`` per cell on the GPU path, ``cost_usd`` when a price was given."""
    cells = snapshot.cells
    if has_gpus:
        frame["energy_wh"] = np.array([c.energy_mj / 3.6e6 for c in cells], dtype=float)
    cost = snapshot.cost
    if cost is not None and cost.price is not None:
        hours = frame["duration_us"].to_numpy(dtype=float) / 3.6e9
        frame["cost_usd"] = hours * cost.price
    return frame
