"""Timestamps read to the nanosecond, wherever the trace's clock starts.

Kineto writes ``ts`` in microseconds with three decimals (nanoseconds). Traces of torch
before ~2.4 count from the Unix epoch, so a 2024 trace's ``ts`` is about 1.7e15: at that
magnitude a float64 steps by 0.25 µs, and decoding the number into a float rounds every
start by up to 0.125 µs. Kernel durations (an end minus a start) were off by as much, kernels
under 2 µs by 3% on average, and a gap between two kernels could flip between "host wait"
and "kernel wait" (Holistic Trace Analysis's ``ns_resolution`` test trace: host wait
1259 µs against HTA's 1347, and exactly HTA's once the same trace is shifted to start near
zero). Newer traces count from ``baseTimeNanoseconds`` and stay near 5e12 µs, where a
float64 still resolves a nanosecond.

So when a trace's timestamps are that large and carry fractions, the ``ts`` of its events
are read again as text, an integer base (in µs) is subtracted from the integer part, and
only the rest becomes a float: every ``ts`` is then exact to the nanosecond, relative to the
base, which :class:`~gpumagic.profile.trace.model.Trace` keeps as ``time_base``. Durations
are small numbers and decode exactly as floats. Traces that need none of this (most) pay
one pass over the decoded floats.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Union

import msgspec

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["PRECISE_FROM", "needs_rebase", "rebase", "relative"]

# Above 2**42 µs (about 51 days from the clock's start) a float64's step exceeds 1 ns.
PRECISE_FROM = float(2**42)


class _TimedX(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    ts: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class _TimedInstant(msgspec.Struct, gc=False, tag_field="ph", tag="i"):
    name: str = ""
    ts: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class _TimedInstantUpper(_TimedInstant, tag="I"):
    pass


def _skipped(tag: str) -> type:
    return msgspec.defstruct(f"_Skipped_{ord(tag)}", [], tag_field="ph", tag=tag)


# every other phase of the Chrome trace format, skipped without being materialised
_OTHER = tuple(_skipped(ph) for ph in "MBECbnePONDVvRc()stf")
_TIMED_TYPES = (_TimedX, _TimedInstant, _TimedInstantUpper, *_OTHER)
if TYPE_CHECKING:  # the union is built at run time; msgspec reads it, mypy cannot
    _TimedUnion = Any
else:
    _TimedUnion = Union[_TIMED_TYPES]  # noqa: UP007 - a Union of a tuple built above


class _TimedFile(msgspec.Struct):
    traceEvents: list[_TimedUnion]


_DECODER = msgspec.json.Decoder(_TimedFile | list[_TimedUnion])


def needs_rebase(starts: Sequence[float]) -> bool:
    """Whether decoding ``starts`` (the complete events' ``ts`` as floats) lost digits:
    past :data:`PRECISE_FROM`, and with fractions (integer µs survive a float64 exactly)."""
    if not starts:
        return False
    big = max(starts)
    if max(big, -min(starts)) < PRECISE_FROM:
        return False
    return any(t != math.floor(t) for t in starts)


def relative(text: bytes, base: int) -> float:
    """The JSON number ``text`` minus ``base``, exactly, then as a float."""
    if not text:
        return 0.0
    dot = text.find(b".")
    if dot < 0 and text.isdigit():
        return float(int(text) - base)
    if dot <= 0 or text[0:1] == b"-" or b"e" in text or b"E" in text:
        return float(Decimal(text.decode()) - base)  # a sign or an exponent: rare, exact
    return float(int(text[:dot]) - base) + float(b"0" + text[dot:])


def rebase(data: bytes, complete: Sequence[Any], instants: Sequence[Any]) -> int:
    """Read the ``ts`` of ``complete`` (the file's ``X`` events, in file order) and of
    ``instants`` (its ``[memory]`` instants, in order) again from ``data``, exactly, relative
    to an integer base; set each event's ``ts`` to that and return the base (0: nothing
    needed it)."""
    if not needs_rebase([e.ts for e in complete]):
        return 0
    base = math.floor(min(e.ts for e in complete)) - 1
    decoded = _DECODER.decode(data)
    events = decoded if isinstance(decoded, list) else decoded.traceEvents
    timed = [e for e in events if e.__class__ is _TimedX]
    marks = [
        e for e in events if e.__class__ in (_TimedInstant, _TimedInstantUpper) and e.name == "[memory]"
    ]
    if len(timed) != len(complete) or len(marks) != len(instants):
        return 0  # cannot happen for one file; keep the floats rather than misalign them
    for event, again in zip(complete, timed):
        event.ts = relative(bytes(again.ts), base)
    for event, mark in zip(instants, marks):
        event.ts = relative(bytes(mark.ts), base)
    return base
