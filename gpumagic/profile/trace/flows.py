"""Launch flow arrows: a GPU event's correlation id where its ``args`` lack one.

Some writers omit ``args.correlation`` but keep the arrows (``ph`` s/f sharing an ``id``):
the start sits on the runtime call and the finish on the GPU event, each at that event's
timestamp. Rare, so the flows are decoded in a second pass over the file only then, their
``ts`` read exactly as the events' were (:mod:`.timestamps`) so that they match.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

import msgspec
import numpy as np

from gpumagic.profile.trace.phases import skipped_phases
from gpumagic.profile.trace.timestamps import relative

if TYPE_CHECKING:
    from gpumagic.profile.trace.model import GpuEvents, RuntimeEvents

__all__ = ["correlate_by_flows"]


class _Flow(msgspec.Struct, gc=False, tag_field="ph", tag="s"):
    cat: str = ""
    id: int | str = -1
    ts: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class _FlowStep(_Flow, tag="t"):
    pass


class _FlowEnd(_Flow, tag="f"):
    pass


# every other phase of the Chrome trace format, skipped without being materialised
_FLOW_TYPES = (_Flow, _FlowStep, _FlowEnd, *skipped_phases("stf", "_NoFlow"))
if TYPE_CHECKING:  # the union is built at run time; msgspec reads it, mypy cannot
    _FlowUnion = Any
else:
    _FlowUnion = Union[_FLOW_TYPES]  # noqa: UP007 - a Union of a tuple built above


class _FlowFile(msgspec.Struct):
    traceEvents: list[_FlowUnion]


_DECODER = msgspec.json.Decoder(_FlowFile | list[_FlowUnion])
_LAUNCH_FLOWS = {"ac2g", "async", "async_cpu_to_gpu"}


def correlate_by_flows(data: bytes, gpu: GpuEvents, runtime: RuntimeEvents, base: int) -> None:
    """Fill missing GPU correlations from the launch flow arrows of ``data``; ``base``: the
    trace's ``time_base`` (its events' ``ts`` count from it)."""
    decoded = _DECODER.decode(data)
    events = decoded if isinstance(decoded, list) else decoded.traceEvents
    launch = [f for f in events if isinstance(f, _Flow) and f.cat.lower() in _LAUNCH_FLOWS]

    def ts(flow: _Flow) -> float:
        text = bytes(flow.ts)
        return relative(text, base) if base else float(text or 0)

    start_ts = {f.id: ts(f) for f in launch if f.__class__ is _Flow}
    finish_id = {ts(f): f.id for f in launch if f.__class__ is _FlowEnd}
    rt_at = {float(t): i for i, t in enumerate(runtime.ts.tolist())}
    for g in np.flatnonzero(gpu.correlation < 0).tolist():
        fid = finish_id.get(float(gpu.ts[g]))
        r = rt_at.get(start_ts[fid]) if fid is not None and fid in start_ts else None
        if r is None:
            continue
        if runtime.correlation[r] < 0:
            runtime.correlation[r] = 10**15 + r  # unique: real ids are far smaller
        gpu.correlation[g] = runtime.correlation[r]
