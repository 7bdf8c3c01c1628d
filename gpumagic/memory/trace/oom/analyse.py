"""From what was read at the failure to the report: a CUDA failure from the caching
allocator's statistics (``torch.cuda.memory_stats()``) and ``mem_get_info()``, a host failure
from the process's RSS, the machine's memory and an address-space cap. Pure functions over
plain data, so they are tested without a GPU.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gpumagic.cell import error_text
from gpumagic.device_kinds import HOST
from gpumagic.memory.trace.oom.advice import advice
from gpumagic.memory.trace.oom.detect import ASKED, message, requested_bytes
from gpumagic.memory.trace.oom.holders import Holder
from gpumagic.memory.trace.oom.model import OomReport

__all__ = ["build_cuda_report", "build_host_report"]

# The report keeps the error's first line whole: torch's CUDA message is one long line, whose
# end (the allocator's advice) the report's readers search.
_WHOLE_LINE = sys.maxsize


def _report(exc: BaseException, holders: Sequence[Holder], unnamed: tuple[int, int], **numbers: Any) -> OomReport:
    """The report's fields every failure has: the error, what it asked for, the holders
    (largest first) and what no name reaches; ``numbers``: the device's own."""
    return OomReport(
        exception=error_text(exc, _WHOLE_LINE),
        requested=requested_bytes(message(exc)),
        holders=sorted(holders, key=lambda h: -h.nbytes),
        unnamed_bytes=unnamed[0],
        unnamed_count=unnamed[1],
        **numbers,
    )


def build_cuda_report(
    exc: BaseException,
    stats: Mapping[str, Any],
    mem_info: tuple[int, int] | None,
    device: str,
    holders: Sequence[Holder],
    unnamed: tuple[int, int] = (0, 0),
    released: int | None = None,
) -> OomReport:
    """Report for a CUDA OOM from ``torch.cuda.memory_stats()`` and ``mem_get_info()``."""
    free, total = mem_info if mem_info is not None else (None, None)
    report = _report(
        exc,
        holders,
        unnamed,
        device=device,
        free=free,
        total=total,
        allocated=int(stats.get("allocated_bytes.all.current", 0)),
        reserved=int(stats.get("reserved_bytes.all.current", 0)),
        released=released,
        requested_note=_cuda_request_note(message(exc)),
    )
    report.advice = advice(report, cuda=True, retries=int(stats.get("num_alloc_retries", 0)))
    return report


def _cuda_request_note(text: str) -> str:
    if ASKED.search(text):
        # CUDACachingAllocator's message names alloc_size, not the tensor's size: a request
        # up to 1 MiB asks for a 2 MiB block, up to 10 MiB for 20 MiB, a larger one is
        # rounded up to 2 MiB (c10/cuda/CUDACachingAllocator.cpp, get_allocation_size).
        return (
            "the caching allocator's rounded block size, not the tensor's: up to 1 MiB asks "
            "for 2 MiB, up to 10 MiB for 20 MiB, larger sizes round up to 2 MiB"
        )
    return "the error does not say how much was asked for"


def build_host_report(
    exc: BaseException,
    rss: int,
    available: int | None,
    total: int | None,
    holders: Sequence[Holder],
    unnamed: tuple[int, int] = (0, 0),
    address_limit: int | None = None,
    address_used: int | None = None,
    released: int | None = None,
) -> OomReport:
    """Report for a host allocation failure (torch's CPU allocator, ``MemoryError``)."""
    free = available
    if address_limit is not None and address_used is not None:
        # the cap, not the machine, bounds what this process can have: free "of" the cap
        headroom = max(address_limit - address_used, 0)
        free = headroom if free is None else min(free, headroom)
        total = address_limit if total is None else min(total, address_limit)
    report = _report(
        exc,
        holders,
        unnamed,
        device=HOST,
        free=free,
        total=total,
        allocated=rss,
        reserved=None,
        released=released,
        address_limit=address_limit,
        address_used=address_used,
    )
    report.advice = advice(report, cuda=False)
    return report
