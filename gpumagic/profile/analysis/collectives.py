"""The collective calls of one rank: which collective each was, how big, in which group,
and at what bandwidth.

A collective *call* is one backend span (``nccl:all_reduce``, ``gloo:all_reduce``); its
kernels are found through their launch (the ``cudaLaunchKernel`` nests inside the span),
its size and group in the ``record_param_comms`` span around it (torch >= 2.1 records
``Collective name``, ``In msg nelems``, ``Out msg nelems``, ``dtype``, ``Group size``), or
else in the recorded input shapes. A ``record_param_comms`` span with no backend span
inside is a call of its own (a writer that records only those), and a communication kernel
no call launched is one too, named from the kernel (``ncclKernel_AllReduce_*``).
Bandwidths are nccl-tests' (doc/PERFORMANCE.md): ``algbw = S / t`` with ``S`` the whole
buffer (the gathered output of an all-gather, the scattered input of a reduce-scatter), and
``busbw = algbw * factor(n)``.

How much of a step this communication takes, and how much computation hides, is
:mod:`gpumagic.profile.analysis.comms`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from gpumagic.profile.analysis import tree
from gpumagic.profile.trace.model import HostEvents, Trace

if TYPE_CHECKING:
    import pandas as pd

# the kernels NCCL and RCCL launch (RCCL keeps NCCL's names)
COMM_KERNEL = re.compile(r"^(?:void\s+)?(?:nccl|rccl)\w*Kernel")
# record_function spans the process-group backends open around each collective
BACKEND_SPAN = re.compile(r"^(nccl|rccl|xccl|gloo|mpi|ucc):\s*(\S.*)$")
CPU_BACKENDS = frozenset({"gloo", "mpi", "ucc"})
PARAM_COMMS = "record_param_comms"

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


def find_calls(
    trace: Trace,
    host_par: np.ndarray,
    launch_op: np.ndarray,
    comm_kernels: np.ndarray,
    backend_spans: np.ndarray,
) -> Calls:
    """Every collective call of ``trace``, in time order.

    ``host_par`` is each host event's parent (:func:`gpumagic.profile.analysis.tree.parents`),
    ``launch_op`` each GPU event's launching operator, ``comm_kernels`` and ``backend_spans``
    the masks of communication kernels and of ``<backend>:<collective>`` host spans.
    """
    host = trace.host
    params = _ParamComms.of(host)
    call_rows = _call_rows(host_par, backend_spans, params)
    kern = np.flatnonzero(comm_kernels)
    owner = _launching_call(host_par, launch_op[kern], call_rows)
    rocm = any(v.startswith("hip") for v in trace.runtime.name.values)
    group = default_group_size(trace)
    spans = _span_calls(trace, host_par, call_rows, params, kern, owner, rocm, group)
    # kernels no call launched (no link to a launch, or no backend span): one call each
    orphans = _kernel_calls(trace, kern[owner < 0], rocm, group)
    return _in_time_order(spans, orphans)


def default_group_size(trace: Trace) -> float:
    """The group size of a call that recorded none: the only process group's, else 1 on a
    one-rank job (NaN: unknown)."""
    sizes = set(trace.group_sizes)
    if len(sizes) == 1:
        return float(sizes.pop())
    if trace.world_size == 1:
        return 1.0
    return math.nan


@dataclass
class _ParamComms:
    """The ``record_param_comms`` spans of a trace and what each recorded."""

    mask: np.ndarray  # over host events
    args: dict[int, _CommArgs]  # by host row

    @classmethod
    def of(cls, host: HostEvents) -> _ParamComms:
        mask = host.name.mask(lambda n: n == PARAM_COMMS)
        rows = np.flatnonzero(mask)
        return cls(mask, dict(zip(rows.tolist(), _decode_comm_args([host.args[i] for i in rows]))))


def _call_rows(host_par: np.ndarray, backend_spans: np.ndarray, params: _ParamComms) -> np.ndarray:
    """Host rows that are calls: the backend spans, and the ``record_param_comms`` spans
    with no backend span inside (a writer that records only them), except DDP's waits."""
    roots = np.flatnonzero(backend_spans)
    holds_span = tree.ancestors_of(host_par, roots) if len(roots) else np.zeros(len(host_par), bool)
    lone = [
        i
        for i, args in params.args.items()
        if not holds_span[i]
        and canonical_name(args.collective or "?") != "wait"
        and args.collective
    ]
    return np.array(sorted(set(roots.tolist()) | set(lone)), np.int64)


def _launching_call(host_par: np.ndarray, op: np.ndarray, call_rows: np.ndarray) -> np.ndarray:
    """For each kernel launched from host operator ``op``, the position in ``call_rows`` of
    the call it ran inside (-1: none)."""
    is_call = np.zeros(len(host_par), bool)
    is_call[call_rows] = True
    row = np.full(len(op), -1, np.int64)
    has_op = op >= 0
    row[has_op] = tree.nearest_flagged(host_par, is_call, op[has_op])
    return np.where(row >= 0, np.searchsorted(call_rows, row), -1)


def _span_calls(
    trace: Trace,
    host_par: np.ndarray,
    call_rows: np.ndarray,
    params: _ParamComms,
    kern: np.ndarray,
    owner: np.ndarray,
    rocm: bool,
    default_group: float,
) -> Calls:
    """The calls at ``call_rows``: timed by the kernels each launched (``owner``), else by
    their span; sized and grouped from the ``record_param_comms`` span at or around them."""
    host, gpu = trace.host, trace.gpu
    n = len(call_rows)
    device_us = np.zeros(n)
    k_start = np.full(n, np.inf)
    k_end = np.full(n, -np.inf)
    mine = owner >= 0
    which, rows = owner[mine], kern[mine]
    np.add.at(device_us, which, (gpu.end - gpu.ts)[rows])
    np.minimum.at(k_start, which, gpu.ts[rows])
    np.maximum.at(k_end, which, gpu.end[rows])

    rpc_of = tree.nearest_flagged(host_par, params.mask, call_rows) if n else np.zeros(0, np.int64)
    own_args = _decode_comm_args([host.args[i] for i in call_rows.tolist()])
    names, backends, nbytes, group = [], [], np.full(n, np.nan), np.full(n, np.nan)
    for j, row in enumerate(call_rows.tolist()):
        raw = host.name.at(row)
        m = BACKEND_SPAN.match(raw)
        backends.append(m.group(1) if m else ("rccl" if rocm else "nccl"))
        rpc = params.args.get(int(rpc_of[j])) if rpc_of[j] >= 0 else None
        # record_param_comms names the collective where it recorded one (a lone one
        # always has); else the backend span's own name
        name = canonical_name(raw)
        if rpc is not None and rpc.collective and canonical_name(rpc.collective) != "wait":
            name = canonical_name(rpc.collective)
        names.append(name)
        size = _message_bytes(rpc) if rpc is not None else math.nan
        nbytes[j] = _message_bytes(own_args[j]) if math.isnan(size) else size
        group[j] = (
            float(rpc.group_size) if rpc is not None and rpc.group_size > 0 else default_group
        )
    return Calls(
        name=names,
        backend=backends,
        start=np.where(np.isfinite(k_start), k_start, host.ts[call_rows]),
        end=np.where(np.isfinite(k_end), k_end, host.end[call_rows]),
        device_us=device_us,
        host_us=(host.end - host.ts)[call_rows].astype(float),
        nbytes=nbytes,
        group_size=group,
    )


def _kernel_calls(trace: Trace, kern: np.ndarray, rocm: bool, default_group: float) -> Calls:
    """One call per kernel in ``kern``, named from the kernel."""
    gpu, n = trace.gpu, len(kern)
    return Calls(
        name=[kernel_collective(gpu.name.at(int(g))) for g in kern.tolist()],
        backend=["rccl" if rocm else "nccl"] * n,
        start=gpu.ts[kern],
        end=gpu.end[kern],
        device_us=(gpu.end - gpu.ts)[kern],
        host_us=np.zeros(n),
        nbytes=np.full(n, np.nan),
        group_size=np.full(n, default_group),
    )


def _in_time_order(*parts: Calls) -> Calls:
    start = np.concatenate([p.start for p in parts])
    order = np.argsort(start, kind="stable")
    names = [x for p in parts for x in p.name]
    backends = [x for p in parts for x in p.backend]

    def column(attr: str) -> np.ndarray:
        return np.concatenate([getattr(p, attr) for p in parts])[order]

    return Calls(
        name=[names[i] for i in order.tolist()],
        backend=[backends[i] for i in order.tolist()],
        start=start[order].astype(float),
        end=column("end").astype(float),
        device_us=column("device_us"),
        host_us=column("host_us"),
        nbytes=column("nbytes"),
        group_size=column("group_size"),
    )


def collectives_frame(c: Calls, rank: int) -> pd.DataFrame:
    """The calls grouped by collective, backend and group size (see COLLECTIVE_COLUMNS)."""
    import pandas as pd

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
