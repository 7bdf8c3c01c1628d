"""The start-up phase of a trace without step marks: what the first iteration pays once.

A trace recorded without ``ProfilerStep`` marks (or DataLoader batches) is analysed as one
step. When it begins with the process's first CUDA work, that step holds costs no later
iteration repeats: creating the CUDA context (the first runtime call of the process blocks
for seconds: ``cudaFree``, ``cudaGetDeviceCount``, ``cudaDeviceGetStreamPriorityRange``),
loading kernel modules lazily (``CUDA_MODULE_LOADING=LAZY``, the default since CUDA 11.7:
the first launch of each kernel loads its module), allocating the caching allocator's first
blocks, creating cuBLAS/cuDNN handles and, with ``cudnn.benchmark``, autotuning (inside an
operator's first call). Counted in the step, they make a 40 s trace of 30 s start-up look
like a GPU idle 100% of the time.

Found here, from the trace alone:

* **runtime calls** that are known to carry start-up work (context, module loading,
  allocation, handle and stream creation) and last at least :data:`SLOW_CALL_US`, where most
  calls of the same name take far less (under CUPTI's counter replay every launch is slow:
  that is how the trace runs, not start-up);
* **first calls** of an operator lasting at least :data:`SLOW_CALL_US` and
  :data:`FIRST_CALL_RATIO` times the median of its later calls (a handle created, a cuDNN
  algorithm searched, a library loaded on first use).

The phase runs from the trace's start to the end of the last such event. Synchronising
calls are never start-up (their time is the GPU's work, waited for).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gpumagic.profile.trace.model import Trace
from gpumagic.units import fmt_us

# Start-up work takes tens of milliseconds to seconds; the same calls in a running loop
# take microseconds (a launch 5-10 µs, a cached allocation none at all).
SLOW_CALL_US = 50_000.0
FIRST_CALL_RATIO = 20.0

# What each runtime call does when it is slow at start-up (CUDA runtime and driver, HIP).
_KINDS = (
    (
        "CUDA context",
        re.compile(
            r"^(cuda|hip)(Free|GetDeviceCount|DeviceGetStreamPriorityRange|SetDevice|GetDevice"
            r"|GetDeviceProperties\w*|DeviceGetAttribute|Init|RuntimeGetVersion|DriverGetVersion)$"
            r"|^cu(Init|DevicePrimaryCtxRetain|CtxCreate\w*|DeviceGet\w*)$"
        ),
    ),
    (
        "module loading",
        re.compile(
            r"^(cuda|hip)(LaunchKernel\w*|FuncGetAttributes|FuncSetAttribute|ModuleLoad\w*"
            r"|GetFuncBySymbol|ExtModuleLaunchKernel|ModuleLaunchKernel)$"
            r"|^cu(LaunchKernel\w*|ModuleLoad\w*|ModuleGetFunction|LibraryLoad\w*|LibraryGetKernel"
            r"|KernelGetFunction|FuncGetAttribute|FuncSetAttribute|OccupancyMaxActiveBlocksPerMultiprocessor\w*)$"
        ),
    ),
    (
        "allocation",
        re.compile(r"^(cuda|hip)(Malloc\w*|HostAlloc|HostRegister|MallocHost)$|^cuMem(Alloc|Create)\w*$"),
    ),
    (
        "stream and event creation",
        re.compile(r"^(cuda|hip)(StreamCreate\w*|EventCreate\w*)$|^cu(StreamCreate|EventCreate)\w*$"),
    ),
)


@dataclass(frozen=True)
class StartupEvent:
    kind: str  # "CUDA context", "module loading", "allocation", ..., or "first call"
    name: str  # the runtime call or the operator
    ts: float
    dur: float


@dataclass(frozen=True)
class Startup:
    """The start-up phase: from ``start`` to ``end`` (µs, the trace's clock), and the events
    that place its end, longest first."""

    start: float
    end: float
    events: tuple[StartupEvent, ...]

    @property
    def us(self) -> float:
        return self.end - self.start

    def by_kind(self) -> dict[str, float]:
        """µs of the phase's events per kind (events may nest: a slow launch inside a slow
        first call counts in both)."""
        out: dict[str, float] = {}
        for e in self.events:
            out[e.kind] = out.get(e.kind, 0.0) + e.dur
        return out

    def describe(self, limit: int = 3) -> str:
        """``"CUDA context: cudaDeviceGetStreamPriorityRange 29.9 s; ..."``, longest first."""
        parts = [f"{e.kind}: {e.name} {fmt_us(e.dur)}" for e in self.events[:limit]]
        more = len(self.events) - limit
        return "; ".join(parts) + (f"; {more} more" if more > 0 else "")


def _runtime_kind(name: str) -> str | None:
    for kind, pattern in _KINDS:
        if pattern.match(name):
            return kind
    return None


def find_startup(trace: Trace) -> Startup | None:
    """The start-up phase of ``trace`` (None when it shows none)."""
    found: list[StartupEvent] = []
    rt = trace.runtime
    dur = rt.end - rt.ts
    usual: dict[int, bool] = {}  # per call name: slow calls of it are exceptions
    for i in np.flatnonzero(dur >= SLOW_CALL_US).tolist():
        name = rt.name.at(i)
        kind = _runtime_kind(name)
        if kind is None:
            continue
        code = int(rt.name.codes[i])
        if code not in usual:
            same = dur[rt.name.codes == code]
            # where most calls of a name are slow (every launch under CUPTI's counter
            # replay), slowness is how this trace runs, not start-up
            usual[code] = len(same) < 3 or float(np.median(same)) < SLOW_CALL_US / 10
        if usual[code]:
            found.append(StartupEvent(kind, name, float(rt.ts[i]), float(dur[i])))
    found += _explained(_innermost(_slow_first_calls(trace)), found)
    if not found:
        return None
    end = max(e.ts + e.dur for e in found)
    start = float(trace.start)
    events = tuple(sorted(found, key=lambda e: -e.dur))
    return Startup(start, end, events)


def _innermost(events: list[StartupEvent]) -> list[StartupEvent]:
    """First calls that hold no other: ``aten::conv2d`` wraps ``aten::convolution`` wraps
    ... ``aten::cudnn_convolution``, all slow for one reason, named once by the innermost."""
    return [
        e
        for e in events
        if not any(
            f is not e and f.ts >= e.ts and f.ts + f.dur <= e.ts + e.dur for f in events
        )
    ]


def _explained(first: list[StartupEvent], calls: list[StartupEvent]) -> list[StartupEvent]:
    """First calls whose time is not mostly one start-up runtime call inside them: the first
    ``aten::empty_strided`` that spends 29.9 s in ``cudaDeviceGetStreamPriorityRange`` is
    the CUDA context, named once, by the call."""
    return [
        e
        for e in first
        if not any(
            c.ts >= e.ts and c.ts + c.dur <= e.ts + e.dur and c.dur >= 0.5 * e.dur for c in calls
        )
    ]


def _slow_first_calls(trace: Trace) -> list[StartupEvent]:
    """Operators whose first call took :data:`FIRST_CALL_RATIO` times their later ones."""
    host = trace.host
    dur = host.end - host.ts
    slow = np.flatnonzero(dur >= SLOW_CALL_US)
    if not len(slow):
        return []
    codes = host.name.codes
    out: list[StartupEvent] = []
    for code in np.unique(codes[slow]).tolist():
        calls = np.flatnonzero(codes == code)
        if len(calls) < 2:
            continue  # one call: nothing to tell its first-call cost from its work
        calls = calls[np.argsort(host.ts[calls], kind="stable")]
        first, later = calls[0], dur[calls[1:]]
        if dur[first] >= SLOW_CALL_US and dur[first] >= FIRST_CALL_RATIO * float(np.median(later)):
            out.append(
                StartupEvent(
                    "first call", host.name.values[code], float(host.ts[first]), float(dur[first])
                )
            )
    return out
