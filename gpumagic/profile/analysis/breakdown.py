"""Step-time breakdown and GPU-side metrics (utilisation, SM efficiency, occupancy).

Every instant of a step is given to exactly one category, the first of
``Kernel > Memcpy > Memset > Communication > Runtime > DataLoader > CPU Exec > Other``
that is active then: a kernel running while the CPU is in the DataLoader counts as Kernel
(the GPU was busy), the DataLoader only gets the time nothing on the GPU or in the CUDA
runtime overlapped it. This is the PyTorch Profiler TensorBoard plugin's "step time
breakdown", computed here in one sweep over the elementary segments between all interval
boundaries instead of a chain of interval subtractions.

Communication (issue 11) is the plugin's role too, found as :mod:`gpumagic.profile.analysis.comms`
says: NCCL/RCCL kernels by name (not in Kernel: a collective's time counts where no compute
kernel, copy or set runs), and on a CPU backend its collective spans.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpumagic.profile.analysis import intervals
from gpumagic.profile.analysis.steps import Steps
from gpumagic.profile.trace.model import KERNEL, MEMCPY, MEMSET, Trace

CATEGORIES = (
    "Kernel",
    "Memcpy",
    "Memset",
    "Communication",
    "Runtime",
    "DataLoader",
    "CPU Exec",
    "Other",
)
OTHER = len(CATEGORIES) - 1


@dataclass
class Breakdown:
    """Per step, the µs of each category (rows: steps, columns: :data:`CATEGORIES`)."""

    us: np.ndarray  # shape (steps, len(CATEGORIES))
    step_us: np.ndarray  # shape (steps,)

    @property
    def mean_us(self) -> np.ndarray:
        return self.us.mean(axis=0) if len(self.us) else np.zeros(len(CATEGORIES))

    @property
    def mean_step_us(self) -> float:
        return float(self.step_us.mean()) if len(self.step_us) else 0.0

    @property
    def percent(self) -> np.ndarray:
        step = self.mean_step_us
        return 100.0 * self.mean_us / step if step > 0 else np.zeros(len(CATEGORIES))


def category_intervals(
    trace: Trace,
    dataloader: np.ndarray,
    cpu_exec: np.ndarray,
    comm_kernels: np.ndarray | None = None,
    communication: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The intervals of each category but Other, in priority order.

    ``dataloader`` and ``cpu_exec`` are boolean masks over the host events;
    ``comm_kernels`` a mask over GPU events left out of Kernel, and ``communication``
    the Communication intervals (none when not given).
    """
    gpu, rt, host = trace.gpu, trace.runtime, trace.host
    out = []
    for kind in (KERNEL, MEMCPY, MEMSET):
        m = gpu.kind == kind
        if kind == KERNEL and comm_kernels is not None:
            m &= ~comm_kernels
        out.append((gpu.ts[m], gpu.end[m]))
    out.append(communication if communication is not None else (np.zeros(0), np.zeros(0)))
    out.append((rt.ts, rt.end))
    out.append((host.ts[dataloader], host.end[dataloader]))
    out.append((host.ts[cpu_exec], host.end[cpu_exec]))
    return out


def step_breakdown(steps: Steps, cats: list[tuple[np.ndarray, np.ndarray]]) -> Breakdown:
    """Give each instant of each step to the highest-priority category active then."""
    k = len(steps)
    lo, hi = steps.span
    clipped = [intervals.clip(s, e, lo, hi) for s, e in cats]
    # sorted, not de-duplicated: repeated points only add empty segments
    points = np.sort(
        np.concatenate([steps.start, steps.end] + [x for s, e in clipped for x in (s, e)])
    )
    seg_start = points[:-1]
    seg_len = np.diff(points)
    label = np.full(len(seg_len), OTHER, np.int64)
    unlabelled = np.ones(len(seg_len), bool)
    for c, (s, e) in enumerate(clipped):
        hit = unlabelled & intervals.covered(points, s, e)
        label[hit] = c
        unlabelled &= ~hit
    step_of = np.searchsorted(steps.start, seg_start, side="right") - 1
    inside = (step_of >= 0) & (seg_start < steps.end[np.maximum(step_of, 0)])
    us = np.zeros((k, len(CATEGORIES)))
    np.add.at(us, (step_of[inside], label[inside]), seg_len[inside])
    return Breakdown(us=us, step_us=steps.duration.astype(float))


@dataclass
class DeviceMetrics:
    """One GPU's activity over the analysed steps (percentages of the steps' span)."""

    device: int
    utilization_percent: float  # time any compute kernel ran
    sm_efficiency_percent: float | None  # blocks per SM summed over running kernels, capped at 1
    occupancy_percent: float | None  # est. achieved occupancy, weighted by kernel time
    kernel_us: float
    communication_percent: float | None = None  # time communication kernels ran


def device_metrics(
    trace: Trace, steps: Steps, comm_kernels: np.ndarray | None = None
) -> list[DeviceMetrics]:
    """Utilisation, estimated SM efficiency and achieved occupancy per GPU.

    As in the TensorBoard plugin, only kernels count (not copies), and the window is
    from the first step's start to the last step's end. Communication kernels
    (``comm_kernels``) are not computation: they spin on few SMs while data moves, so
    they count apart, as ``communication_percent``.
    """
    gpu = trace.gpu
    lo, hi = steps.span
    span = hi - lo
    out: list[DeviceMetrics] = []
    kernels = gpu.kind == KERNEL
    comm = np.zeros(len(gpu.ts), bool) if comm_kernels is None else comm_kernels
    kernels = kernels & ~comm
    for dev in np.unique(gpu.device[kernels]).tolist():
        m = kernels & (gpu.device == dev)
        s, e = intervals.clip(gpu.ts[m], gpu.end[m], lo, hi)
        busy = intervals.total(s, e)
        util = 100.0 * busy / span if span > 0 else 0.0

        bps = gpu.blocks_per_sm[m]
        good = np.isfinite(bps) & (bps > 0)
        sm_eff: float | None = None
        if good.any() and span > 0:
            bs, be = gpu.ts[m][good], gpu.end[m][good]
            points = np.unique(np.concatenate([bs, be, [lo, hi]]))
            level = intervals.weighted_cover(points, bs, be, bps[good])
            seg = np.diff(points)
            in_span = (points[:-1] >= lo) & (points[1:] <= hi)
            sm_eff = 100.0 * float((np.minimum(level, 1.0) * seg)[in_span].sum()) / span

        occ = gpu.occupancy[m]
        has_occ = np.isfinite(occ) & (occ >= 0)
        occupancy: float | None = None
        if has_occ.any():
            dur = np.minimum(gpu.end[m], hi) - np.maximum(gpu.ts[m], lo)
            w = np.where(has_occ & (dur > 0), dur, 0.0)
            if w.sum() > 0:
                occupancy = float((np.where(has_occ, occ, 0.0) * w).sum() / w.sum())
        comm_pct: float | None = None
        on_dev = comm & (gpu.device == dev)
        if on_dev.any() and span > 0:
            comm_pct = (
                100.0
                * intervals.total(*intervals.clip(gpu.ts[on_dev], gpu.end[on_dev], lo, hi))
                / span
            )
        out.append(
            DeviceMetrics(
                device=int(dev),
                utilization_percent=util,
                sm_efficiency_percent=sm_eff,
                occupancy_percent=occupancy,
                kernel_us=busy,
                communication_percent=comm_pct,
            )
        )
    return out


def step_device_busy(
    trace: Trace, steps: Steps, comm_kernels: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the µs in which some compute kernel ran (what utilisation counts), and
    the µs in which any kernel, copy or set ran (what idle time leaves out), on any GPU:
    the per-step samples behind a comparison's utilisation and idle rows."""
    gpu = trace.gpu
    comm = np.zeros(len(gpu.ts), bool) if comm_kernels is None else comm_kernels
    compute = (gpu.kind == KERNEL) & ~comm
    busy = np.isin(gpu.kind, (KERNEL, MEMCPY, MEMSET))
    return (
        intervals.length_in(gpu.ts[compute], gpu.end[compute], steps.start, steps.end),
        intervals.length_in(gpu.ts[busy], gpu.end[busy], steps.start, steps.end),
    )
