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
are read as text, an integer base (in µs) is subtracted from the integer part, and only the
rest becomes a float: every ``ts`` is then exact to the nanosecond, relative to the base,
which :class:`~gpumagic.profile.trace.model.Trace` keeps as ``time_base``. Durations are
small numbers and decode exactly as floats.

When the file's first ``ts`` already looks like that (:func:`looks_epoch_scale`), the
decoder keeps every ``ts`` as text and :func:`rebase_raw` reads them all at once; otherwise
they decode as floats, and only if those lost digits (:func:`needs_rebase`) is the file
decoded again with its ``ts`` as text. Traces that need none of this (most) pay one numpy
pass over the decoded floats.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["PRECISE_FROM", "looks_epoch_scale", "needs_rebase", "rebase_raw", "relative"]

# Above 2**42 µs (about 51 days from the clock's start) a float64's step exceeds 1 ns.
PRECISE_FROM = float(2**42)


def needs_rebase(starts: Sequence[float] | np.ndarray) -> bool:
    """Whether decoding ``starts`` (the complete events' ``ts`` as floats) lost digits:
    past :data:`PRECISE_FROM`, and with fractions (integer µs survive a float64 exactly)."""
    if not len(starts):
        return False
    ts = np.asarray(starts, dtype=np.float64)  # one pass in numpy: a Python loop over a
    if np.abs(ts).max() < PRECISE_FROM:  # large integer-µs trace cost it 15% of its load
        return False
    return bool((ts != np.floor(ts)).any())


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


def _digits_one_by_one(texts: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_digits` for numbers with a sign or an exponent (Kineto writes neither):
    exact, with Python's decimals."""
    numbers = [Decimal(bytes(t).decode()) if len(t) else Decimal(0) for t in texts]
    whole = [math.floor(d) for d in numbers]
    frac = [float(d - w) for d, w in zip(numbers, whole)]
    # Python ints (an exponent can take one past int64), subtracted from exactly
    return np.array(whole, dtype=object), np.array(frac), np.array([not len(t) for t in texts])


def _digits(texts: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every JSON number in ``texts`` (bytes-like) as (integer part, fraction as a float,
    whether it is empty: an event without ts), read as digits column by column over all of
    them at once: a per-number Python loop was most of an exact trace's extra load time."""
    arr = np.array(b",".join(texts).split(b","))
    width = arr.dtype.itemsize
    if width > 40:
        return _digits_one_by_one(texts)
    u = arr.view(np.uint8).reshape(len(texts), width)
    digit, dot = (u >= 48) & (u <= 57), u == 46
    length = (u != 0).sum(axis=1)
    point = np.where(dot.any(axis=1), dot.argmax(axis=1), length)
    n_frac = np.maximum(length - point - 1, 0)
    if (
        not (digit | dot | (u == 0)).all()
        or (dot.sum(axis=1) > 1).any()
        or (point > 18).any()
        or (n_frac > 18).any()
    ):
        return _digits_one_by_one(texts)
    columns = np.ascontiguousarray(u.T)  # one column of digits, contiguous, at a time
    whole = np.zeros(len(texts), np.int64)
    frac = np.zeros(len(texts), np.int64)
    for j in range(width):  # Horner's rule
        d = columns[j].astype(np.int64) - 48
        whole = np.where(j < point, whole * 10 + d, whole)
        frac = np.where((j > point) & (j < length), frac * 10 + d, frac)
    # the fraction as an integer over 10**n rounds exactly as float("0.ddd") does
    return whole, frac / 10.0**n_frac, length == 0


# The first "ts" of the file: when it is this large and has digits after the point, the
# decoder reads every ts as text (rebase_raw) at once, instead of decoding floats first.
_FIRST_TS = re.compile(rb'"ts"\s*:\s*([0-9.]+)')


def looks_epoch_scale(data: bytes) -> bool:
    """Whether the trace's first ``ts`` (within its first MiB) is past :data:`PRECISE_FROM`
    and has a fraction: the traces :func:`rebase_raw` is for."""
    m = _FIRST_TS.search(data, 0, 1 << 20)
    if m is None or b"." not in m.group(1):
        return False
    try:
        return float(m.group(1)) >= PRECISE_FROM
    except ValueError:
        return False


def rebase_raw(complete: Sequence[Any], instants: Sequence[Any]) -> int | None:
    """Set the ``ts`` of ``complete`` and ``instants``, decoded as JSON text, to floats exact
    to the nanosecond relative to an integer base, and return the base; None when the trace
    does not need it after all (then decode floats)."""
    if not complete:
        return None
    whole, frac, empty = _digits([e.ts for e in complete])
    if whole.max() < PRECISE_FROM or not frac.any():
        return None
    marks = _digits([e.ts for e in instants]) if instants else (whole[:0], frac[:0], empty[:0])
    base = int(whole.min()) - 1  # an event without ts counts as 0, as a float decode reads it
    for (w, f, e), events in (((whole, frac, empty), complete), (marks, instants)):
        values = (w - base).astype(np.float64) + f
        values[e] = 0.0  # an event without ts: 0, as the float decoder reads it
        for event, ts in zip(events, values.tolist()):
            event.ts = ts
    return base
