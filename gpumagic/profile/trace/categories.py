"""Which events a trace's categories hold, and what a trace's categories say about it.

Both Kineto schemas are mapped (the old ``Operator``/``Runtime``/``Kernel``/``Memcpy``/
``Memset`` and the new ``cpu_op``/``cuda_runtime``/``kernel``/``gpu_memcpy``/...), ROCm's
(the CUDA names, with ``hip*`` calls), and Meta's MTIA accelerator's: ``mtia_ccp_events``
are the device's work, kernels and DMA transfers (``dma_*``; Holistic Trace Analysis counts
both as the device's kernels, DMA as its memory kernels), ``mtia_runtime`` its launches
(``runFunction``, correlated with the kernels by ``args.correlation`` as CUDA's are).

A category that holds device work the analysis cannot time is said in a note rather than
dropped in silence: CUPTI's range profiler (``cuda_profiler_range``) replays each kernel
to read hardware counters and writes one record per kernel with the counters but no
kernel timing, and no ``kernel`` events at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpumagic.profile.trace.model import (
    HOST,
    IGNORED,
    KERNEL,
    MEMCPY,
    MEMSET,
    PYTHON,
    RUNTIME,
    SYNC,
    Names,
)

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["event_kinds", "trace_notes"]

CATEGORY_KIND = {
    "cpu_op": HOST,
    "operator": HOST,
    "user_annotation": HOST,
    "python": HOST,
    "cuda_runtime": RUNTIME,
    "runtime": RUNTIME,
    # Triton and other JITs launch through the driver API (cuLaunchKernel).
    "cuda_driver": RUNTIME,
    "kernel": KERNEL,
    "gpu_memcpy": MEMCPY,
    "memcpy": MEMCPY,
    "gpu_memset": MEMSET,
    "memset": MEMSET,
    "cuda_sync": SYNC,
    "python_function": PYTHON,
    "mtia_ccp_events": KERNEL,  # its dma_* events are copies: see event_kinds
    "mtia_runtime": RUNTIME,
}
_MTIA_DEVICE = "mtia_ccp_events"
_CUPTI_RANGES = "cuda_profiler_range"


def event_kinds(categories: Names, name_of: Callable[[int], str]) -> np.ndarray:
    """The kind of each event (``HOST``, ``KERNEL``, ...) from its category, looked up once
    per distinct category; ``name_of(row)``: an event's name, asked only of MTIA device
    events (a DMA transfer there is a copy)."""
    values = categories.values
    kind_of = np.array([CATEGORY_KIND.get(c.lower(), IGNORED) for c in values], dtype=np.int8)
    kinds = kind_of[categories.codes] if len(kind_of) else np.zeros(0, np.int8)
    mtia = [i for i, c in enumerate(values) if c.lower() == _MTIA_DEVICE]
    if mtia:
        for row in np.flatnonzero(np.isin(categories.codes, mtia)).tolist():
            if name_of(row).startswith("dma"):
                kinds[row] = MEMCPY
    return kinds


def trace_notes(categories: Names, kinds: np.ndarray) -> list[str]:
    """What the report must say about the trace's device events before its numbers."""
    counts = np.bincount(categories.codes, minlength=len(categories.values))
    by_name = {c.lower(): int(counts[i]) for i, c in enumerate(categories.values)}
    notes = []
    if by_name.get(_MTIA_DEVICE):
        notes.append(
            f"An MTIA accelerator trace: its {by_name[_MTIA_DEVICE]:,} device events "
            "(mtia_ccp_events) are analysed as the device's kernels and DMA copies, its "
            "runtime calls (mtia_runtime) as their launches; the findings' advice is written "
            "for CUDA GPUs."
        )
    ranges = by_name.get(_CUPTI_RANGES, 0)
    if ranges and not (kinds == KERNEL).any():
        notes.append(
            f"This trace was recorded with CUPTI's range profiler: its {ranges:,} "
            "cuda_profiler_range records hold hardware counters of kernels replayed one at a "
            "time, and no kernel timings. The GPU side cannot be timed from it: the analysis "
            "below covers the host only. Record without the profiler's counter metrics "
            "(experimental_config) to time the kernels."
        )
    return notes
