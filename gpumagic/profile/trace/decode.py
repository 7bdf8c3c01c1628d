"""Decode a Chrome trace into columns holding only what the analysis reads.

Kineto traces are large (a 6-step ResNet-50 trace is 35 MB of JSON, 75k events) and
most of each event is never looked at (call stacks, module hierarchies, flow ids). A
schema-driven decoder (msgspec ``Struct`` types, unknown fields skipped without being
materialised) reads them several times faster than ``json.loads`` into dicts, and the
events are then split by kind into numpy columns so every later step is vectorised.

Both schemas are understood: the old one (categories ``Operator``, ``Runtime``,
``Kernel``, ``Memcpy``, ``Memset``; ``external id``) and the newer one (``cpu_op``,
``user_annotation``, ``cuda_runtime``, ``cuda_driver``, ``kernel``, ``gpu_memcpy``,
``gpu_memset``, ``cuda_sync``, flow events ``ac2g``), including ROCm traces, which
reuse the CUDA category names with ``hip*`` runtime calls.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Union

import msgspec
import numpy as np

from gpumagic.profile.trace.args import GpuArgs, MemoryArgs, RuntimeArgs, decode_args
from gpumagic.profile.trace.categories import event_kinds, trace_notes
from gpumagic.profile.trace.durations import clip_absurd_durations
from gpumagic.profile.trace.errors import TraceError
from gpumagic.profile.trace.files import read_trace_bytes
from gpumagic.profile.trace.flows import correlate_by_flows
from gpumagic.profile.trace.model import (
    HOST,
    KERNEL,
    MEMCPY,
    MEMSET,
    PYTHON,
    RUNTIME,
    SYNC,
    DeviceProperties,
    GpuEvents,
    HostEvents,
    MemoryEvents,
    Names,
    RuntimeEvents,
    SyncEvents,
    Trace,
)
from gpumagic.profile.trace.phases import skipped_phases
from gpumagic.profile.trace.spans import (
    MODULE,
    STATEMENT,
    TORCH_MODULE_PREFIX,
    CodeLabels,
    CodeSpans,
    Spans,
    classify,
    torch_module_keys,
)
from gpumagic.profile.trace.timestamps import looks_epoch_scale, needs_rebase, rebase_raw


# Events are a tagged union on "ph", so flow arrows and metadata (a third of a Kineto
# trace) decode into empty or tiny structs, and "args" stays raw JSON (a zero-copy view)
# until a kind that needs it is decoded in one batch with its own small schema.
class _Complete(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class _Instant(msgspec.Struct, gc=False, tag_field="ph", tag="i"):
    name: str = ""
    ts: float = 0.0
    args: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class _InstantUpper(_Instant, tag="I"):  # the deprecated spelling of "i"
    pass


_INSTANTS: set[type] = {_Instant, _InstantUpper}


# Every other phase of the Chrome trace format: counters, async and object events,
# metadata, B/E pairs (Kineto writes complete "X" events, never B/E), and flow arrows:
# correlation ids link launches to kernels without them (flows.py reads them when not).
_SKIPPED = skipped_phases("XiI", "_Ignored")
_EVENT_TYPES = (_Complete, _Instant, _InstantUpper, *_SKIPPED)
if TYPE_CHECKING:  # the union is built at run time; msgspec reads it, mypy cannot
    _EventUnion = Any
else:
    _EventUnion = Union[_EVENT_TYPES]  # noqa: UP007 - a Union of a tuple built above


class _Device(msgspec.Struct):
    id: int = 0
    name: str = ""
    totalGlobalMem: int = 0
    computeMajor: int = -1
    computeMinor: int = 0
    numSms: int = 0


class _Distributed(msgspec.Struct):
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    # torch >= 2.1 lists the process groups (a collective's group size when
    # record_param_comms did not record it); raw, so an odd shape never fails the trace
    pg_config: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class _TraceFile(msgspec.Struct):
    traceEvents: list[_EventUnion]
    deviceProperties: list[_Device] = []  # msgspec copies mutable defaults per instance
    distributedInfo: _Distributed | None = None
    # what the statement and module ranges of a %%gpuprofile trace stand for (spans.py)
    gpumagicCode: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


# A bare JSON array of events is also a valid Chrome trace.
_DECODER = msgspec.json.Decoder(_TraceFile | list[_EventUnion])


# The same events with ``ts`` kept as JSON text, for traces whose timestamps a float64
# cannot hold to the nanosecond (timestamps.py): read exactly in one pass after decoding.
class _CompleteTextTs(_Complete):
    ts: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # type: ignore[assignment]


class _InstantTextTs(_Instant):
    ts: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # type: ignore[assignment]


class _InstantUpperTextTs(_InstantTextTs, tag="I"):
    pass


_TEXT_TS_TYPES = (_CompleteTextTs, _InstantTextTs, _InstantUpperTextTs, *_SKIPPED)
if TYPE_CHECKING:
    _TextTsUnion = Any
else:
    _TextTsUnion = Union[_TEXT_TS_TYPES]  # noqa: UP007 - a Union of a tuple built above


class _TraceFileTextTs(_TraceFile):
    traceEvents: list[_TextTsUnion]


_DECODER_TEXT_TS = msgspec.json.Decoder(_TraceFileTextTs | list[_TextTsUnion])
_COMPLETE: dict[Any, type] = {
    _DECODER: _Complete,
    _DECODER_TEXT_TS: _CompleteTextTs,
}
_INSTANTS_OF: dict[Any, set[type]] = {
    _DECODER: _INSTANTS,
    _DECODER_TEXT_TS: {_InstantTextTs, _InstantUpperTextTs},
}

_CAT = attrgetter("cat")
_NAME = attrgetter("name")
_PID = attrgetter("pid")
_TID = attrgetter("tid")
_TS = attrgetter("ts")
_DUR = attrgetter("dur")
_ARGS = attrgetter("args")


# Some Kineto versions wrote bare N/A values (invalid JSON); the TensorBoard plugin works
# around them by rewriting them before parsing. They become null, dropped from args.
_BARE_NA = re.compile(rb'(?<!")\bN/A\b(?!")')


def _decode(
    data: bytes, source: object, decoder: msgspec.json.Decoder = _DECODER
) -> _TraceFile | list[_EventUnion]:
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as e:
        msg = str(e)
        if "missing required field `traceEvents`" in msg:
            raise TraceError(source, "is JSON but not a Chrome trace (no traceEvents)") from None
        if msg.startswith("Expected `object | array`") or msg.startswith(
            "Expected `array | object`"
        ):
            raise TraceError(
                source, "is JSON but not a Chrome trace (neither an object nor an array)"
            ) from None
        raise TraceError(source, f"is not a Chrome trace the profiler writes: {msg}") from None
    except msgspec.DecodeError as e:
        if b"N/A" in data:
            try:
                return decoder.decode(_BARE_NA.sub(b"null", data))
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass
        msg = str(e)
        why = (
            "truncated JSON (the file was cut off)"
            if "truncated" in msg
            else f"invalid JSON ({msg})"
        )
        raise TraceError(source, why) from None


def read_trace(path: str | Path) -> Trace:
    """Decode one trace file into columns (no analysis yet)."""
    p = Path(path)
    return decode_trace(read_trace_bytes(p), str(p))


# --- columns -------------------------------------------------------------------------------


def _take(items: list[Any], rows: np.ndarray) -> list[Any]:
    if len(rows) > 1:
        return list(itemgetter(*rows.tolist())(items))
    return [items[i] for i in rows.tolist()]


def _floats(values: Iterable[float], n: int) -> np.ndarray:
    return np.fromiter(values, np.float64, n)


def _ints(values: Iterable[int], n: int) -> np.ndarray:
    return np.fromiter(values, np.int64, n)


def _codes(values: list[int | str]) -> tuple[np.ndarray, int]:
    index: dict[int | str, int] = {}
    add = index.setdefault
    codes = np.fromiter([add(v, len(index)) for v in values], np.int64, len(values))
    return codes, len(index)


def _int_codes(values: np.ndarray) -> tuple[np.ndarray, int]:
    """:func:`_codes` of integers, in numpy: each value's rank in the order values first
    appear, as the dict there numbers them."""
    distinct, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    rank = np.empty(len(distinct), np.int64)
    rank[np.argsort(first)] = np.arange(len(distinct))
    return rank[inverse.reshape(-1)], len(distinct)


def _column_codes(groups: list[list[_Complete]], field: attrgetter[Any]) -> tuple[np.ndarray, int]:
    """:func:`_codes` of one field (pid or tid) over the events of ``groups``, in order."""
    try:
        # array("q") takes ints only, in one C pass, and numpy codes them: a dict per
        # event cost three times as much on 65k host events
        values = [np.frombuffer(array("q", map(field, g)), np.int64) for g in groups]
    except (TypeError, OverflowError):  # strings occur too ("tid": "stream 7", "25738")
        return _codes([v for g in groups for v in map(field, g)])
    return _int_codes(np.concatenate(values))


def _thread_codes(groups: list[list[_Complete]]) -> np.ndarray:
    """One code per event of ``groups`` (in order) for its thread, (pid, tid)."""
    p, _ = _column_codes(groups, _PID)
    t, nt = _column_codes(groups, _TID)
    return p * max(nt, 1) + t


def _name_at(events: list[_Complete], row: int) -> str:
    return events[row].name


def _starts(complete: list[Any]) -> np.ndarray:
    return _floats(map(_TS, complete), len(complete))


def _exact_events(data: bytes, source: str) -> tuple[list[Any], list[Any], _Meta, int, np.ndarray]:
    """:func:`_events` with every ``ts`` exact to the nanosecond, the integer base they
    count from (timestamps.py), and the complete events' ``ts`` as a column. Floats are
    decoded unless the first ts shows the trace is at epoch scale; if floats lost digits all
    the same, the ts are decoded again as text."""
    floats = None
    if not looks_epoch_scale(data):
        floats = _events(data, source)
        starts = _starts(floats[0])
        if not needs_rebase(starts):
            return (*floats, 0, starts)
    complete, instants, meta = _events(data, source, _DECODER_TEXT_TS)
    base = rebase_raw(complete, instants)
    if base is not None:
        return complete, instants, meta, base, _starts(complete)
    floats = floats or _events(data, source)  # no digits lost after all
    return (*floats, 0, _starts(floats[0]))


def decode_trace(data: bytes, source: str) -> Trace:
    """Decode a trace's JSON text (see :func:`read_trace_bytes`) into a :class:`Trace`."""
    complete, instants, meta, time_base, starts = _exact_events(data, source)
    cats = Names.of(list(map(_CAT, complete)))
    kinds = event_kinds(cats, partial(_name_at, complete))
    notes = trace_notes(cats, kinds)
    # every complete event's start and end, read once; each kind takes its rows
    times = _Times(starts, starts + _floats(map(_DUR, complete), len(complete)))
    host, code, runtime = _host_side(complete, kinds, times, meta.labels)
    gpu_rows = _rows(kinds, KERNEL, MEMCPY, MEMSET)
    gpu = _gpu_events(_take(complete, gpu_rows), kinds[gpu_rows], times.of(gpu_rows))
    sync_rows = _rows(kinds, SYNC)
    syncs = _sync_events(_take(complete, sync_rows), times.of(sync_rows))
    memory = _memory_events(instants)
    del complete, instants
    if (gpu.correlation < 0).any() and len(runtime.ts):
        correlate_by_flows(data, gpu, runtime, time_base)
    notes += clip_absurd_durations(source, (host, runtime, gpu, syncs))
    start, end, n_kept = _extent(source, code, (host, runtime, gpu, syncs))
    dist = meta.distributed
    return Trace(
        source=source,
        rank=dist.rank if dist is not None else None,
        world_size=dist.world_size if dist is not None else None,
        devices=[_device(d) for d in meta.devices],
        host=host,
        runtime=runtime,
        gpu=gpu,
        syncs=syncs,
        memory=memory,
        start=start,
        end=end,
        events=n_kept,
        notes=notes,
        time_base=time_base,
        backend=dist.backend if dist is not None else None,
        group_sizes=_group_sizes(dist.pg_config) if dist is not None else [],
        code=code,
    )


class _Times(NamedTuple):
    """Start and end (µs) of every complete event, in file order."""

    ts: np.ndarray
    end: np.ndarray

    def of(self, rows: np.ndarray) -> _Times:
        return _Times(self.ts[rows], self.end[rows])


@dataclass
class _Meta:
    """What a trace file holds beside its events."""

    devices: list[_Device]
    distributed: _Distributed | None
    labels: bytes  # gpumagicCode, raw JSON


def _events(
    data: bytes, source: str, decoder: msgspec.json.Decoder = _DECODER
) -> tuple[list[_Complete], list[_Instant], _Meta]:
    """The complete events and the ``[memory]`` instants of the trace, and the rest of the
    file; every other event is dropped here, before the columns are built."""
    decoded = _decode(data, source, decoder)
    events: list[Any]
    if isinstance(decoded, list):
        events, meta = decoded, _Meta([], None, b"")
    else:
        events = decoded.traceEvents
        meta = _Meta(decoded.deviceProperties, decoded.distributedInfo, bytes(decoded.gpumagicCode))
    del decoded
    if not events:
        raise TraceError(source, "the trace has no events (traceEvents is empty)")
    complete_type, instant_types = _COMPLETE[decoder], _INSTANTS_OF[decoder]
    complete: list[Any] = [e for e in events if e.__class__ is complete_type]
    instants: list[Any] = [
        e for e in events if e.__class__ in instant_types and _NAME(e) == "[memory]"
    ]
    return complete, instants, meta


def _rows(kinds: np.ndarray, *wanted: int) -> np.ndarray:
    return (
        np.flatnonzero(np.isin(kinds, wanted))
        if len(wanted) > 1
        else np.flatnonzero(kinds == wanted[0])
    )


def _host_side(
    complete: list[_Complete], kinds: np.ndarray, times: _Times, labels_raw: bytes
) -> tuple[HostEvents, CodeSpans, RuntimeEvents]:
    """Host operators, the cell's statement and module ranges, and runtime calls."""
    host_rows, rt_rows = _rows(kinds, HOST), _rows(kinds, RUNTIME)
    host_sub, rt_sub = _take(complete, host_rows), _take(complete, rt_rows)
    py_rows = _rows(kinds, PYTHON)
    py_rows = (
        py_rows[[e.name.startswith(TORCH_MODULE_PREFIX) for e in _take(complete, py_rows)]]
        if len(py_rows)
        else py_rows
    )
    py_sub = _take(complete, py_rows)
    # one coding of (pid, tid) for all, so runtime calls nest inside operators
    threads = _thread_codes([host_sub, rt_sub, py_sub])
    n_host, n_rt = len(host_sub), len(rt_sub)
    host, code = _code_spans(
        _host_events(host_sub, threads[:n_host], times.of(host_rows)),
        py_sub,
        threads[n_host + n_rt :],
        times.of(py_rows),
        labels_raw,
    )
    runtime = _runtime_events(rt_sub, threads[n_host : n_host + n_rt], times.of(rt_rows))
    return host, code, runtime


def _extent(
    source: str,
    code: CodeSpans,
    events: tuple[HostEvents | RuntimeEvents | GpuEvents | SyncEvents, ...],
) -> tuple[float, float, int]:
    """The trace's first start, last end and number of events kept."""
    spans = [(x.ts, x.end) for x in events if len(x.ts)]
    n_kept = sum(len(s) for s, _ in spans)
    # a cell of plain Python has its statement ranges and nothing else
    spans = spans or [(x.ts, x.end) for x in (code.statements, code.modules) if len(x.ts)]
    if not spans:
        raise TraceError(source, "the trace has no duration events (ph 'X') to analyse")
    start = min(float(s.min()) for s, _ in spans)
    end = max(float(e.max()) for _, e in spans)
    # A range still open when a schedule's window closed (the gpumagic.step() call that
    # ends it) gets its end from Kineto after the profiler's own collection: cut it where
    # the recorded events end, or that line would hold the profiler's work.
    for x in (code.statements, code.modules):
        np.minimum(x.end, end, out=x.end)
    return start, end, n_kept


def _device(d: _Device) -> DeviceProperties:
    return DeviceProperties(
        id=d.id,
        name=d.name,
        memory_bytes=d.totalGlobalMem,
        compute_capability=(d.computeMajor, d.computeMinor) if d.computeMajor >= 0 else None,
        sms=d.numSms,
    )


def _group_sizes(raw: msgspec.Raw) -> list[int]:
    """``pg_size`` of each process group in ``distributedInfo.pg_config`` (none if unreadable)."""
    if not len(raw):
        return []
    try:
        groups = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return []
    if not isinstance(groups, list):
        return []
    return [
        g["pg_size"]
        for g in groups
        if isinstance(g, dict) and isinstance(g.get("pg_size"), int) and g["pg_size"] > 0
    ]


def _host_events(sub: list[_Complete], thread: np.ndarray, times: _Times) -> HostEvents:
    return HostEvents(
        name=Names.of(list(map(_NAME, sub))),
        ts=times.ts,
        end=times.end,
        thread=thread,
        args=list(map(_ARGS, sub)),
    )


def _code_spans(
    host: HostEvents,
    py_modules: list[_Complete],
    py_thread: np.ndarray,
    py_times: _Times,
    labels_raw: bytes,
) -> tuple[HostEvents, CodeSpans]:
    """Take the statement and module ranges out of ``host`` (see :mod:`gpumagic.profile.trace.spans`);
    with no gpumagic module ranges, the ``nn.Module`` python_function spans are the modules."""
    kinds, keys, lines = classify(host.name.values)
    code = CodeSpans.empty()
    code.labels = CodeLabels.from_json(labels_raw)
    if (kinds != 0).any():
        row_kind, row_key = kinds[host.name.codes], keys[host.name.codes]
        for kind, attr in ((STATEMENT, "statements"), (MODULE, "modules")):
            m = row_kind == kind
            if m.any():
                setattr(code, attr, Spans(row_key[m], host.ts[m], host.end[m], host.thread[m]))
        code.statement_lines = lines
        if len(code.modules):
            code.module_origin = "gpumagic"
        host = _host_subset(host, np.flatnonzero(row_kind == 0))
    if not len(code.modules) and py_modules:
        key, code.module_names = torch_module_keys(list(map(_NAME, py_modules)))
        code.modules = Spans(key, py_times.ts, py_times.end, py_thread)
        code.module_origin = "with_stack"
    return host, code


def _host_subset(host: HostEvents, rows: np.ndarray) -> HostEvents:
    used, codes = np.unique(host.name.codes[rows], return_inverse=True)
    return HostEvents(
        name=Names(codes.astype(np.int32).reshape(-1), [host.name.values[i] for i in used]),
        ts=host.ts[rows],
        end=host.end[rows],
        thread=host.thread[rows],
        args=_take(host.args, rows),
    )


def _runtime_events(sub: list[_Complete], thread: np.ndarray, times: _Times) -> RuntimeEvents:
    n = len(sub)
    args = decode_args(RuntimeArgs, list(map(_ARGS, sub)))
    return RuntimeEvents(
        name=Names.of(list(map(_NAME, sub))),
        ts=times.ts,
        end=times.end,
        thread=thread,
        correlation=_ints(map(attrgetter("correlation"), args), n),
    )


def _gpu_events(sub: list[_Complete], kinds: np.ndarray, times: _Times) -> GpuEvents:
    n = len(sub)
    args = decode_args(GpuArgs, list(map(_ARGS, sub)))
    streams = list(map(attrgetter("stream"), args))
    if set(map(type, streams)) <= {int}:
        stream = _ints(streams, n)
    else:
        stream = np.fromiter((s if type(s) is int else -1 for s in streams), np.int64, n)
    if n and (stream < 0).any():
        # No stream argument: in Kineto's layout the GPU "thread" is the stream.
        tids, _ = _codes(list(map(_TID, sub)))
        stream = np.where(stream < 0, 1_000_000 + tids, stream)
    device = _ints(map(attrgetter("device"), args), n)
    if n and (device < 0).any():
        pids = np.fromiter((p if type(p) is int else -1 for p in map(_PID, sub)), np.int64, n)
        device = np.where(device < 0, pids, device)
    return GpuEvents(
        kind=kinds.astype(np.int8, copy=False),
        name=Names.of(list(map(_NAME, sub))),
        ts=times.ts,
        end=times.end,
        device=device,
        stream=stream,
        correlation=_ints(map(attrgetter("correlation"), args), n),
        blocks_per_sm=_floats(map(attrgetter("blocks_per_sm"), args), n),
        occupancy=_floats(map(attrgetter("occupancy"), args), n),
        nbytes=np.maximum(
            _ints(map(attrgetter("nbytes"), args), n), _ints(map(attrgetter("size"), args), n)
        ),
    )


def _sync_events(sub: list[_Complete], times: _Times) -> SyncEvents:
    return SyncEvents(name=Names.of(list(map(_NAME, sub))), ts=times.ts, end=times.end)


def _memory_events(sub: list[_Instant]) -> MemoryEvents:
    n = len(sub)
    args = decode_args(MemoryArgs, list(map(_ARGS, sub)))
    return MemoryEvents(
        ts=_floats(map(_TS, sub), n),
        device_type=_ints(map(attrgetter("device_type"), args), n),
        device_id=_ints(map(attrgetter("device_id"), args), n),
        nbytes=_ints(map(attrgetter("nbytes"), args), n),
        total_allocated=_floats(map(attrgetter("total_allocated"), args), n),
        total_reserved=_floats(map(attrgetter("total_reserved"), args), n),
    )
