"""Spans in a trace that name the user's code: the cell's statements and ``nn.Module`` calls.

``%%gpuprofile`` opens one profiler range around each statement of the cell it runs
(``gpumagic.line#I LN``: statement index ``I``, notebook line ``N``) and one around each
``nn.Module`` call (``gpumagic.module#K``). When a trace is decoded they are taken out of
the host events, so the breakdown, the operator tables and the rules see the trace they
would see without them: a statement's range covers the whole statement, and counted as
an operator it would turn the cell's Python time into CPU Exec and top the operator table.

Traces recorded with ``with_stack=True`` have module spans of their own, the profiler's
``python_function`` events named ``nn.Module: Linear_0`` (type and instance number); they
serve as module spans where a trace has no ``gpumagic.module`` ones.

The names hold ASCII keys only, and what they stand for (a statement's source, a module's
name in the namespace) travels as :class:`CodeLabels`: in memory for a profiled cell, in a
``gpumagicCode`` object at the top of a trace file ``%%gpuprofile --trace`` writes. Kineto
(torch 2.13) writes a range name holding a double quote as invalid JSON, drops newlines and
replaces tabs and non-ASCII text by "unknown", so source text cannot ride in a name.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import msgspec
import numpy as np

STATEMENT_PREFIX = "gpumagic.line#"
MODULE_PREFIX = "gpumagic.module#"
TORCH_MODULE_PREFIX = "nn.Module: "
LABELS_KEY = "gpumagicCode"

_STATEMENT = re.compile(r"^gpumagic\.line#(\d+) L(-?\d+)$")
_MODULE = re.compile(r"^gpumagic\.module#(\d+)$")

# what a host event name is, for the split in gpumagic.profile.trace.decode
OTHER, STATEMENT, MODULE = 0, 1, 2


def statement_range_name(index: int, line: int) -> str:
    return f"{STATEMENT_PREFIX}{index} L{line}"


def module_range_name(number: int) -> str:
    return f"{MODULE_PREFIX}{number}"


@dataclass(frozen=True)
class StatementLabel:
    index: int
    line: int  # the magic's own line is line 1
    depth: int
    source: str


@dataclass(frozen=True)
class ModuleLabel:
    number: int
    name: str  # "model.layer1.0.conv1", or "<Linear #2>" for a module the namespace does not reach
    type: str  # "Conv2d"


@dataclass
class CodeLabels:
    """What the range keys stand for: statements by index, modules by number."""

    statements: list[StatementLabel] = field(default_factory=list)
    modules: list[ModuleLabel] = field(default_factory=list)

    def to_json(self) -> bytes:
        return msgspec.json.encode(
            {
                "version": 1,
                "statements": [[s.index, s.line, s.depth, s.source] for s in self.statements],
                "modules": [[m.number, m.name, m.type] for m in self.modules],
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> CodeLabels | None:
        """The labels a trace file carries; None when the object is absent or unreadable."""
        if not raw:
            return None
        try:
            obj: Any = msgspec.json.decode(raw)
            return cls(
                [
                    StatementLabel(int(i), int(n), int(d), str(s))
                    for i, n, d, s in obj["statements"]
                ],
                [ModuleLabel(int(k), str(n), str(t)) for k, n, t in obj["modules"]],
            )
        except (msgspec.DecodeError, KeyError, TypeError, ValueError):
            return None


@dataclass
class Spans:
    """Spans of one kind: a key each (statement index or module number), µs on the trace clock."""

    key: np.ndarray  # int64
    ts: np.ndarray
    end: np.ndarray
    thread: np.ndarray  # the same (pid, tid) codes as the host and runtime events

    @classmethod
    def empty(cls) -> Spans:
        z = np.zeros(0)
        return cls(np.zeros(0, np.int64), z, z.copy(), np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.key)

    def within(self, lo: float, hi: float) -> Spans:
        """The spans that start inside ``[lo, hi]``."""
        keep = (self.ts >= lo) & (self.ts <= hi)
        if keep.all():
            return self
        return Spans(self.key[keep], self.ts[keep], self.end[keep], self.thread[keep])


@dataclass
class CodeSpans:
    """The statement and module spans of one trace, and what their keys stand for."""

    statements: Spans
    statement_lines: dict[int, int]  # statement index -> line, read off the range names
    modules: Spans
    module_origin: str  # "gpumagic", "with_stack" (nn.Module python_function events) or ""
    module_names: list[str] = field(default_factory=list)  # with_stack: key -> "Linear_0"
    labels: CodeLabels | None = None

    @classmethod
    def empty(cls) -> CodeSpans:
        return cls(Spans.empty(), {}, Spans.empty(), "")


def classify(names: list[str]) -> tuple[np.ndarray, np.ndarray, dict[int, int]]:
    """For each distinct host event name: its kind (OTHER, STATEMENT, MODULE) and key, and
    the line of each statement index. One regex per distinct name, never per event."""
    kinds = np.zeros(len(names), np.int8)
    keys = np.full(len(names), -1, np.int64)
    lines: dict[int, int] = {}
    for i, name in enumerate(names):
        if not name.startswith("gpumagic."):
            continue
        m = _STATEMENT.match(name)
        if m is not None:
            kinds[i], keys[i] = STATEMENT, int(m.group(1))
            lines[int(m.group(1))] = int(m.group(2))
            continue
        m = _MODULE.match(name)
        if m is not None:
            kinds[i], keys[i] = MODULE, int(m.group(1))
    return kinds, keys, lines


def torch_module_keys(names: list[str]) -> tuple[np.ndarray, list[str]]:
    """``nn.Module: Linear_0`` python_function names -> a key per name and the labels by key."""
    index: dict[str, int] = {}
    keys = np.fromiter(
        (index.setdefault(n[len(TORCH_MODULE_PREFIX) :], len(index)) for n in names),
        np.int64,
        len(names),
    )
    return keys, list(index)


def torch_module_type(label: str) -> str:
    """``Linear_0`` -> ``Linear`` (the profiler numbers instances per type)."""
    head, _, tail = label.rpartition("_")
    return head if head and tail.isdigit() else label


def copy_with_labels(src: BinaryIO, out: BinaryIO, labels: bytes) -> None:
    """Copy a Chrome trace (a JSON object) from ``src`` to ``out`` with ``labels`` as its
    first key, streaming: the trace is never parsed. An array-form trace is copied as is."""
    head = src.read(1 << 16)
    start = len(head) - len(head.lstrip())
    if head[start : start + 1] == b"{":
        out.write(head[: start + 1])
        out.write(b'"' + LABELS_KEY.encode() + b'":' + labels + b",")
        out.write(head[start + 1 :])
    else:
        out.write(head)
    shutil.copyfileobj(src, out)
