"""Communication on multi-GPU runs: how much of a step is collectives, and how much of that
compute hides.

Which events are communication:

* on the device, the kernels NCCL and RCCL launch, found by name: ``ncclKernel_*``
  (NCCL before 2.19), ``ncclDevKernel_*``, ``ncclSymDevKernel_*``; RCCL keeps NCCL's names.
  By name, as Holistic Trace Analysis does: the TensorBoard plugin linked kernels to the
  ``nccl:*`` CPU op through the External id, and on Kineto traces whose NCCL launches carry
  External id = correlation id (all the shared ones) that finds none;
* on the host, only where a CPU backend does the work (gloo, MPI, UCC): its ``gloo:*``
  spans on the backend's threads, the ``c10d::*`` ops that enqueue them and
  ``record_param_comms`` spans (DDP's ``wait`` among them). With NCCL the host side only
  enqueues kernels, and the time that counts is the kernels'.

Overlap is HTA's ``get_comm_comp_overlap``: per rank, over the whole trace, the time
communication kernels run while some computation kernel runs, over the time
communication kernels run (each set merged first). Computation kernels are HTA's: not
communication, not memory (``Memcpy``/``Memset``), not ``*Sync``. On a CPU backend the
computation is the host's operators, less the time each thread spends inside a collective.

The per-step split is the TensorBoard plugin's Distributed View: in each step, time with
only computation, with both, with only communication, and with neither.

Which collectives ran, how big and at what bandwidth (the calls) is
:mod:`gpumagic.profile.analysis.collectives`.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from gpumagic.profile.analysis import intervals, tree
from gpumagic.profile.analysis.collectives import (
    BACKEND_SPAN,
    CPU_BACKENDS,
    PARAM_COMMS,
    Calls,
    collectives_frame,
    find_calls,
    is_comm_kernel,
)
from gpumagic.profile.analysis.steps import Steps
from gpumagic.profile.trace.model import KERNEL, MEMCPY, MEMSET, Trace

if TYPE_CHECKING:
    import pandas as pd


class AnalysisView(Protocol):
    """What this module reads of :class:`gpumagic.profile.analysis.trace_analysis.Analysis` (which builds
    a :class:`Communication` for itself; a Protocol keeps the import one way)."""

    trace: Trace

    @property
    def parents(self) -> tuple[np.ndarray, np.ndarray]: ...
    @property
    def launch_runtime(self) -> np.ndarray: ...
    @property
    def launch_op(self) -> np.ndarray: ...
    @property
    def is_step_mark(self) -> np.ndarray: ...
    @property
    def is_dataloader(self) -> np.ndarray: ...
    @property
    def steps(self) -> Steps: ...
    def idle_rows(self, window: str = "steps") -> tuple[np.ndarray, tuple[float, float]]: ...


# HTA's is_compute_kernel: not NCCL, not a copy or set, not a synchronisation
_NOT_COMPUTE = re.compile(r"^nccl.*Kernel|.*Memcpy|^Memset|.*Sync")
_C10D_OP = re.compile(r"^_?c10d(?:_functional)?::")

OVERLAP_COLUMNS = [
    "rank",
    "step",
    "step_us",
    "computation_only_us",
    "overlap_us",
    "communication_only_us",
    "other_us",
]


def is_compute_kernel(name: str) -> bool:
    """HTA's computation kernel (``hta.utils.utils.is_compute_kernel``), less RCCL names."""
    return _NOT_COMPUTE.match(name) is None and not is_comm_kernel(name)


class Communication:
    """The communication side of one rank's analysis (see the module docstring)."""

    def __init__(self, analysis: AnalysisView) -> None:
        self.a = analysis
        self.trace = analysis.trace

    # --- which events -------------------------------------------------------------------

    @cached_property
    def kernels(self) -> np.ndarray:
        """Mask over GPU events: communication kernels."""
        gpu = self.trace.gpu
        return (gpu.kind == KERNEL) & gpu.name.mask(is_comm_kernel)

    @cached_property
    def compute_kernels(self) -> np.ndarray:
        """Mask over GPU events: HTA's computation kernels."""
        gpu = self.trace.gpu
        return (gpu.kind == KERNEL) & gpu.name.mask(is_compute_kernel)

    @cached_property
    def backend_spans(self) -> np.ndarray:
        """Mask over host events: ``<backend>:<collective>`` spans, any backend."""
        return self.trace.host.name.mask(lambda n: BACKEND_SPAN.match(n) is not None)

    @cached_property
    def cpu_backend(self) -> bool:
        """Some collective ran on a CPU backend (gloo, MPI, UCC)."""
        return bool(
            self.trace.host.name.mask(
                lambda n: (m := BACKEND_SPAN.match(n)) is not None and m.group(1) in CPU_BACKENDS
            ).any()
        )

    @cached_property
    def host(self) -> np.ndarray:
        """Mask over host events whose time is communication (a CPU backend's collectives)."""
        host = self.trace.host
        if not self.cpu_backend or len(host.ts) == 0:
            return np.zeros(len(host.ts), bool)
        names = host.name
        spans = names.mask(
            lambda n: (m := BACKEND_SPAN.match(n)) is not None and m.group(1) in CPU_BACKENDS
        )
        ops = names.mask(lambda n: _C10D_OP.match(n) is not None or n == PARAM_COMMS)
        device_spans = self.backend_spans & ~spans
        if device_spans.any():
            # a run with gloo and NCCL groups: the c10d ops around NCCL spans only enqueue
            ops &= ~tree.ancestors_of(self.a.parents[0], np.flatnonzero(device_spans))
        return spans | ops

    @property
    def present(self) -> bool:
        return bool(self.kernels.any() or self.host.any())

    @cached_property
    def intervals(self) -> tuple[np.ndarray, np.ndarray]:
        """All communication, merged: communication kernels and CPU-backend spans."""
        gpu, host = self.trace.gpu, self.trace.host
        return intervals.merge(
            np.concatenate([gpu.ts[self.kernels], host.ts[self.host]]).astype(float),
            np.concatenate([gpu.end[self.kernels], host.end[self.host]]).astype(float),
        )

    @cached_property
    def computation(self) -> tuple[np.ndarray, np.ndarray]:
        """Computation, merged: HTA's computation kernels; on a run without kernels, the
        host's operators outside collectives (per thread: a thread inside a collective
        computes nothing)."""
        gpu = self.trace.gpu
        if self.compute_kernels.any():
            m = self.compute_kernels
            return intervals.merge(gpu.ts[m], gpu.end[m])
        return self._host_computation(np.ones(len(self.trace.host.ts), bool))

    def _host_computation(self, window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        host, a = self.trace.host, self.a
        ops = ~a.is_step_mark & ~a.is_dataloader & ~self.host & window
        comm = self.host & window
        parts_s, parts_e = [], []
        for t in np.unique(host.thread[ops]).tolist():
            on = host.thread == t
            s, e = intervals.merge(host.ts[ops & on], host.end[ops & on])
            if (comm & on).any():
                s, e = intervals.subtract(
                    (s, e), intervals.merge(host.ts[comm & on], host.end[comm & on])
                )
            parts_s.append(s)
            parts_e.append(e)
        if not parts_s:
            return np.zeros(0), np.zeros(0)
        return intervals.merge(np.concatenate(parts_s), np.concatenate(parts_e))

    # --- overlap ------------------------------------------------------------------------

    @cached_property
    def overlap_percent(self) -> float | None:
        """Communication overlapped by computation / communication, as HTA computes it:
        over the GPU events launched before the last ProfilerStep began (HTA leaves the
        last step out as possibly incomplete), host spans likewise."""
        if not self.present:
            return None
        a, trace = self.a, self.trace
        gpu, host = trace.gpu, trace.host
        in_window = np.zeros(len(gpu.ts), bool)
        in_window[a.idle_rows("hta")[0]] = True
        host_window = np.ones(len(host.ts), bool)
        marks = np.flatnonzero(a.is_step_mark)
        if len({host.name.at(int(i)) for i in marks}) >= 2:
            host_window = host.ts < float(host.ts[marks].max())
        kern = self.kernels & in_window
        comm = intervals.merge(
            np.concatenate([gpu.ts[kern], host.ts[self.host & host_window]]).astype(float),
            np.concatenate([gpu.end[kern], host.end[self.host & host_window]]).astype(float),
        )
        total = float((comm[1] - comm[0]).sum())
        if total <= 0:
            return None
        if self.compute_kernels.any():
            m = self.compute_kernels & in_window
            comp = intervals.merge(gpu.ts[m], gpu.end[m])
        else:
            comp = self._host_computation(host_window)
        both = intervals.intersect(comm, comp)
        return 100.0 * float((both[1] - both[0]).sum()) / total

    def step_split(self, steps: Steps) -> np.ndarray:
        """Per step: computation only, overlap, communication only, other (µs; columns in
        that order, rows summing to the step). The TensorBoard plugin's Distributed View."""
        k = len(steps)
        if k == 0:
            return np.zeros((0, 4))
        lo, hi = steps.start.astype(float), steps.end.astype(float)
        comp_s, comp_e = self.computation
        comm_s, comm_e = self.intervals
        both_s, both_e = intervals.intersect((comp_s, comp_e), (comm_s, comm_e))
        comp = intervals.length_in(comp_s, comp_e, lo, hi)
        comm = intervals.length_in(comm_s, comm_e, lo, hi)
        both = intervals.length_in(both_s, both_e, lo, hi)
        other = (hi - lo) - comp - comm + both
        return np.column_stack([comp - both, both, comm - both, np.maximum(other, 0.0)])

    def busy_percent(self, steps: Steps) -> float | None:
        """Share of the steps' span in which communication ran, overlapped or not."""
        if not self.present or len(steps) == 0:
            return None
        lo, hi = steps.span
        if hi <= lo:
            return None
        s, e = intervals.clip(*self.intervals, lo, hi)
        return 100.0 * float((e - s).sum()) / (hi - lo)

    # --- the calls ----------------------------------------------------------------------

    @cached_property
    def calls(self) -> Calls:
        """Every collective call, in time order (see :mod:`gpumagic.profile.analysis.collectives`)."""
        a = self.a
        return find_calls(a.trace, a.parents[0], a.launch_op, self.kernels, self.backend_spans)

    def calls_in_steps(self, steps: Steps) -> np.ndarray:
        """Indexes of the calls that began inside the analysed steps."""
        c = self.calls
        if len(steps) == 0 or len(c) == 0:
            return np.zeros(0, np.int64)
        lo, hi = steps.span
        return np.flatnonzero((c.start >= lo) & (c.start < hi))

    def collectives_frame(self, rank: int) -> pd.DataFrame:
        """The calls grouped by collective, backend and group size (see COLLECTIVE_COLUMNS)."""
        return collectives_frame(self.calls, rank)

    def overlap_frame(self, rank: int, steps: Steps) -> pd.DataFrame:
        import pandas as pd

        split = self.step_split(steps)
        return pd.DataFrame(
            {
                "rank": rank,
                "step": list(steps.names),
                "step_us": steps.duration.astype(float),
                "computation_only_us": split[:, 0],
                "overlap_us": split[:, 1],
                "communication_only_us": split[:, 2],
                "other_us": split[:, 3],
            },
            columns=OVERLAP_COLUMNS,
        )

    # --- evidence for the rules -----------------------------------------------------------

    @cached_property
    def copies_in_collectives(self) -> np.ndarray:
        """Mask over GPU events: copies and sets launched from inside a CPU backend's
        collective (gloo stages CUDA tensors through host memory)."""
        gpu = self.trace.gpu
        out = np.zeros(len(gpu.ts), bool)
        if not self.host.any():
            return out
        copies = np.flatnonzero(np.isin(gpu.kind, (MEMCPY, MEMSET)) & (self.a.launch_runtime >= 0))
        if len(copies) == 0:
            return out
        op = self.a.launch_op[copies]
        ok = op >= 0
        inside = np.zeros(len(copies), bool)
        inside[ok] = tree.nearest_flagged(self.a.parents[0], self.host, op[ok]) >= 0
        out[copies[inside]] = True
        return out


def collective_waits(analyses: list[Any]) -> list[float | None]:
    """Per rank, µs per step spent waiting in collectives for the other ranks.

    As the TensorBoard plugin's Distributed View does: the i-th call of a collective runs
    on every rank; the shortest of its durations is the transfer, and each rank's excess
    over it is time spent waiting for the others. Calls are matched per collective name in
    time order, inside each rank's steps; a name whose call count differs between ranks is
    left out. ``None`` for a rank when nothing could be matched (or with one rank).
    """
    if len(analyses) < 2:
        return [None] * len(analyses)
    return waits_from_durations(
        [collective_durations(a) for a in analyses], [len(a.steps) for a in analyses]
    )


def collective_durations(analysis: Any) -> dict[str, np.ndarray]:
    """One rank's part of :func:`collective_waits`: the µs of each collective call that began
    inside its steps, by collective name, in time order. Small enough to send back from a
    worker that analysed the rank (see :mod:`gpumagic.profile.ranks`)."""
    c = analysis.comms.calls
    rows = analysis.comms.calls_in_steps(analysis.steps)
    us = c.us
    by_name: dict[str, list[float]] = {}
    for i in rows.tolist():
        by_name.setdefault(c.name[i], []).append(float(us[i]))
    return {k: np.array(v) for k, v in by_name.items()}


def waits_from_durations(
    per_rank: list[dict[str, np.ndarray]], steps: list[int]
) -> list[float | None]:
    """:func:`collective_waits` from each rank's :func:`collective_durations` and step count."""
    if len(per_rank) < 2:
        return [None] * len(per_rank)
    common = set(per_rank[0])
    for d in per_rank[1:]:
        common &= set(d)
    matched = [n for n in sorted(common) if len({len(d[n]) for d in per_rank}) == 1]
    if not matched:
        return [None] * len(per_rank)
    # the shortest duration of each call over the ranks, once per name (not once per rank:
    # with hundreds of ranks that would be quadratic)
    shortest = {n: np.min(np.stack([x[n] for x in per_rank]), axis=0) for n in matched}
    out: list[float | None] = []
    for d, n_steps in zip(per_rank, steps):
        wait = sum(float((d[n] - shortest[n]).sum()) for n in matched)
        out.append(wait / max(n_steps, 1))
    return out
