"""``ProfileSummary``: the headline numbers of a profiled run, as one typed object.

What the report's first lines show and a comparison's table reads (``ProfileResult.summary``).
A field mypy can check, where a string-keyed dict let a renderer ask for a key nobody wrote.
Times are µs, shares percent; ``None`` where the run has no such number (no GPU in the trace,
one rank, too few steps for an interval).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpumagic.profile.analysis import noise
from gpumagic.profile.analysis.breakdown import CATEGORIES
from gpumagic.profile.ranks import communication_row

if TYPE_CHECKING:
    import numpy as np

    from gpumagic.profile.analysis.trace_analysis import Analysis


@dataclass(frozen=True)
class ProfileSummary:
    """The headline numbers of one run (for several ranks, of the slowest rank's trace)."""

    # -- the trace
    source: str  # the file or folder the run was read from
    rank: int | None  # the trace's rank, as it says (None: not said)
    ranks: int  # traces in the result
    slowest_rank: int | None  # the rank the others wait for (None for one rank)
    wall_time_us: float  # the whole trace, first event to last
    profiled_span_us: float  # the analysed steps, first start to last end
    events: int  # duration events kept
    devices: list[str]  # the GPUs the trace's kernels ran on, by name
    cpu_only: bool  # no GPU event in the trace
    findings: int
    # -- the steps
    steps: int  # steps analysed
    step_names: list[str]
    steps_from: str  # what marked them: "ProfilerStep", "DataLoader" or "trace"
    steps_dropped: int  # tail steps left out: their GPU work was not all recorded
    first_step_left_out: bool  # the first marked step (first-call setup) is not counted
    # a trace without step marks: its start-up phase (µs, and what it holds), and whether the
    # step starts after it (the figures leave it out) or holds it
    startup_us: float
    startup: str
    startup_left_out: bool
    step_time_us: float  # mean
    step_time_min_us: float
    step_time_max_us: float
    # every run of --repeat N: their steps are samples of the step time
    runs: int
    step_time_median_us: float
    step_time_median_interval_us: tuple[float, float] | None  # 95%; None under 3 steps
    # -- the GPU
    gpu_utilization_percent: float | None
    sm_efficiency_percent: float | None
    achieved_occupancy_percent: float | None
    gpu_idle_us_per_step: float | None
    gpu_idle_split_us_per_step: dict[str, float] | None  # host_wait, kernel_wait, other
    breakdown_percent: dict[str, float]  # per category of CATEGORIES
    # -- communication
    communication_percent: float
    communication_us_per_step: float
    communication_overlap_percent: float | None
    communication_exposed_us_per_step: float
    communication_busy_percent: float | None
    collective_calls: int
    collective_wait_us_per_step: float | None  # waiting for the other ranks (None: one rank)


def summarise(
    a: Analysis,
    *,
    source: str,
    ranks: int,
    slowest_rank: int | None,
    findings: int,
    collective_wait_us_per_step: float | None,
    step_samples: Sequence[np.ndarray],
) -> ProfileSummary:
    """The summary of the run ``a`` analyses; ``step_samples``: each run's step durations
    (``ProfileResult.step_samples``), for the median and its interval."""
    st, bd, trace, idle = a.steps, a.breakdown, a.trace, a.idle
    n = max(len(st), 1)
    devices = a.devices
    used = [trace.device(d.device) for d in devices]
    percent = dict(zip(CATEGORIES, bd.percent.tolist()))
    us = dict(zip(CATEGORIES, bd.mean_us.tolist()))
    comms = a.comms
    return ProfileSummary(
        source=source,
        rank=trace.rank,
        ranks=ranks,
        slowest_rank=slowest_rank,
        wall_time_us=trace.end - trace.start,
        profiled_span_us=st.span[1] - st.span[0],
        events=trace.events,
        devices=sorted({d.name for d in used if d is not None}),
        cpu_only=not trace.has_gpu,
        findings=findings,
        steps=len(st),
        step_names=list(st.names),
        steps_from=st.source,
        steps_dropped=st.dropped,
        first_step_left_out=st.first_left_out,
        startup_us=st.startup.us if st.startup is not None else 0.0,
        startup=st.startup.describe() if st.startup is not None else "",
        startup_left_out=st.startup_left_out,
        step_time_us=bd.mean_step_us,
        step_time_min_us=float(st.duration.min()) if len(st) else 0.0,
        step_time_max_us=float(st.duration.max()) if len(st) else 0.0,
        runs=len(step_samples),
        step_time_median_us=noise.point(step_samples),
        step_time_median_interval_us=noise.interval(step_samples),
        gpu_utilization_percent=a.gpu_utilization_percent,
        sm_efficiency_percent=_mean([d.sm_efficiency_percent for d in devices]),
        achieved_occupancy_percent=_mean([d.occupancy_percent for d in devices]),
        gpu_idle_us_per_step=sum(idle.device_us.values()) / n if trace.has_gpu else None,
        gpu_idle_split_us_per_step={k: v / n for k, v in idle.device_us.items()}
        if trace.has_gpu
        else None,
        breakdown_percent=percent,
        communication_percent=percent["Communication"],
        communication_us_per_step=us["Communication"],
        communication_overlap_percent=comms.overlap_percent,
        communication_exposed_us_per_step=communication_row(a)["communication_only_us_per_step"]
        if comms.present
        else 0.0,
        communication_busy_percent=comms.busy_percent(a.steps),
        collective_calls=len(comms.calls),
        collective_wait_us_per_step=collective_wait_us_per_step,
    )


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(sum(vals) / len(vals)) if vals else None
