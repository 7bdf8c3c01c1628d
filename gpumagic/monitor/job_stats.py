"""What a job's DCGM series say: stragglers, XID errors, per-cell utilisation, energy, cost.

Pure functions over a :class:`JobSnapshot` (a consistent copy of a
:class:`~gpumagic.monitor.job.JobWatcher`'s samples), read by the result objects and the
renderers alike, so the live view, the status, the summary and the DataFrames agree.

Values are DCGM's units as Prometheus holds them: % for utilisation, MiB for framebuffer
memory, W, °C, mJ for the energy counter, 0-1 ratios for the profiling fields, the last
XID code (0: none) for ``DCGM_FI_DEV_XID_ERRORS``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gpumagic.monitor import dcgm
from gpumagic.monitor.alerts import Alert
from gpumagic.monitor.cells import CellRecord

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

_UTIL = dcgm.FIELD_INDEX[dcgm.UTIL]
_ENERGY = dcgm.FIELD_INDEX[dcgm.ENERGY]
_XID = dcgm.FIELD_INDEX[dcgm.XID]


@dataclass(frozen=True)
class JobGpu:
    """One GPU of the job, as its DCGM series label it."""

    host: str  # the Hostname label (or hostname, or the scrape's instance)
    gpu: str  # the gpu label: its index on the node
    uuid: str = ""
    model: str = ""
    labels: tuple[tuple[str, str], ...] = ()  # the other labels kept (dcgm.GPU_LABELS)

    @property
    def label(self) -> str:
        return f"{self.host} GPU {self.gpu}"

    @property
    def key(self) -> tuple[str, str]:
        return (self.host, self.gpu)


def gpu_from_labels(labels: dict[str, str]) -> JobGpu:
    host = next((labels[k] for k in dcgm.HOST_LABELS if labels.get(k)), "?")
    return JobGpu(
        host=host,
        gpu=labels.get("gpu", "?"),
        uuid=labels.get("UUID") or labels.get("uuid", ""),
        model=labels.get("modelName", ""),
        labels=tuple((k, labels[k]) for k in dcgm.GPU_LABELS if k in labels),
    )


@dataclass
class JobSnapshot:
    """A consistent copy of a job watcher's state: what results and renderers read."""

    url: str
    selector: str
    gpus: tuple[JobGpu, ...]
    times: np.ndarray  # (samples,) seconds: Prometheus's evaluation times
    values: np.ndarray  # (samples, gpus, len(dcgm.JOB_FIELDS)), NaN = missing
    cells: list[CellRecord]
    alerts: list[Alert]
    notes: list[str]
    interval: float
    window: float
    started: float
    now: float
    running: bool
    log_path: str | None
    polls: int  # queries answered since the start
    seq: int  # changes exactly when a new sample is in
    price: float | None  # dollars per GPU-hour
    energy_mj: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per GPU since start
    missing: tuple[str, ...] = ()  # required fields with no series
    history_from: float | None = None  # the start of the history read at the start

    @property
    def hosts(self) -> list[str]:
        """The nodes, in the order their GPUs were first seen."""
        return list(dict.fromkeys(g.host for g in self.gpus))

    def field(self, name: str) -> np.ndarray:
        """(samples, gpus) of one DCGM field."""
        return self.values[:, :, dcgm.FIELD_INDEX[name]]

    def has(self, name: str) -> bool:
        return bool(len(self.times)) and not np.isnan(self.field(name)).all()

    @property
    def energy_wh(self) -> float:
        """Job-wide energy since the watch started (NaN without the energy counter)."""
        if not len(self.energy_mj) or dcgm.ENERGY in self.missing:
            return math.nan
        return float(self.energy_mj.sum()) / 3.6e6

    @property
    def cost_usd(self) -> float:
        """Price per GPU-hour times the GPUs watched times the time watched (NaN: no price)."""
        if self.price is None:
            return math.nan
        return self.price * len(self.gpus) * max(self.now - self.started, 0.0) / 3600


def _mean_over(values: np.ndarray) -> np.ndarray:
    """Mean over axis 0, NaN where a column has no value (without numpy's warning)."""
    ok = ~np.isnan(values)
    n = ok.sum(axis=0)
    total = np.where(ok, values, 0.0).sum(axis=0)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan)


@dataclass(frozen=True)
class Straggler:
    gpu: int  # row in JobSnapshot.gpus
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


def stragglers(snap: JobSnapshot, span_s: float = STRAGGLER_SPAN_S) -> list[Straggler]:
    """GPUs whose utilisation over the last ``span_s`` falls well below the job's median."""
    if not len(snap.times):
        return []
    recent = snap.times >= snap.times[-1] - span_s
    return stragglers_in(_mean_over(snap.field(dcgm.UTIL)[recent]))[0]


def xid_errors(snap: JobSnapshot) -> list[tuple[int, int, float]]:
    """(gpu row, XID code, first time seen) of every GPU whose last XID error is non-zero."""
    if not len(snap.times):
        return []
    xid = snap.values[:, :, _XID]
    out = []
    for g in range(xid.shape[1]):
        col = xid[:, g]
        seen = np.flatnonzero(~np.isnan(col))
        if not len(seen) or col[seen[-1]] <= 0:
            continue
        code = col[seen[-1]]
        same = seen[col[seen] == code]
        out.append((g, int(code), float(snap.times[same[0]])))
    return out


def job_alerts(snap: JobSnapshot) -> list[Alert]:
    """Stragglers and XID errors, as the header shows them."""
    from gpumagic.units import fmt_percent

    now = float(snap.times[-1]) if len(snap.times) else snap.now
    out = []
    for s in stragglers(snap):
        g = snap.gpus[s.gpu]
        out.append(
            Alert(
                "straggler",
                g.label,
                f"{g.label} at {fmt_percent(s.utilization)} utilisation over the last "
                f"{STRAGGLER_SPAN_S:.0f} s, well below the job's median {fmt_percent(s.median)}",
                now,
            )
        )
    for row, code, since in xid_errors(snap):
        g = snap.gpus[row]
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


def cell_stats(snap: JobSnapshot, cell: CellRecord) -> CellStats:
    end = cell.end if cell.end is not None else snap.now
    inside = (snap.times >= cell.start) & (snap.times <= end)
    if not inside.any():
        return CellStats(0, math.nan, math.nan, ())
    per_gpu = _mean_over(snap.field(dcgm.UTIL)[inside])
    known = per_gpu[~np.isnan(per_gpu)]
    found, _median = stragglers_in(per_gpu)
    return CellStats(
        int(inside.sum()),
        float(known.mean()) if len(known) else math.nan,
        float(known.min()) if len(known) else math.nan,
        tuple(snap.gpus[s.gpu].label for s in found),
    )


def cell_cost(snap: JobSnapshot, cell: CellRecord) -> float:
    """What the job's GPUs cost while the cell ran, at ``price`` per GPU-hour (NaN: no price)."""
    if snap.price is None:
        return math.nan
    return snap.price * len(snap.gpus) * cell.duration(snap.now) / 3600


def energy_deltas(previous: np.ndarray, current: np.ndarray) -> np.ndarray:
    """mJ each GPU's energy counter moved between two samples; 0 where either is missing or
    the counter went back (the driver reloaded and it restarted from zero)."""
    n = min(len(previous), len(current))
    d = current[:n] - previous[:n]
    out = np.where(np.isnan(d) | (d < 0), 0.0, d)
    return np.concatenate([out, np.zeros(len(current) - n)])
