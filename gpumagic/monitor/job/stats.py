"""What a job's DCGM series say: stragglers, XID errors, per-cell utilisation.

Pure functions over a job's samples (``times``, and ``values`` as ``(samples, gpus,
fields)`` in :data:`~gpumagic.monitor.job.dcgm.JOB_FIELDS` order), read by the source's
alerts, the result's frames and the renderers alike, so the live view, the status, the
summary and the DataFrames agree.

Values are DCGM's units as Prometheus holds them: % for utilisation, MiB for framebuffer
memory, W, °C, mJ for the energy counter, 0-1 ratios for the profiling fields, the last
XID code (0: none) for ``DCGM_FI_DEV_XID_ERRORS``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gpumagic.device_kinds import CUDA
from gpumagic.monitor.alerts import Alert
from gpumagic.monitor.cells import CellRecord
from gpumagic.monitor.devices import WatchedDevice
from gpumagic.monitor.job import dcgm
from gpumagic.units import fmt_percent

if TYPE_CHECKING:
    from gpumagic.monitor.snapshot import Snapshot

# A GPU "falls well below the job's median" when its mean utilisation over the last
# STRAGGLER_SPAN_S is more than STRAGGLER_POINTS percentage points (or a quarter of the
# median, if that is more) below the median of the job's GPUs. In a synchronous job every
# GPU does the same work, so one that is markedly idler is fed slower (input, PCIe, a
# throttled or failing board) or holds the others up; a median under STRAGGLER_MIN_MEDIAN
# is a job that is not computing, where nobody straggles.
STRAGGLER_SPAN_S = 60.0
STRAGGLER_POINTS = 20.0
STRAGGLER_SHARE = 0.25
STRAGGLER_MIN_MEDIAN = 20.0

UTIL = dcgm.FIELD_INDEX[dcgm.UTIL]
ENERGY = dcgm.FIELD_INDEX[dcgm.ENERGY]
XID = dcgm.FIELD_INDEX[dcgm.XID]


def gpu_from_labels(labels: dict[str, str]) -> WatchedDevice:
    """A job's GPU, as its DCGM series label it."""
    host = next((labels[k] for k in dcgm.HOST_LABELS if labels.get(k)), "?")
    return WatchedDevice(
        CUDA,
        labels.get("modelName", ""),
        uuid=labels.get("UUID") or labels.get("uuid", ""),
        host=host,
        node_index=labels.get("gpu", "?"),
        labels=tuple((k, labels[k]) for k in dcgm.GPU_LABELS if k in labels),
    )


def _mean_over(values: np.ndarray) -> np.ndarray:
    """Mean over axis 0, NaN where a column has no value (without numpy's warning)."""
    ok = ~np.isnan(values)
    n = ok.sum(axis=0)
    total = np.where(ok, values, 0.0).sum(axis=0)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan)


@dataclass(frozen=True)
class Straggler:
    gpu: int  # row among the job's GPUs
    utilization: float  # its mean over the span, %
    median: float  # the job's median over the span, %


def stragglers_in(util: np.ndarray) -> tuple[list[Straggler], float]:
    """The stragglers among GPUs with mean utilisations ``util`` (NaN: no data); the median."""
    known = util[~np.isnan(util)]
    if len(known) < 2:
        return [], math.nan
    median = float(np.median(known))
    if median < STRAGGLER_MIN_MEDIAN:
        return [], median
    gap = max(STRAGGLER_POINTS, STRAGGLER_SHARE * median)
    out = [
        Straggler(i, float(u), median)
        for i, u in enumerate(util.tolist())
        if not math.isnan(u) and u < median - gap
    ]
    return sorted(out, key=lambda s: s.utilization), median


def stragglers(
    times: np.ndarray, values: np.ndarray, span_s: float = STRAGGLER_SPAN_S
) -> list[Straggler]:
    """GPUs whose utilisation over the last ``span_s`` falls well below the job's median."""
    if not len(times):
        return []
    recent = times >= times[-1] - span_s
    return stragglers_in(_mean_over(values[recent, :, UTIL]))[0]


def xid_errors(times: np.ndarray, values: np.ndarray) -> list[tuple[int, int, float]]:
    """(gpu row, XID code, first time seen) of every GPU whose last XID error is non-zero."""
    if not len(times):
        return []
    xid = values[:, :, XID]
    out = []
    for g in range(xid.shape[1]):
        col = xid[:, g]
        seen = np.flatnonzero(~np.isnan(col))
        if not len(seen) or col[seen[-1]] <= 0:
            continue
        code = col[seen[-1]]
        same = seen[col[seen] == code]
        out.append((g, int(code), float(times[same[0]])))
    return out


def job_alerts(
    gpus: Sequence[WatchedDevice], times: np.ndarray, values: np.ndarray
) -> list[Alert]:
    """Stragglers and XID errors, as the header shows them."""
    if not len(times):
        return []
    now = float(times[-1])
    out = []
    for s in stragglers(times, values):
        g = gpus[s.gpu]
        out.append(
            Alert(
                "straggler",
                g.label,
                f"{g.label} at {fmt_percent(s.utilization)} utilisation over the last "
                f"{STRAGGLER_SPAN_S:.0f} s, well below the job's median {fmt_percent(s.median)}",
                now,
            )
        )
    for row, code, since in xid_errors(times, values):
        g = gpus[row]
        out.append(
            Alert("xid", g.label, f"{g.label}: XID error {code} (DCGM_FI_DEV_XID_ERRORS)", since)
        )
    return out


@dataclass
class CellStats:
    """A cell's job-wide numbers (NaN where no sample fell inside the cell)."""

    samples: int
    mean_utilization: float  # mean over the cell's samples and the job's GPUs, %
    min_gpu_utilization: float  # the idlest GPU's mean over the cell, %
    stragglers: tuple[str, ...]  # GPU labels below the job's median during the cell


def cell_stats(snap: Snapshot, cell: CellRecord) -> CellStats:
    end = cell.end if cell.end is not None else snap.now
    inside = (snap.times >= cell.start) & (snap.times <= end)
    if not inside.any():
        return CellStats(0, math.nan, math.nan, ())
    per_gpu = _mean_over(snap.values[inside, :, UTIL])
    known = per_gpu[~np.isnan(per_gpu)]
    found, _median = stragglers_in(per_gpu)
    return CellStats(
        int(inside.sum()),
        float(known.mean()) if len(known) else math.nan,
        float(known.min()) if len(known) else math.nan,
        tuple(snap.devices[s.gpu].label for s in found),
    )


def energy_deltas(previous: np.ndarray, current: np.ndarray) -> np.ndarray:
    """mJ each GPU's energy counter moved between two samples; 0 where either is missing or
    the counter went back (the driver reloaded and it restarted from zero)."""
    n = min(len(previous), len(current))
    d = current[:n] - previous[:n]
    out = np.where(np.isnan(d) | (d < 0), 0.0, d)
    return np.concatenate([out, np.zeros(len(current) - n)])
