"""A decoded trace: columns holding only what the analysis reads (see ``decode.py``).

Each kind of event is a set of numpy columns (one row per event), so every later
step of the analysis is vectorised; strings are stored once (:class:`Names`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec
import numpy as np

from gpumagic.profile.trace.args import HostArgs, SequenceArgs, decode_args
from gpumagic.profile.trace.spans import CodeSpans

# Event kinds, by category (lower-cased: old traces capitalise, new ones do not).
HOST, RUNTIME, KERNEL, MEMCPY, MEMSET, SYNC, IGNORED = range(7)
PYTHON = 7  # with_stack=True: Python frames; only the nn.Module ones are kept (spans.py)


@dataclass
class Names:
    """Strings stored once: ``codes`` index into ``values``."""

    codes: np.ndarray
    values: list[str]

    @classmethod
    def of(cls, strings: list[str]) -> Names:
        index: dict[str, int] = {}
        add = index.setdefault
        # a dict of the distinct names is faster here than pandas.factorize on objects
        codes = np.fromiter([add(s, len(index)) for s in strings], np.int32, len(strings))
        return cls(codes, list(index))

    def __len__(self) -> int:
        return len(self.codes)

    def at(self, i: int) -> str:
        return self.values[int(self.codes[i])]

    def mask(self, predicate: Callable[[str], object]) -> np.ndarray:
        """Boolean row mask of the rows whose name satisfies ``predicate``."""
        hits = np.array([bool(predicate(v)) for v in self.values], dtype=np.bool_)
        return hits[self.codes] if len(self.values) else np.zeros(len(self.codes), bool)


@dataclass
class HostEvents:
    """CPU-side spans: operators, ``record_function`` annotations, ProfilerStep marks."""

    name: Names
    ts: np.ndarray
    end: np.ndarray
    thread: np.ndarray  # int64 code of (pid, tid)
    args: list[msgspec.Raw]  # raw JSON per row, decoded on demand (shapes, dtypes)

    def inputs(self, rows: np.ndarray) -> tuple[list[str], list[str]]:
        """``Input Dims`` and ``Input type`` of ``rows`` as JSON text ("" when not recorded)."""
        decoded = decode_args(HostArgs, [self.args[i] for i in rows.tolist()])
        dims = [bytes(a.input_dims or a.input_dims_old).decode() for a in decoded]
        types = [bytes(a.input_type).decode() for a in decoded]
        return dims, types

    def sequence(self) -> tuple[np.ndarray, np.ndarray]:
        """Per event, ``Sequence number`` and ``Fwd thread id`` (-1 when not recorded)."""
        decoded = decode_args(SequenceArgs, self.args)
        n = len(decoded)
        # a writer may put an unsigned "no number" (2**64 - 1) here: not a link
        return (
            _int_column((a.sequence if a.sequence < 2**62 else -1 for a in decoded), n),
            _int_column((a.fwd_thread if a.fwd_thread < 2**62 else -1 for a in decoded), n),
        )


@dataclass
class RuntimeEvents:
    """Host calls into the CUDA/HIP runtime or driver (launches, copies, syncs)."""

    name: Names
    ts: np.ndarray
    end: np.ndarray
    thread: np.ndarray
    correlation: np.ndarray  # int64, -1 when absent


@dataclass
class GpuEvents:
    """Work on the device: kernels, copies and sets, with their launch correlation."""

    kind: np.ndarray  # int8: KERNEL, MEMCPY or MEMSET
    name: Names
    ts: np.ndarray
    end: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    correlation: np.ndarray
    blocks_per_sm: np.ndarray  # float, NaN when not reported
    occupancy: np.ndarray  # est. achieved occupancy %, NaN when not reported
    nbytes: np.ndarray


@dataclass
class SyncEvents:
    """``cuda_sync`` events: the device side of stream/event/context synchronisations."""

    name: Names
    ts: np.ndarray
    end: np.ndarray


@dataclass
class MemoryEvents:
    """``[memory]`` instants from ``profile_memory=True``: one per allocation or free."""

    ts: np.ndarray
    device_type: np.ndarray  # 0 CPU, 1 CUDA (c10::DeviceType)
    device_id: np.ndarray
    nbytes: np.ndarray  # signed: negative for frees
    total_allocated: np.ndarray  # NaN in traces that do not record it
    total_reserved: np.ndarray


@dataclass
class DeviceProperties:
    """One GPU from the trace's ``deviceProperties``."""

    id: int
    name: str
    memory_bytes: int
    compute_capability: tuple[int, int] | None
    sms: int


@dataclass
class Trace:
    """One rank's trace, decoded into columns."""

    source: str
    rank: int | None
    world_size: int | None
    devices: list[DeviceProperties]
    host: HostEvents
    runtime: RuntimeEvents
    gpu: GpuEvents
    syncs: SyncEvents
    memory: MemoryEvents
    start: float  # first event start, µs since time_base
    end: float  # last event end
    events: int  # duration events kept
    notes: list[str] = field(default_factory=list)  # what the report says before its numbers
    # µs on the trace's own clock where every ts counts from: 0, unless the trace's clock
    # is the epoch and its ts carry nanoseconds a float64 cannot hold there (timestamps.py)
    time_base: int = 0
    backend: str | None = None  # distributedInfo.backend: "nccl", "gloo", ...
    group_sizes: list[int] = field(default_factory=list)  # distributedInfo.pg_config sizes
    # the cell's statement ranges and nn.Module spans, out of ``host`` (see spans.py)
    code: CodeSpans = field(default_factory=CodeSpans.empty)

    @property
    def has_gpu(self) -> bool:
        return len(self.gpu.ts) > 0

    def device(self, device_id: int) -> DeviceProperties | None:
        for d in self.devices:
            if d.id == device_id:
                return d
        return self.devices[0] if len(self.devices) == 1 else None


def _int_column(values: Iterable[int], n: int) -> np.ndarray:
    return np.fromiter(values, np.int64, n)
