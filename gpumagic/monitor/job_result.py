"""What a job watcher hands back: ``JobStatus`` (the GPUs now) and ``JobResult`` (the
window's series, the GPUs, the cells), as plain data plus a mime bundle.

``JobResult.series`` is the data itself, one row per value with its labels (``time``,
``metric``, ``Hostname``, ``gpu``, ``UUID``, ``modelName``, ``value``: the CSV log's columns),
in DCGM's units; the other frames are derived from it. pandas is imported when a frame is
first asked for.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from gpumagic.monitor import dcgm
from gpumagic.monitor.alerts import Alert
from gpumagic.monitor.job_stats import (
    JobSnapshot,
    cell_cost,
    cell_stats,
    stragglers,
    xid_errors,
)

if TYPE_CHECKING:
    import pandas as pd

SERIES_COLUMNS = ["time", "metric", "Hostname", "gpu", "UUID", "modelName", "value"]
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


def _local_times(times: np.ndarray) -> pd.DatetimeIndex:
    import pandas as pd

    tz = datetime.now().astimezone().tzinfo
    return pd.DatetimeIndex(pd.to_datetime(times, unit="s", utc=True)).tz_convert(tz)


def latest_values(snap: JobSnapshot) -> np.ndarray:
    """(gpus, fields) of the latest sample (NaN: that field had no value then). Not the last
    value ever seen: a GPU that stopped reporting shows nothing, rather than an old number."""
    if not len(snap.values):
        return np.full(snap.values.shape[1:], np.nan)
    return snap.values[-1].copy()


def gpu_frame(snap: JobSnapshot) -> pd.DataFrame:
    """One row per GPU: its labels, latest values, window mean utilisation, energy since the
    start, and whether it straggles over the window."""
    import pandas as pd

    latest = latest_values(snap)
    util = snap.field(dcgm.UTIL) if len(snap.times) else np.zeros((0, len(snap.gpus)))
    ok = ~np.isnan(util)
    with np.errstate(invalid="ignore"):
        mean = np.where(
            ok.any(axis=0),
            np.where(ok, util, 0).sum(axis=0) / np.maximum(ok.sum(axis=0), 1),
            np.nan,
        )
    slow = {s.gpu for s in stragglers(snap, span_s=snap.window)}
    rows = []
    for i, g in enumerate(snap.gpus):
        row: dict[str, Any] = {
            "Hostname": g.host,
            "gpu": g.gpu,
            "UUID": g.uuid,
            "modelName": g.model,
        }
        for name, column in GPU_FIELD_COLUMNS.items():
            row[column] = float(latest[i, dcgm.FIELD_INDEX[name]])
        row["mean_utilization"] = float(mean[i]) if i < len(mean) else math.nan
        row["energy_wh"] = (
            float(snap.energy_mj[i]) / 3.6e6
            if i < len(snap.energy_mj) and dcgm.ENERGY not in snap.missing
            else math.nan
        )
        row["straggler"] = i in slow
        rows.append(row)
    columns = ["Hostname", "gpu", "UUID", "modelName", *GPU_FIELD_COLUMNS.values()]
    return pd.DataFrame(rows, columns=[*columns, "mean_utilization", "energy_wh", "straggler"])


class JobStatus:
    """The job's GPUs now: latest values, the alerts (stragglers, XID errors), notes."""

    def __init__(self, snapshot: JobSnapshot) -> None:
        self.snapshot = snapshot
        self.url = snapshot.url
        self.selector = snapshot.selector
        self.alerts: list[Alert] = snapshot.alerts
        self.notes = snapshot.notes
        self.time = snapshot.now
        self.running = snapshot.running

    @property
    def gpus(self) -> pd.DataFrame:
        return gpu_frame(self.snapshot)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from gpumagic.render.job import status_html, status_text

        return {"text/plain": status_text(self), "text/html": status_html(self)}

    def __repr__(self) -> str:
        from gpumagic.render.job import status_text

        return status_text(self)


class JobResult:
    """A stopped (or snapshotted) job watch: ``series``, ``gpus``, ``cells``, ``stragglers``,
    ``xid_errors`` frames, the job's energy and cost, the log path, and a summary chart."""

    def __init__(self, snapshot: JobSnapshot) -> None:
        self.snapshot = snapshot
        self.url = snapshot.url
        self.selector = snapshot.selector
        self.log: str | None = snapshot.log_path
        self.notes = snapshot.notes
        self.alerts: list[Alert] = snapshot.alerts
        self.interval = snapshot.interval
        self.window = snapshot.window
        self._series: pd.DataFrame | None = None

    @property
    def energy_wh(self) -> float:
        """The job's GPUs' energy while watched (NaN without DCGM's energy counter)."""
        return self.snapshot.energy_wh

    @property
    def cost_usd(self) -> float:
        """Price per GPU-hour x GPUs x the time watched (NaN without ``price``)."""
        return self.snapshot.cost_usd

    @property
    def series(self) -> pd.DataFrame:
        """Every value in the window, one row each, with its labels (the CSV's columns)."""
        if self._series is None:
            self._series = series_frame(self.snapshot)
        return self._series

    @property
    def gpus(self) -> pd.DataFrame:
        return gpu_frame(self.snapshot)

    @property
    def stragglers(self) -> pd.DataFrame:
        """GPUs whose utilisation over the window fell well below the job's median."""
        import pandas as pd

        snap = self.snapshot
        rows = [
            {
                "Hostname": snap.gpus[s.gpu].host,
                "gpu": snap.gpus[s.gpu].gpu,
                "UUID": snap.gpus[s.gpu].uuid,
                "utilization": s.utilization,
                "job_median": s.median,
            }
            for s in stragglers(snap, span_s=snap.window)
        ]
        return pd.DataFrame(rows, columns=["Hostname", "gpu", "UUID", "utilization", "job_median"])

    @property
    def xid_errors(self) -> pd.DataFrame:
        import pandas as pd

        snap = self.snapshot
        rows = [
            {
                "Hostname": snap.gpus[g].host,
                "gpu": snap.gpus[g].gpu,
                "xid": code,
                "since": _local_times(np.array([since]))[0],
            }
            for g, code, since in xid_errors(snap)
        ]
        return pd.DataFrame(rows, columns=["Hostname", "gpu", "xid", "since"])

    @property
    def cells(self) -> pd.DataFrame:
        """One row per cell that ran while watching: job-wide utilisation, the idlest GPU,
        the stragglers during the cell, energy (Wh) and, with a price, cost."""
        import pandas as pd

        snap = self.snapshot
        rows = []
        for cell in snap.cells:
            stats = cell_stats(snap, cell)
            rows.append(
                {
                    "execution_count": cell.execution_count,
                    "source": cell.source,
                    "start": cell.start,
                    "duration_us": cell.duration(snap.now) * 1e6,
                    "samples": stats.samples,
                    "mean_utilization": stats.mean_utilization,
                    "min_gpu_utilization": stats.min_gpu_utilization,
                    "stragglers": ", ".join(stats.stragglers),
                    "energy_wh": cell.energy_mj / 3.6e6
                    if dcgm.ENERGY not in snap.missing
                    else math.nan,
                    "cost_usd": cell_cost(snap, cell),
                    "success": cell.success,
                }
            )
        frame = pd.DataFrame(rows, columns=CELL_COLUMNS)
        frame["execution_count"] = frame["execution_count"].astype("Int64")
        frame["start"] = _local_times(frame["start"].to_numpy(dtype=float))
        return frame

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from gpumagic.render.job import result_html, result_text

        return {"text/plain": result_text(self), "text/html": result_html(self)}

    def __repr__(self) -> str:
        from gpumagic.render.job import result_text

        return result_text(self)


def series_frame(snap: JobSnapshot) -> pd.DataFrame:
    """The snapshot's values as rows (time, metric, Hostname, gpu, UUID, modelName, value)."""
    import pandas as pd

    t, g, f = np.nonzero(~np.isnan(snap.values))
    hosts = np.array([x.host for x in snap.gpus], dtype=object)
    gpus = np.array([x.gpu for x in snap.gpus], dtype=object)
    uuids = np.array([x.uuid for x in snap.gpus], dtype=object)
    models = np.array([x.model for x in snap.gpus], dtype=object)
    names = np.array([x.name for x in dcgm.JOB_FIELDS], dtype=object)
    return pd.DataFrame(
        {
            "time": _local_times(snap.times[t]),
            "metric": names[f],
            "Hostname": hosts[g],
            "gpu": gpus[g],
            "UUID": uuids[g],
            "modelName": models[g],
            "value": snap.values[t, g, f],
        },
        columns=SERIES_COLUMNS,
    )
