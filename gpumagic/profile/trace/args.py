"""The ``args`` of trace events, decoded one kind at a time with a small schema each.

A Kineto event's ``args`` stays raw JSON (a zero-copy view) until a kind of event that
needs it is decoded in one batch: a few fields of thousands of events in one call.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import msgspec

S = TypeVar("S", bound=msgspec.Struct)


class GpuArgs(msgspec.Struct, gc=False):
    # -1 / NaN stand for "not recorded" so the columns stay numeric (no object arrays).
    correlation: int = -1
    stream: int | str = -1
    device: int = -1
    blocks_per_sm: float = msgspec.field(default=math.nan, name="blocks per SM")
    occupancy: float = msgspec.field(default=math.nan, name="est. achieved occupancy %")
    nbytes: int = msgspec.field(default=-1, name="bytes")
    size: int = -1  # an MTIA DMA transfer's bytes


class RuntimeArgs(msgspec.Struct, gc=False):
    correlation: int = -1


class HostArgs(msgspec.Struct, gc=False):
    input_dims: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw, name="Input Dims")
    input_dims_old: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw, name="Input dims")
    input_type: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw, name="Input type")


class SequenceArgs(msgspec.Struct, gc=False):
    # the autograd link: a backward node's op shares "Sequence number" with the forward op
    # that created it; "Fwd thread id" > 0 marks the backward side
    sequence: int = msgspec.field(default=-1, name="Sequence number")
    fwd_thread: int = msgspec.field(default=-1, name="Fwd thread id")


class MemoryArgs(msgspec.Struct, gc=False):
    nbytes: int = msgspec.field(default=0, name="Bytes")
    total_allocated: float = msgspec.field(default=math.nan, name="Total Allocated")
    total_reserved: float = msgspec.field(default=math.nan, name="Total Reserved")
    device_type: int = msgspec.field(default=-1, name="Device Type")
    device_id: int = msgspec.field(default=-1, name="Device Id")


def decode_args(struct: type[S], raws: list[msgspec.Raw]) -> list[S]:
    """Decode the ``args`` of one kind of event in a single call: ``[args, args, ...]``."""
    if not raws:
        return []
    if not all(map(len, raws)):  # events without args become {}
        raws = [r if len(r) else msgspec.Raw(b"{}") for r in raws]
    payload = b"[" + b",".join(raws) + b"]"
    try:
        return _ARGS_DECODERS[struct].decode(payload)
    except msgspec.ValidationError:
        # Some writers put "N/A" or null where Kineto writes numbers: keep the events and
        # drop only the values that do not fit (slow path, per event).
        return [_lenient(struct, item) for item in msgspec.json.decode(payload)]


def _lenient(struct: type[S], item: object) -> S:
    if not isinstance(item, dict):
        return struct()
    kept = {}
    for f in msgspec.structs.fields(struct):
        if f.encode_name in item:
            try:
                msgspec.convert(item[f.encode_name], f.type)
            except msgspec.ValidationError:
                continue
            kept[f.encode_name] = item[f.encode_name]
    return msgspec.convert(kept, struct)


_ARGS_DECODERS: dict[type, msgspec.json.Decoder[Any]] = {
    GpuArgs: msgspec.json.Decoder(list[GpuArgs]),
    RuntimeArgs: msgspec.json.Decoder(list[RuntimeArgs]),
    HostArgs: msgspec.json.Decoder(list[HostArgs]),
    SequenceArgs: msgspec.json.Decoder(list[SequenceArgs]),
    MemoryArgs: msgspec.json.Decoder(list[MemoryArgs]),
}
