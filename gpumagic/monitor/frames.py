"""The frames every watch's result offers, built from its layout's columns and labels:
``samples`` (one row per device per sample) and ``series`` (one row per value), and one
sample's values as a dict per device (what a status lists).

Columns are in the layout's units, named once: this machine's in internal units (bytes,
percent, °C, W, MHz), a job's in DCGM's; ``time`` is a timezone-aware local timestamp.
pandas is imported when a frame is first asked for.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from gpumagic.device_kinds import CUDA
from gpumagic.monitor import metrics as M

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.monitor.snapshot import Layout, Snapshot

# The bit mask column (NVML's clock event reasons) is followed by its names, decoded.
MASK_NAMES = "throttle"


def local_times(times: np.ndarray) -> pd.DatetimeIndex:
    import pandas as pd

    tz = datetime.now().astimezone().tzinfo
    return pd.DatetimeIndex(pd.to_datetime(times, unit="s", utc=True)).tz_convert(tz)


def kept_metrics(snap: Snapshot) -> list[tuple[int, M.Metric]]:
    """(column, metric) of the metrics a frame shows: the GPU ones only when GPUs are watched
    (a host-only watch stays narrow)."""
    return [
        (i, m) for i, m in enumerate(snap.layout.metrics) if snap.has_gpus or m.scope != CUDA
    ]


def samples_frame(snap: Snapshot) -> pd.DataFrame:
    """Every sample in the window, one row per device per sample: its labels, its values."""
    import pandas as pd

    n, d = len(snap.times), len(snap.devices)
    flat = snap.values.reshape(n * d, len(snap.layout.metrics))
    data: dict[str, Any] = {"time": local_times(np.repeat(snap.times, d))}
    for label in snap.layout.labels:
        named = np.array([label.read(x) for x in snap.devices], dtype=object)
        data[label.column] = (
            pd.array(np.tile(named, n), dtype="Int64") if label.integer else np.tile(named, n)
        )
    for i, metric in kept_metrics(snap):
        column = flat[:, i]
        if metric.unit == "mask":
            data[metric.key] = pd.array(
                [None if math.isnan(x) else int(x) for x in column], dtype="Int64"
            )
            data[MASK_NAMES] = [";".join(M.throttle_names(x)) for x in column]
        else:
            data[metric.key] = column
    return pd.DataFrame(data)


def series_columns(layout: Layout) -> list[str]:
    """``time, metric, <the labels>, value``: the series' columns (and a job's CSV's)."""
    return ["time", "metric", *(label.column for label in layout.labels), "value"]


def series_frame(snap: Snapshot) -> pd.DataFrame:
    """Every value in the window, one row each, with its labels."""
    import pandas as pd

    t, g, f = np.nonzero(~np.isnan(snap.values))
    names = np.array([m.key for m in snap.layout.metrics], dtype=object)
    data: dict[str, Any] = {"time": local_times(snap.times[t]), "metric": names[f]}
    for label in snap.layout.labels:
        data[label.column] = np.array([label.read(x) for x in snap.devices], dtype=object)[g]
    data["value"] = snap.values[t, g, f]
    return pd.DataFrame(data, columns=series_columns(snap.layout))


def device_values(snap: Snapshot, sample: int = -1) -> list[dict[str, Any]]:
    """One dict per device for one sample (the latest by default): ids, metrics, throttle names."""
    if len(snap.times) == 0:
        return []
    out = []
    for row, device in enumerate(snap.devices):
        v = snap.values[sample, row]
        entry: dict[str, Any] = {
            "device": device.key,
            "label": device.label,
            "name": device.name,
            "index": device.nvml_index,
            "cuda_index": device.cuda_index,
        }
        for i, metric in enumerate(snap.layout.metrics):
            if (metric.scope == CUDA) == (device.kind == CUDA):
                entry[metric.key] = float(v[i])
                if metric.unit == "mask":
                    entry[MASK_NAMES] = M.throttle_names(v[i])
        out.append(entry)
    return out
