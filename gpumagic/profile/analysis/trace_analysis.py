"""One rank's analysis: steps, breakdown, idle time, operator and kernel tables.

Each piece is computed on first use and cached, from the columns in
:class:`gpumagic.profile.trace.model.Trace`. Nothing here prints or displays; the result
object (:mod:`gpumagic.profile.result`) turns these into DataFrames and reports.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TypeVar

import numpy as np
import pandas as pd

from gpumagic.profile.analysis import intervals, tree
from gpumagic.profile.analysis.breakdown import (
    CATEGORIES,
    Breakdown,
    DeviceMetrics,
    category_intervals,
    device_metrics,
    step_breakdown,
)
from gpumagic.profile.analysis.comms import Communication
from gpumagic.profile.analysis.idle import (
    IDLE_CATEGORIES,
    Gaps,
    device_gaps,
    ops_during,
    stream_idle,
)
from gpumagic.profile.analysis.steps import (
    Steps,
    find_steps,
    is_dataloader,
    is_profiler_step,
)
from gpumagic.profile.trace.model import KERNEL, MEMCPY, MEMSET, Trace

OPS_COLUMNS = [
    "name",
    "calls",
    "host_self_us",
    "host_total_us",
    "device_self_us",
    "device_total_us",
]
KERNEL_COLUMNS = [
    "name",
    "calls",
    "total_us",
    "mean_us",
    "max_us",
    "min_us",
    "blocks_per_sm",
    "occupancy_percent",
    "percent",
]
IDLE_COLUMNS = [
    "device",
    "stream",
    "events",
    "busy_us",
    "host_wait_us",
    "kernel_wait_us",
    "other_us",
    "idle_us",
]
GAP_COLUMNS = ["device", "step", "start_us", "us", "category", "cpu_ops"]

# c10::DeviceType values in "[memory]" events
_CUDA_DEVICE_TYPE = 1

_HOST_SYNC = re.compile(
    r"^(cuda|hip)(StreamSynchronize|DeviceSynchronize|EventSynchronize|CtxSynchronize)$"
    r"|^cu(StreamSynchronize|CtxSynchronize|EventSynchronize)$"
)


def is_host_sync(name: str) -> bool:
    """A runtime call that blocks the CPU until the GPU catches up."""
    return _HOST_SYNC.match(name) is not None


@dataclass
class IdleReport:
    """GPU idle time inside the analysed window, HTA's way, plus the longest gaps.

    ``streams`` is HTA's breakdown, one row per (device, stream): a stream idles while
    another computes, so these add up to more than the wall time on multi-stream runs.
    ``device_us`` is the time no stream of a GPU was busy (what actually costs time),
    split by the same rules, and ``gaps`` lists the longest such stretches.
    """

    streams: pd.DataFrame  # IDLE_COLUMNS
    gaps: pd.DataFrame  # GAP_COLUMNS, longest first
    device_us: dict[str, float]  # host_wait / kernel_wait / other, device-wide, whole window
    window: tuple[float, float]
    window_kind: str  # "steps" or "hta"

    @property
    def totals(self) -> dict[str, float]:
        """µs per idle category summed over streams, as HTA reports them."""
        return {c: float(self.streams[f"{c}_us"].sum()) for c in IDLE_CATEGORIES}

    @property
    def window_us(self) -> float:
        return self.window[1] - self.window[0]


@dataclass
class MemoryPeak:
    device: int
    peak_bytes: float
    capacity_bytes: int | None
    measure: str  # "reserved", "allocated", or "allocated since the trace began"


# Collectives on the host as Kineto names them: the c10d ops (c10d::allreduce_), the
# backend's record_function ("nccl:all_reduce", "gloo:all_reduce") and DDP's
# record_param_comms spans (on the device: the communication kernels, comms.py).
_HOST_COLLECTIVE = re.compile(
    r"^(?:c10d::|(?:nccl|gloo|mpi|ucc|rccl):)(?:all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|"
    r"broadcast|reduce|barrier|_allgather_base|_reduce_scatter_base)|^record_param_comms$",
    re.IGNORECASE,
)


_T = TypeVar("_T")


class Analysis:
    """Everything derived from one trace file (one rank)."""

    def __init__(
        self,
        trace: Trace,
        step_marks: bool = True,
        mark_limit: int | None = None,
        skip_first: bool = False,
        keep_startup: bool = False,
    ) -> None:
        self.trace = trace
        self.step_marks = step_marks  # False: ignore ProfilerStep spans when finding steps
        self.mark_limit = mark_limit  # ProfilerStep#N with N >= this are not steps (a cell's tail)
        self.skip_first = skip_first  # leave the first marked step (first-call setup) out
        self.keep_startup = keep_startup  # an unmarked trace's start-up phase stays in its step
        self._memos: dict[str, object] = {}  # see memo()

    def memo(self, key: str, make: Callable[[], _T]) -> _T:
        """What ``make()`` builds, made once and kept on this analysis. For the modules that
        build on an Analysis (per-line and per-module attribution) and so cannot be its
        cached properties without an import circle; a cache outside it would keep every
        analysis alive, since what it holds refers back to its analysis."""
        if key not in self._memos:
            self._memos[key] = make()
        return self._memos[key]  # type: ignore[return-value]

    # --- links -----------------------------------------------------------------------

    @cached_property
    def launch_runtime(self) -> np.ndarray:
        """Per GPU event, the index of the runtime call that launched it (-1: unknown)."""
        rt_corr = self.trace.runtime.correlation
        gpu_corr = self.trace.gpu.correlation
        out = np.full(len(gpu_corr), -1, np.int64)
        if len(rt_corr) == 0 or len(gpu_corr) == 0:
            return out
        order = np.argsort(rt_corr, kind="stable")
        sorted_corr = rt_corr[order]
        pos = np.searchsorted(sorted_corr, gpu_corr)
        pos_c = np.minimum(pos, len(sorted_corr) - 1)
        ok = (gpu_corr >= 0) & (sorted_corr[pos_c] == gpu_corr)
        out[ok] = order[pos_c[ok]]
        return out

    @cached_property
    def launch_ts(self) -> np.ndarray:
        """Per GPU event, when its launching call started (NaN when not linked)."""
        out = np.full(len(self.launch_runtime), np.nan)
        ok = self.launch_runtime >= 0
        out[ok] = self.trace.runtime.ts[self.launch_runtime[ok]]
        return out

    @cached_property
    def launch_op(self) -> np.ndarray:
        """Per GPU event, the host operator its launching runtime call ran inside (-1: not
        linked to a launch, or launched outside any operator)."""
        _, rt_par = self.parents
        out = np.full(len(self.launch_runtime), -1, np.int64)
        ok = self.launch_runtime >= 0
        out[ok] = rt_par[self.launch_runtime[ok]]
        return out

    # --- host-side structure ---------------------------------------------------------

    @cached_property
    def is_step_mark(self) -> np.ndarray:
        return self.trace.host.name.mask(is_profiler_step)

    @cached_property
    def is_dataloader(self) -> np.ndarray:
        return self.trace.host.name.mask(is_dataloader)

    @cached_property
    def parents(self) -> tuple[np.ndarray, np.ndarray]:
        """(parent of each host event, parent of each runtime call), both host indexes."""
        host, rt = self.trace.host, self.trace.runtime
        n = len(host.ts)
        par = tree.parents(
            np.concatenate([host.ts, rt.ts]),
            np.concatenate([host.end, rt.end]),
            np.concatenate([host.thread, rt.thread]),
        )
        # A runtime call is never a parent: what nests inside one belongs to the runtime
        # call's own parent. MTIA's runtime spans nest deeper (gif_merge holds
        # predictor_executor::run, which holds operators and other runtime calls), so the
        # parent is taken up the chain until it is an operator or none: one step up left
        # runtime indexes among the host's (an IndexError on HTA's MTIA inference trace).
        bad = np.flatnonzero(par >= n)
        while len(bad):
            par[bad] = par[par[bad]]
            bad = bad[par[bad] >= n]
        return par[:n], par[n:]

    @cached_property
    def depth(self) -> np.ndarray:
        return tree.depths(self.parents[0])

    # --- steps and breakdown ---------------------------------------------------------

    @cached_property
    def steps(self) -> Steps:
        return find_steps(
            self.trace,
            self.launch_runtime,
            self.step_marks,
            self.mark_limit,
            self.skip_first,
            self.keep_startup,
        )

    @cached_property
    def breakdown(self) -> Breakdown:
        cpu_exec = ~self.is_step_mark & ~self.is_dataloader
        comms = self.comms
        cats = category_intervals(
            self.trace, self.is_dataloader, cpu_exec, comms.kernels, comms.intervals
        )
        return step_breakdown(self.steps, cats)

    @cached_property
    def devices(self) -> list[DeviceMetrics]:
        return device_metrics(self.trace, self.steps, self.comms.kernels)

    @cached_property
    def comms(self) -> Communication:
        """Communication: collectives, their overlap with compute, the calls (issue 11)."""
        return Communication(self)

    @cached_property
    def collective_us_per_step(self) -> float:
        """Mean time per step spent in collectives (all-reduce, all-gather, ...): the union of
        NCCL/RCCL kernels on the device and of c10d/gloo/NCCL operators on the host, inside
        the steps. In synchronous data parallelism every rank's step is as long as the
        slowest rank's; what differs is how long each waits in the collective, so the rank
        the others wait for is the one that spends the least time there."""
        st = self.steps
        if not len(st):
            return 0.0
        host, gpu = self.trace.host, self.trace.gpu
        on_host = host.name.mask(lambda n: _HOST_COLLECTIVE.search(n) is not None)
        on_gpu = self.comms.kernels
        starts = np.concatenate([host.ts[on_host], gpu.ts[on_gpu]]).astype(float)
        ends = np.concatenate([host.end[on_host], gpu.end[on_gpu]]).astype(float)
        if not len(starts):
            return 0.0
        s, e = intervals.merge(starts, ends)
        inside = sum(
            intervals.total(*intervals.clip(s, e, lo, hi)) for lo, hi in zip(st.start, st.end)
        )
        return float(inside / len(st))

    # --- the analysed window: what every table counts ----------------------------------

    @property
    def window(self) -> tuple[float, float]:
        """What every table counts (:attr:`Steps.window`): operators, kernels, lines and
        modules that started, or GPU work launched, inside it, as the step statistics do."""
        return self.steps.window

    @cached_property
    def host_in_window(self) -> np.ndarray:
        """Mask over host events: those that started inside :attr:`window`."""
        lo, hi = self.window
        ts = self.trace.host.ts
        return (ts >= lo) & (ts <= hi)

    @cached_property
    def gpu_in_window(self) -> np.ndarray:
        """Mask over GPU events: launched inside :attr:`window`; one whose launch the trace
        does not link, when it ran inside the steps' span."""
        lo, hi = self.window
        launch = self.launch_ts
        linked = np.isfinite(launch)
        gpu = self.trace.gpu
        span_lo, span_hi = self.steps.span if len(self.steps) else (lo, hi)
        return np.where(
            linked, (launch >= lo) & (launch <= hi), (gpu.end > span_lo) & (gpu.ts < span_hi)
        )

    @property
    def gpu_utilization_percent(self) -> float | None:
        if not self.devices:
            return None
        return float(np.mean([d.utilization_percent for d in self.devices]))

    def steps_frame(self) -> pd.DataFrame:
        st, bd = self.steps, self.breakdown
        frame = pd.DataFrame(
            {
                "step": st.names,
                "start_us": st.start - self.trace.start,
                "end_us": st.end - self.trace.start,
                "duration_us": st.duration,
                "host_us": st.host_end - st.host_start,
                "device_events": st.device_events,
            }
        )
        for i, c in enumerate(CATEGORIES):
            frame[f"{c}_us"] = bd.us[:, i]
        return frame

    def breakdown_frame(self) -> pd.DataFrame:
        bd = self.breakdown
        frame = pd.DataFrame(
            {"us": bd.mean_us, "percent": bd.percent}, index=pd.Index(CATEGORIES, name="category")
        )
        return frame

    # --- tables ----------------------------------------------------------------------

    @cached_property
    def op_rows(self) -> np.ndarray:
        """Host events that are operators or annotations (not the ProfilerStep marks)."""
        return np.flatnonzero(~self.is_step_mark)

    @cached_property
    def device_time(self) -> tuple[np.ndarray, np.ndarray]:
        """(self, total) µs of device work launched by each host event."""
        host, gpu = self.trace.host, self.trace.gpu
        n = len(host.ts)
        host_par, _ = self.parents
        rows = np.flatnonzero(self.launch_op >= 0)
        op, dur = self.launch_op[rows], (gpu.end - gpu.ts)[rows]
        self_us = np.bincount(op, weights=dur, minlength=n)[:n] if n else np.zeros(0)
        total_us = tree.add_to_ancestors(host_par, op, dur, n)
        return self_us, total_us

    @cached_property
    def host_self(self) -> np.ndarray:
        host, rt = self.trace.host, self.trace.runtime
        n = len(host.ts)
        host_par, rt_par = self.parents
        dur = host.end - host.ts
        # float whatever the input: bincount of no rows (no host op nested in another) gives
        # int64 zeros, which the runtime calls' float durations cannot be added to in place
        child = (
            np.bincount(host_par[host_par >= 0], weights=dur[host_par >= 0], minlength=n)[:n]
            if n
            else np.zeros(0)
        ).astype(np.float64, copy=False)
        rt_dur = rt.end - rt.ts
        child += (
            np.bincount(rt_par[rt_par >= 0], weights=rt_dur[rt_par >= 0], minlength=n)[:n]
            if n
            else 0
        )
        return np.maximum(dur - child, 0.0)

    @property
    def op_rows_in_window(self) -> np.ndarray:
        """The operators (:attr:`op_rows`) that started inside :attr:`window`."""
        return self.op_rows[self.host_in_window[self.op_rows]]

    def ops_frame(self) -> pd.DataFrame:
        host = self.trace.host
        rows = self.op_rows_in_window
        if len(rows) == 0:
            return pd.DataFrame(
                {c: pd.Series(dtype=float if c.endswith("_us") else object) for c in OPS_COLUMNS}
            )
        dev_self, dev_total = self.device_time
        codes = host.name.codes[rows]
        k = len(host.name.values)
        calls = np.bincount(codes, minlength=k)
        used = np.flatnonzero(calls)

        def total(values: np.ndarray) -> np.ndarray:
            return np.bincount(codes, weights=values[rows], minlength=k)[used]

        frame = pd.DataFrame(
            {
                "name": [host.name.values[i] for i in used],
                "calls": calls[used],
                "host_self_us": total(self.host_self),
                "host_total_us": total(host.end - host.ts),
                "device_self_us": total(dev_self),
                "device_total_us": total(dev_total),
            }
        )
        return frame.sort_values(
            ["device_total_us", "host_total_us"], ascending=False, kind="stable"
        ).reset_index(drop=True)

    def ops_by_shape_frame(self) -> pd.DataFrame:
        host = self.trace.host
        rows = self.op_rows_in_window
        dims, types = host.inputs(rows)
        dev_self, dev_total = self.device_time
        frame = pd.DataFrame(
            {
                "name": [host.name.values[c] for c in host.name.codes[rows]],
                "input_shapes": dims,
                "input_types": types,
                "calls": 1,
                "host_self_us": self.host_self[rows],
                "host_total_us": (host.end - host.ts)[rows],
                "device_self_us": dev_self[rows],
                "device_total_us": dev_total[rows],
            }
        )
        out = frame.groupby(
            ["name", "input_shapes", "input_types"], sort=False, as_index=False
        ).sum()
        return out.sort_values(
            ["device_total_us", "host_total_us"], ascending=False, kind="stable"
        ).reset_index(drop=True)

    def kernels_frame(self, rows: np.ndarray | None = None) -> pd.DataFrame:
        """Kernels grouped by name (those launched in :attr:`window`, or the GPU events ``rows``)."""
        gpu = self.trace.gpu
        kernel = gpu.kind == KERNEL
        rows = np.flatnonzero(kernel & self.gpu_in_window) if rows is None else rows[kernel[rows]]
        if len(rows) == 0:
            return pd.DataFrame(
                {c: pd.Series(dtype=object if c == "name" else float) for c in KERNEL_COLUMNS}
            )
        codes = gpu.name.codes[rows]
        k = len(gpu.name.values)
        dur = (gpu.end - gpu.ts)[rows]
        calls = np.bincount(codes, minlength=k)
        used = np.flatnonzero(calls)
        total = np.bincount(codes, weights=dur, minlength=k)
        mx = np.full(k, -np.inf)
        mn = np.full(k, np.inf)
        np.maximum.at(mx, codes, dur)
        np.minimum.at(mn, codes, dur)

        def weighted(values: np.ndarray) -> np.ndarray:
            # duration-weighted mean over the calls that reported a value (NaN if none did)
            v = values[rows]
            ok = np.isfinite(v) & (v >= 0)
            w = np.where(ok, dur, 0.0)
            num = np.bincount(codes, weights=np.where(ok, v, 0.0) * w, minlength=k)
            den = np.bincount(codes, weights=w, minlength=k)
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(den > 0, num / den, np.nan)

        all_kernel_us = float(dur.sum())
        frame = pd.DataFrame(
            {
                "name": [gpu.name.values[i] for i in used],
                "calls": calls[used],
                "total_us": total[used],
                "mean_us": total[used] / calls[used],
                "max_us": mx[used],
                "min_us": mn[used],
                "blocks_per_sm": weighted(gpu.blocks_per_sm)[used],
                "occupancy_percent": weighted(gpu.occupancy)[used],
                "percent": 100.0 * total[used] / all_kernel_us if all_kernel_us > 0 else 0.0,
            }
        )
        return frame.sort_values("total_us", ascending=False, kind="stable").reset_index(drop=True)

    # --- idle ------------------------------------------------------------------------

    def idle_rows(self, window: str = "steps") -> tuple[np.ndarray, tuple[float, float]]:
        """The GPU events an idle analysis covers, and the window it reports on.

        ``"steps"``: events launched from inside the analysed steps (:attr:`gpu_in_window`). ``"hta"``: HTA's choice, events launched before
        the last ProfilerStep began (HTA always leaves the last step out, as possibly
        incomplete); with fewer than two marks, every event.
        """
        trace, st = self.trace, self.steps
        busy_kind = np.isin(trace.gpu.kind, (KERNEL, MEMCPY, MEMSET))
        if window == "hta":
            marks = np.flatnonzero(self.is_step_mark)
            n_names = len({trace.host.name.at(int(i)) for i in marks})
            if n_names >= 2:
                last_start = float(trace.host.ts[marks].max())
                rows = np.flatnonzero(busy_kind & (self.launch_ts < last_start))
            else:
                rows = np.flatnonzero(busy_kind)
        elif window == "steps":
            rows = np.flatnonzero(busy_kind & self.gpu_in_window)
        else:
            raise ValueError(f"window must be 'steps' or 'hta', not {window!r}")
        if window == "steps" or len(rows) == 0:
            return rows, st.span
        return rows, (float(trace.gpu.ts[rows].min()), float(trace.gpu.end[rows].max()))

    def idle_report(self, window: str = "steps", gaps: int = 10) -> IdleReport:
        rows, (lo, hi) = self.idle_rows(window)
        streams = stream_idle(self.trace, rows, self.launch_ts)
        frame = pd.DataFrame(
            [
                [
                    s.device,
                    s.stream,
                    s.events,
                    s.busy_us,
                    s.host_wait_us,
                    s.kernel_wait_us,
                    s.other_us,
                    s.idle_us,
                ]
                for s in streams
            ],
            columns=IDLE_COLUMNS,
        )
        gaps_all = (
            self.device_gaps
            if window == "steps"
            else device_gaps(self.trace, rows, self.launch_ts, lo, hi)
        )
        candidates = self.op_rows
        st = self.steps
        records = []
        for g in np.argsort(-gaps_all.us, kind="stable")[:gaps].tolist():
            a, b = float(gaps_all.start[g]), float(gaps_all.end[g])
            k = int(np.searchsorted(st.start, a, side="right") - 1)
            step = st.names[k] if 0 <= k < len(st) and a < st.end[k] else ""
            ops = ops_during(self.trace, candidates, a, b)
            category = IDLE_CATEGORIES[int(gaps_all.category[g])]
            records.append(
                [int(gaps_all.device[g]), step, a - self.trace.start, b - a, category, ops]
            )
        device_us = gaps_all.total_by_category()
        return IdleReport(
            streams=frame,
            gaps=pd.DataFrame(records, columns=GAP_COLUMNS),
            device_us=device_us,
            window=(lo, hi),
            window_kind=window,
        )

    @cached_property
    def idle(self) -> IdleReport:
        return self.idle_report("steps")

    @cached_property
    def device_gaps(self) -> Gaps:
        """Every device-wide GPU gap inside the analysed steps."""
        rows, (lo, hi) = self.idle_rows("steps")
        return device_gaps(self.trace, rows, self.launch_ts, lo, hi)

    # --- memory ----------------------------------------------------------------------

    @cached_property
    def memory_peaks(self) -> list[MemoryPeak]:
        mem = self.trace.memory
        out: list[MemoryPeak] = []
        cuda = mem.device_type == _CUDA_DEVICE_TYPE
        for dev in np.unique(mem.device_id[cuda]).tolist():
            m = cuda & (mem.device_id == dev)
            device = self.trace.device(int(dev))
            capacity = (
                device.memory_bytes if device is not None and device.memory_bytes > 0 else None
            )
            reserved, allocated = mem.total_reserved[m], mem.total_allocated[m]
            if np.isfinite(reserved).any():
                peak, measure = float(np.nanmax(reserved)), "reserved"
            elif np.isfinite(allocated).any():
                peak, measure = float(np.nanmax(allocated)), "allocated"
            else:
                # only deltas recorded: what was allocated before the trace is unknown,
                # so this is a lower bound of the true peak
                order = np.argsort(mem.ts[m], kind="stable")
                level = np.cumsum(mem.nbytes[m][order])
                peak = float(level.max() - min(0, level.min()))
                measure = "allocated since the trace began"
            out.append(MemoryPeak(int(dev), peak, capacity, measure))
        return out
