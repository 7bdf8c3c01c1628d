"""The frames a job's result offers beyond the samples and the series: ``cells`` (job-wide
utilisation, the idlest GPU and the stragglers while each cell ran, its energy and cost),
``gpus`` (one row per GPU: labels, latest values, mean utilisation, energy, straggler),
``stragglers`` and ``xid_errors``; named in the job's layout (:mod:`.source`).

Built from a :class:`~gpumagic.monitor.snapshot.Snapshot` of the job's samples, in DCGM's
units. pandas is imported when a frame is first asked for.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from gpumagic.monitor.frames import local_times
from gpumagic.monitor.job import dcgm
from gpumagic.monitor.job.stats import cell_stats, stragglers, xid_errors

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.monitor.snapshot import Snapshot

CELL_COLUMNS = [
    "execution_count",
    "source",
    "start",
    "duration_us",
    "samples",
    "mean_utilization",
    "min_gpu_utilization",
    "stragglers",
    "energy_wh",
    "cost_usd",
    "success",
]
# .gpus: one column per field, named for what it holds (DCGM's units)
GPU_FIELD_COLUMNS = {
    dcgm.UTIL: "utilization",
    dcgm.FB_USED: "fb_used_mib",
    dcgm.FB_FREE: "fb_free_mib",
    dcgm.POWER: "power_w",
    dcgm.TEMP: "temperature_c",
    dcgm.SM_ACTIVE: "sm_active",
    dcgm.TENSOR_ACTIVE: "tensor_active",
    dcgm.XID: "xid",
}
_GPU_LABELS = ["Hostname", "gpu", "UUID", "modelName"]


def _device_energy_wh(snap: Snapshot) -> np.ndarray:
    """Each GPU's energy since the start, Wh (NaN without DCGM's energy counter)."""
    energy = snap.cost.device_energy_mj if snap.cost is not None else np.zeros(0)
    out = np.full(len(snap.devices), np.nan)
    n = min(len(energy), len(out))
    out[:n] = energy[:n] / 3.6e6
    return out


def gpu_frame(snap: Snapshot) -> pd.DataFrame:
    """One row per GPU: its labels, latest values, window mean utilisation, energy since the
    start, and whether it straggles over the window."""
    import pandas as pd

    latest = snap.latest()
    util = snap.column(dcgm.UTIL) if len(snap.times) else np.zeros((0, len(snap.devices)))
    ok = ~np.isnan(util)
    with np.errstate(invalid="ignore"):
        mean = np.where(
            ok.any(axis=0),
            np.where(ok, util, 0).sum(axis=0) / np.maximum(ok.sum(axis=0), 1),
            np.nan,
        )
    slow = {s.gpu for s in stragglers(snap.times, snap.values, span_s=snap.window)}
    energy = _device_energy_wh(snap)
    rows = []
    for i, g in enumerate(snap.devices):
        row: dict[str, Any] = dict(zip(_GPU_LABELS, (g.host, g.node_index, g.uuid, g.name)))
        for name, column in GPU_FIELD_COLUMNS.items():
            row[column] = float(latest[i, dcgm.FIELD_INDEX[name]])
        row["mean_utilization"] = float(mean[i]) if i < len(mean) else math.nan
        row["energy_wh"] = float(energy[i])
        row["straggler"] = i in slow
        rows.append(row)
    columns = [*_GPU_LABELS, *GPU_FIELD_COLUMNS.values()]
    return pd.DataFrame(rows, columns=[*columns, "mean_utilization", "energy_wh", "straggler"])


def stragglers_frame(snap: Snapshot) -> pd.DataFrame:
    """GPUs whose utilisation over the window fell well below the job's median."""
    import pandas as pd

    rows = [
        {
            "Hostname": snap.devices[s.gpu].host,
            "gpu": snap.devices[s.gpu].node_index,
            "UUID": snap.devices[s.gpu].uuid,
            "utilization": s.utilization,
            "job_median": s.median,
        }
        for s in stragglers(snap.times, snap.values, span_s=snap.window)
    ]
    return pd.DataFrame(rows, columns=["Hostname", "gpu", "UUID", "utilization", "job_median"])


def xid_frame(snap: Snapshot) -> pd.DataFrame:
    import pandas as pd

    rows = [
        {
            "Hostname": snap.devices[g].host,
            "gpu": snap.devices[g].node_index,
            "xid": code,
            "since": local_times(np.array([since]))[0],
        }
        for g, code, since in xid_errors(snap.times, snap.values)
    ]
    return pd.DataFrame(rows, columns=["Hostname", "gpu", "xid", "since"])


def cells_frame(snap: Snapshot) -> pd.DataFrame:
    """One row per cell that ran while watching: job-wide utilisation, the idlest GPU,
    the stragglers during the cell, energy (Wh) and, with a price, cost."""
    import pandas as pd

    rows = []
    for cell in snap.cells:
        stats = cell_stats(snap, cell)
        duration = cell.duration(snap.now)
        rows.append(
            {
                "execution_count": cell.execution_count,
                "source": cell.source,
                "start": cell.start,
                "duration_us": duration * 1e6,
                "samples": stats.samples,
                "mean_utilization": stats.mean_utilization,
                "min_gpu_utilization": stats.min_gpu_utilization,
                "stragglers": ", ".join(stats.stragglers),
                "energy_wh": cell.energy_mj / 3.6e6,
                "cost_usd": snap.cost.usd(duration) if snap.cost is not None else math.nan,
                "success": cell.success,
            }
        )
    frame = pd.DataFrame(rows, columns=CELL_COLUMNS)
    frame["execution_count"] = frame["execution_count"].astype("Int64")
    frame["start"] = local_times(frame["start"].to_numpy(dtype=float))
    return frame
