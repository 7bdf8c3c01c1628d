"""Communication on multi-GPU runs: how much of a step is collectives, how much of that
compute hides, and which collectives ran, how big, at what bandwidth.

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

A collective *call* is one backend span (``nccl:all_reduce``, ``gloo:all_reduce``); its
kernels are found through their launch (the ``cudaLaunchKernel`` nests inside the span),
its size and group in the ``record_param_comms`` span around it (torch >= 2.1 records
``Collective name``, ``In msg nelems``, ``Out msg nelems``, ``dtype``, ``Group size``), or
else in the recorded input shapes. Bandwidths are nccl-tests' (doc/PERFORMANCE.md):
``algbw = S / t`` with ``S`` the whole buffer (the gathered output of an all-gather, the
scattered input of a reduce-scatter), and ``busbw = algbw * factor(n)``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import numpy as np

from gpumagic.profile.analysis import intervals
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
    def is_step_mark(self) -> np.ndarray: ...
    @property
    def is_dataloader(self) -> np.ndarray: ...
    @property
    def steps(self) -> Steps: ...
    def idle_rows(self, window: str = "steps") -> tuple[np.ndarray, tuple[float, float]]: ...


COMM_KERNEL = re.compile(r"^(?:void\s+)?(?:nccl|rccl)\w*Kernel")
# HTA's is_compute_kernel: not NCCL, not a copy or set, not a synchronisation
_NOT_COMPUTE = re.compile(r"^nccl.*Kernel|.*Memcpy|^Memset|.*Sync")
# record_function spans the process-group backends open around each collective
BACKEND_SPAN = re.compile(r"^(nccl|rccl|xccl|gloo|mpi|ucc):\s*(\S.*)$")
CPU_BACKENDS = frozenset({"gloo", "mpi", "ucc"})
_C10D_OP = re.compile(r"^_?c10d(?:_functional)?::")
_PARAM_COMMS = "record_param_comms"

COLLECTIVE_COLUMNS = [
    "rank",
    "name",
    "backend",
    "calls",
    "device_us",
    "host_us",
    "bytes",
    "bytes_per_call",
    "group_size",
    "algbw_gbps",
    "busbw_gbps",
]
OVERLAP_COLUMNS = [
    "rank",
    "step",
    "step_us",
    "computation_only_us",
    "overlap_us",
    "communication_only_us",
    "other_us",
]

# canonical collective names, keyed by the name with "_" removed and lower-cased
_CANONICAL = {
    "allreduce": "all_reduce",
    "allreducecoalesced": "all_reduce",
    "allgather": "all_gather",
    "allgatherbase": "all_gather",
    "allgatherintotensor": "all_gather",
    "allgatherintotensorcoalesced": "all_gather",
    "allgathercoalesced": "all_gather",
    "reducescatter": "reduce_scatter",
    "reducescatterbase": "reduce_scatter",
    "reducescattertensor": "reduce_scatter",
    "reducescattertensorcoalesced": "reduce_scatter",
    "alltoall": "all_to_all",
    "alltoallbase": "all_to_all",
    "alltoallsingle": "all_to_all",
    "alltoallv": "all_to_all",
    "broadcast": "broadcast",
    "broadcastcoalesced": "broadcast",
    "reduce": "reduce",
    "barrier": "barrier",
    "monitoredbarrier": "barrier",
    "send": "send",
    "recv": "recv",
    "recvanysource": "recv",
    "sendrecv": "send/recv",
    "gather": "gather",
    "scatter": "scatter",
    "wait": "wait",
    "waittensor": "wait",
}

# nccl-tests' bus-bandwidth correction per collective, for n ranks
_BUS_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
    "send/recv": lambda n: 1.0,
}

_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "double": 8,
    "float64": 8,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "long": 8,
    "long int": 8,
    "int64": 8,
    "int64_t": 8,
    "int": 4,
    "int32": 4,
    "short": 2,
    "int16": 2,
    "char": 1,
    "signed char": 1,
    "unsigned char": 1,
    "byte": 1,
    "uint8": 1,
    "int8": 1,
    "bool": 1,
    "complexfloat": 8,
    "complex<float>": 8,
    "complexdouble": 16,
    "complex<double>": 16,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
}


def is_comm_kernel(name: str) -> bool:
    return COMM_KERNEL.match(name) is not None


def is_compute_kernel(name: str) -> bool:
    """HTA's computation kernel (``hta.utils.utils.is_compute_kernel``), less RCCL names."""
    return _NOT_COMPUTE.match(name) is None and not is_comm_kernel(name)


def canonical_name(raw: str) -> str:
    """``nccl:_all_gather_base`` / ``c10d::allreduce_`` / ``allreduce`` -> ``all_gather`` /
    ``all_reduce``; ``nccl:send 0->1`` -> ``send``; unknown names come back lower-cased."""
    s = raw
    if "::" in s:
        s = s.rsplit("::", 1)[1]
    m = BACKEND_SPAN.match(s)
    if m:
        s = m.group(2)
    s = s.strip().split(" ")[0].strip("_").lower()
    return _CANONICAL.get(s.replace("_", ""), s)


def kernel_collective(name: str) -> str:
    """The collective a kernel's name says: ``ncclKernel_AllReduce_RING_LL_Sum_float`` ->
    ``all_reduce``; NCCL runs all-to-all as grouped send/recv (``SendRecv``)."""
    m = re.match(r"^(?:void\s+)?(?:nccl|rccl)\w*?Kernel_([A-Za-z]+)", name)
    if not m:
        return "unknown"
    token = m.group(1)
    return _CANONICAL.get(token.lower(), token.lower())


def bus_factor(name: str, group_size: float) -> float:
    """nccl-tests' busbw / algbw for ``name`` on ``group_size`` ranks (NaN if unknown)."""
    f = _BUS_FACTOR.get(name)
    if f is None or not math.isfinite(group_size) or group_size < 1:
        return math.nan
    return float(f(group_size))


def dtype_bytes(dtype: str) -> int | None:
    key = dtype.strip().lower()
    key = key.removeprefix("c10::").removeprefix("torch.")
    return _DTYPE_BYTES.get(key)


class _CommArgs(msgspec.Struct, gc=False):
    collective: str = msgspec.field(default="", name="Collective name")
    dtype: str = ""
    in_nelems: int = msgspec.field(default=-1, name="In msg nelems")
    out_nelems: int = msgspec.field(default=-1, name="Out msg nelems")
    group_size: int = msgspec.field(default=-1, name="Group size")
    input_dims: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw, name="Input type")


_COMM_ARGS = msgspec.json.Decoder(list[_CommArgs])


def _decode_comm_args(raws: list[msgspec.Raw]) -> list[_CommArgs]:
    if not raws:
        return []
    payload = b"[" + b",".join(bytes(r) if len(r) else b"{}" for r in raws) + b"]"
    try:
        return _COMM_ARGS.decode(payload)
    except msgspec.ValidationError:
        # a writer that put "N/A" where a number goes: keep what fits, per event
        out = []
        for item in msgspec.json.decode(payload):
            try:
                out.append(msgspec.convert(item, _CommArgs))
            except msgspec.ValidationError:
                out.append(_CommArgs())
        return out


def _message_bytes(args: _CommArgs) -> float:
    """S as nccl-tests counts it, from record_param_comms counts or the recorded inputs."""
    size = dtype_bytes(args.dtype) if args.dtype else None
    if size is not None and max(args.in_nelems, args.out_nelems) >= 0:
        return float(max(args.in_nelems, args.out_nelems) * size)
    if not len(args.input_dims) or not len(args.input_type):
        return math.nan
    try:
        dims = msgspec.json.decode(args.input_dims)
        types = msgspec.json.decode(args.input_type)
    except msgspec.DecodeError:
        return math.nan
    best = math.nan
    for shape, kind in zip(dims if isinstance(dims, list) else [], types or []):
        size = dtype_bytes(kind) if isinstance(kind, str) else None
        if size is None or not isinstance(shape, list) or not shape:
            continue
        if not all(isinstance(d, int) for d in shape):
            continue
        n = float(np.prod(shape, dtype=np.float64)) * size
        best = n if math.isnan(best) else max(best, n)
    return best


def _nearest(parent: np.ndarray, flag: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For each of ``rows``, itself if flagged, else its nearest flagged ancestor (-1: none)."""
    out = np.full(len(rows), -1, np.int64)
    cur = rows.astype(np.int64).copy()
    pending = np.arange(len(rows))
    while len(pending):
        c = cur[pending]
        live = c >= 0
        pending, c = pending[live], c[live]
        hit = flag[c]
        out[pending[hit]] = c[hit]
        pending = pending[~hit]
        cur[pending] = parent[c[~hit]]
    return out


def _ancestors_of(parent: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Mask of the strict ancestors of ``rows``."""
    out = np.zeros(len(parent), bool)
    cur = parent[rows]
    while len(cur):
        cur = cur[cur >= 0]
        cur = cur[~out[cur]]  # an ancestor already marked has its own marked above it
        out[cur] = True
        cur = parent[cur]
    return out


def _intersect(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """The intersection of two sets of intervals, as disjoint sorted intervals."""
    (s1, e1), (s2, e2) = a, b
    if len(s1) == 0 or len(s2) == 0:
        return np.zeros(0), np.zeros(0)
    points = np.unique(np.concatenate([s1, e1, s2, e2]))
    both = intervals.covered(points, s1, e1) & intervals.covered(points, s2, e2)
    return intervals.merge(points[:-1][both], points[1:][both])


def _subtract(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """``a`` less ``b``, as disjoint sorted intervals."""
    (s1, e1), (s2, e2) = a, b
    if len(s1) == 0 or len(s2) == 0:
        return intervals.merge(s1, e1)
    points = np.unique(np.concatenate([s1, e1, s2, e2]))
    keep = intervals.covered(points, s1, e1) & ~intervals.covered(points, s2, e2)
    return intervals.merge(points[:-1][keep], points[1:][keep])


def _length_in(s: np.ndarray, e: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Covered length of the intervals inside each window ``[lo[i], hi[i]]``."""
    if len(s) == 0:
        return np.zeros(len(lo))
    return intervals.cumulative(s, e, hi) - intervals.cumulative(s, e, lo)


@dataclass
class Calls:
    """One row per collective call, in time order (all times in µs on the trace's clock)."""

    name: list[str]
    backend: list[str]
    start: np.ndarray
    end: np.ndarray
    device_us: np.ndarray  # time its kernels ran (0 on a CPU backend)
    host_us: np.ndarray  # its backend span (the collective itself on a CPU backend)
    nbytes: np.ndarray  # S as nccl-tests counts it; NaN when not recorded
    group_size: np.ndarray  # ranks in its process group; NaN when not recorded

    def __len__(self) -> int:
        return len(self.name)

    @property
    def on_device(self) -> np.ndarray:
        return np.array([b not in CPU_BACKENDS for b in self.backend], bool)

    @property
    def us(self) -> np.ndarray:
        """The call's time where it runs: its kernels, or the CPU backend's span."""
        return np.where(self.on_device, self.device_us, self.host_us)


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
        ops = names.mask(lambda n: _C10D_OP.match(n) is not None or n == _PARAM_COMMS)
        device_spans = self.backend_spans & ~spans
        if device_spans.any():
            # a run with gloo and NCCL groups: the c10d ops around NCCL spans only enqueue
            ops &= ~_ancestors_of(self.a.parents[0], np.flatnonzero(device_spans))
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
                s, e = _subtract((s, e), intervals.merge(host.ts[comm & on], host.end[comm & on]))
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
        both = _intersect(comm, comp)
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
        both_s, both_e = _intersect((comp_s, comp_e), (comm_s, comm_e))
        comp = _length_in(comp_s, comp_e, lo, hi)
        comm = _length_in(comm_s, comm_e, lo, hi)
        both = _length_in(both_s, both_e, lo, hi)
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

    def _default_group_size(self) -> float:
        sizes = set(self.trace.group_sizes)
        if len(sizes) == 1:
            return float(sizes.pop())
        if self.trace.world_size == 1:
            return 1.0
        return math.nan

    @cached_property
    def calls(self) -> Calls:
        trace, a = self.trace, self.a
        host, gpu, rt = trace.host, trace.gpu, trace.runtime
        host_par, rt_par = a.parents
        names = host.name
        is_rpc = names.mask(lambda n: n == _PARAM_COMMS)
        roots = np.flatnonzero(self.backend_spans)
        rpc_rows = np.flatnonzero(is_rpc)
        rpc_args = dict(zip(rpc_rows.tolist(), _decode_comm_args([host.args[i] for i in rpc_rows])))
        # record_param_comms spans with no backend span inside are calls of their own
        # (a writer that records only them), except DDP's waits
        holds_span = _ancestors_of(host_par, roots) if len(roots) else np.zeros(len(host.ts), bool)
        lone = [
            i
            for i in rpc_rows.tolist()
            if not holds_span[i]
            and canonical_name(rpc_args[i].collective or "?") != "wait"
            and rpc_args[i].collective
        ]
        call_rows = np.array(sorted(set(roots.tolist()) | set(lone)), np.int64)
        is_call = np.zeros(len(host.ts), bool)
        is_call[call_rows] = True
        index = {int(r): j for j, r in enumerate(call_rows.tolist())}

        # the communication kernels each call launched
        kern = np.flatnonzero(self.kernels)
        launch = a.launch_runtime[kern]
        op = np.where(launch >= 0, rt_par[np.maximum(launch, 0)], -1)
        owner = np.full(len(kern), -1, np.int64)
        has_op = op >= 0
        owner[has_op] = _nearest(host_par, is_call, op[has_op])
        n = len(call_rows)
        dur = gpu.end - gpu.ts
        device_us = np.zeros(n)
        k_start = np.full(n, np.inf)
        k_end = np.full(n, -np.inf)
        mine = owner >= 0
        which = np.array([index[int(o)] for o in owner[mine]], np.int64)
        np.add.at(device_us, which, dur[kern[mine]])
        np.minimum.at(k_start, which, gpu.ts[kern[mine]])
        np.maximum.at(k_end, which, gpu.end[kern[mine]])

        # size and group from the record_param_comms span at or around each call
        rpc_of = _nearest(host_par, is_rpc, call_rows) if n else np.zeros(0, np.int64)
        own_args = _decode_comm_args([host.args[i] for i in call_rows.tolist()])
        default_group = self._default_group_size()
        out_name, out_backend, nbytes, group = [], [], np.full(n, np.nan), np.full(n, np.nan)
        rocm = any(v.startswith("hip") for v in rt.name.values)
        for j, row in enumerate(call_rows.tolist()):
            raw = names.at(row)
            m = BACKEND_SPAN.match(raw)
            backend = m.group(1) if m else ("rccl" if rocm else "nccl")
            rpc = rpc_args.get(int(rpc_of[j])) if rpc_of[j] >= 0 else None
            # record_param_comms names the collective where it recorded one (a lone one
            # always has); else the backend span's own name
            name = canonical_name(raw)
            if rpc is not None and rpc.collective and canonical_name(rpc.collective) != "wait":
                name = canonical_name(rpc.collective)
            size = _message_bytes(rpc) if rpc is not None else math.nan
            if math.isnan(size):
                size = _message_bytes(own_args[j])
            nbytes[j] = size
            group[j] = (
                float(rpc.group_size) if rpc is not None and rpc.group_size > 0 else default_group
            )
            out_name.append(name)
            out_backend.append(backend)
        start = np.where(np.isfinite(k_start), k_start, host.ts[call_rows])
        end = np.where(np.isfinite(k_end), k_end, host.end[call_rows])
        host_us = (host.end - host.ts)[call_rows].astype(float)

        # kernels no call launched (no link to a launch, or no backend span): one call each
        orphans = kern[~mine]
        if len(orphans):
            backend = "rccl" if rocm else "nccl"
            out_name += [kernel_collective(gpu.name.at(int(g))) for g in orphans.tolist()]
            out_backend += [backend] * len(orphans)
            start = np.concatenate([start, gpu.ts[orphans]])
            end = np.concatenate([end, gpu.end[orphans]])
            device_us = np.concatenate([device_us, dur[orphans]])
            host_us = np.concatenate([host_us, np.zeros(len(orphans))])
            nbytes = np.concatenate([nbytes, np.full(len(orphans), np.nan)])
            group = np.concatenate([group, np.full(len(orphans), default_group)])
        order = np.argsort(start, kind="stable")
        return Calls(
            name=[out_name[i] for i in order.tolist()],
            backend=[out_backend[i] for i in order.tolist()],
            start=start[order].astype(float),
            end=end[order].astype(float),
            device_us=device_us[order],
            host_us=host_us[order],
            nbytes=nbytes[order],
            group_size=group[order],
        )

    def calls_in_steps(self, steps: Steps) -> np.ndarray:
        """Indexes of the calls that began inside the analysed steps."""
        c = self.calls
        if len(steps) == 0 or len(c) == 0:
            return np.zeros(0, np.int64)
        lo, hi = steps.span
        return np.flatnonzero((c.start >= lo) & (c.start < hi))

    def collectives_frame(self, rank: int) -> pd.DataFrame:
        """The calls grouped by collective, backend and group size (see COLLECTIVE_COLUMNS)."""
        import pandas as pd

        c = self.calls
        if len(c) == 0:
            return pd.DataFrame(
                {
                    col: pd.Series(dtype=object if col in ("name", "backend") else float)
                    for col in COLLECTIVE_COLUMNS
                }
            )
        us = c.us
        factor = np.array([bus_factor(nm, g) for nm, g in zip(c.name, c.group_size)])
        # Grouped with a dict and bincount, not DataFrame.groupby().agg: the pandas path cost
        # about 30 ms on a 2-rank trace's few hundred calls, more than the rest of the analysis.
        known = np.isfinite(c.nbytes)
        timed_ok = known & (us > 0)
        keys: dict[tuple[str, str, float | None], int] = {}
        codes = np.fromiter(
            (
                keys.setdefault((nm, be, None if math.isnan(gs) else float(gs)), len(keys))
                for nm, be, gs in zip(c.name, c.backend, c.group_size.astype(float).tolist())
            ),
            np.int64,
            len(c.name),
        )
        k = len(keys)

        def total(values: np.ndarray) -> np.ndarray:
            return np.bincount(codes, weights=values.astype(float), minlength=k)

        sized = total(known)
        names = [key[0] for key in keys]
        backends = [key[1] for key in keys]
        group = np.array([math.nan if key[2] is None else key[2] for key in keys], float)
        device_us, host_us = total(c.device_us), total(c.host_us)
        timed = total(np.where(timed_ok, us, 0.0))
        timed_bytes = total(np.where(timed_ok, c.nbytes, 0.0))
        bus_bytes = total(np.where(timed_ok & np.isfinite(factor), c.nbytes * factor, 0.0))
        nbytes = np.where(sized > 0, total(np.where(known, c.nbytes, 0.0)), math.nan)
        known_factor = np.array([not math.isnan(bus_factor(n, 2)) for n in names], bool)
        with np.errstate(invalid="ignore", divide="ignore"):
            # bytes per µs is MB/s; nccl-tests prints GB/s (1e9 bytes per second)
            algbw = np.where(timed > 0, timed_bytes / timed / 1e3, np.nan)
            busbw = np.where(
                (timed > 0) & known_factor & np.isfinite(group), bus_bytes / timed / 1e3, np.nan
            )
            per_call = np.where(sized > 0, nbytes / sized, np.nan)
        # a CPU backend's collectives are timed on the host, NCCL's on the device
        time_col = np.where([b in CPU_BACKENDS for b in backends], host_us, device_us)
        order = np.argsort(-time_col, kind="stable")
        columns = {
            "rank": np.full(k, rank),
            "name": [names[i] for i in order.tolist()],
            "backend": [backends[i] for i in order.tolist()],
            "calls": np.bincount(codes, minlength=k)[order],
            "device_us": device_us[order],
            "host_us": host_us[order],
            "bytes": nbytes[order],
            "bytes_per_call": per_call[order],
            "group_size": group[order],
            "algbw_gbps": algbw[order],
            "busbw_gbps": busbw[order],
        }
        return pd.DataFrame(columns, columns=COLLECTIVE_COLUMNS)

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
        _host_par, rt_par = self.a.parents
        copies = np.flatnonzero(np.isin(gpu.kind, (MEMCPY, MEMSET)) & (self.a.launch_runtime >= 0))
        if len(copies) == 0:
            return out
        op = rt_par[self.a.launch_runtime[copies]]
        ok = op >= 0
        inside = np.zeros(len(copies), bool)
        inside[ok] = _nearest(self.a.parents[0], self.host, op[ok]) >= 0
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
