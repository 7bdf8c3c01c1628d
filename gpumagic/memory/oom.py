"""The out-of-memory report: what was asked for, what is free, what is fragmented, who holds it.

The builders are pure functions over plain data (an allocator-stat dictionary of the
shape ``torch.cuda.memory_stats()`` returns, numbers from ``/proc`` or psutil, a list of
holders) so they are tested without a GPU.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpumagic.memory.holders import Holder
from gpumagic.units import fmt_bytes

_UNITS = {
    "B": 1,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
    "PIB": 2**50,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}

# "CUDA out of memory. Tried to allocate 2.00 GiB." (torch.OutOfMemoryError)
_CUDA_ASK = re.compile(r"Tried to allocate ([\d.]+) ?([KMGTP]?i?B)", re.IGNORECASE)
# "DefaultCPUAllocator: can't allocate memory: you tried to allocate 35184372088832 bytes."
_CPU_ASK = re.compile(r"you tried to allocate (\d+) bytes", re.IGNORECASE)
# numpy: "Unable to allocate 32.0 TiB for an array with shape ..."
_NUMPY_ASK = re.compile(r"Unable to allocate ([\d.]+) ?([KMGTP]?i?B)", re.IGNORECASE)

# Fragmentation worth a word: reserved-but-unallocated above this share of the reserved pool.
FRAGMENTATION_SHARE = 0.2
FRAGMENTATION_MIN_BYTES = 256 * 2**20


# Out-of-memory errors that do not come through the caching allocator's own OutOfMemoryError
# (audit M3): the CUDA runtime failing an allocation (context creation, NCCL, a kernel's
# local memory: ``torch.AcceleratorError: CUDA error: out of memory``), and the CUDA libraries
# failing to get their handles or workspaces. Each leaves the failed call's frames pinned by
# the traceback exactly like an allocator OOM, so each gets the report and the release.
_CUDA_OOM_TEXT = re.compile(
    r"CUDA out of memory"
    r"|CUDA error: out of memory"
    r"|cudaErrorMemoryAllocation"
    r"|\bCU(?:BLAS|SOLVER|SPARSE)_STATUS_ALLOC_FAILED\b"
    r"|\bCUFFT_ALLOC_FAILED\b"
    r"|\bCUDNN_STATUS_(?:ALLOC_FAILED|\w*DEVICE_ALLOCATION_FAILED|\w*NOT_ENOUGH_WORKSPACE\w*"
    r"|\w*INSUFFICIENT_WORKSPACE\w*)\b"
)
# Host memory running out inside torch (its CPU allocator) or inside cuDNN's host side.
_HOST_OOM_TEXT = re.compile(
    r"DefaultCPUAllocator: can't allocate memory|\bCUDNN_STATUS_\w*HOST_ALLOCATION_FAILED\b"
)
# "GPU 0 has a total capacity of ..." (torch >= 2.1) or "(GPU 0; 79.19 GiB total capacity; ...)"
_CUDA_OOM_DEVICE = re.compile(r"\bGPU (\d+)(?: has a total capacity|;)")


def oom_kind(exc: BaseException) -> str | None:
    """``"cuda"`` or ``"host"``: which memory ran out, read from the error itself; None when
    ``exc`` is no out-of-memory error.

    The report follows the error, not the device being traced (audit M2): a host
    allocation failing on a GPU machine is a host report, with host numbers and the CPU
    tensors that hold the memory.
    """
    if isinstance(exc, MemoryError):  # numpy's _ArrayMemoryError included
        return "host"
    if not isinstance(exc, RuntimeError):  # torch.OutOfMemoryError and AcceleratorError are
        return None
    text = str(exc)
    if _CUDA_OOM_TEXT.search(text):
        return "cuda"
    if _HOST_OOM_TEXT.search(text):
        return "host"
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_type is not None and isinstance(exc, oom_type):
        # Another backend's allocator (MPS shares the host's memory): not CUDA's.
        return "host"
    return None


def is_oom(exc: BaseException) -> bool:
    """True for any out-of-memory error :func:`oom_kind` recognises."""
    return oom_kind(exc) is not None


def oom_device_index(exc: BaseException) -> int | None:
    """The CUDA index a caching-allocator OOM message names ("GPU 1 has a total capacity")."""
    m = _CUDA_OOM_DEVICE.search(str(exc))
    return int(m.group(1)) if m else None


def requested_bytes(message: str) -> int | None:
    """The allocation size an OOM message names, in bytes; None when it names none."""
    m = _CPU_ASK.search(message)
    if m:
        return int(m.group(1))
    for pattern in (_CUDA_ASK, _NUMPY_ASK):
        m = pattern.search(message)
        if m:
            unit = m.group(2).upper()
            return int(float(m.group(1)) * _UNITS.get(unit, 1))
    return None


@dataclass
class OomReport:
    """Everything the OOM section shows; all sizes in bytes, None where unknown."""

    device: str  # "cuda:0 (NVIDIA H200)" or "host"
    exception: str  # "OutOfMemoryError: CUDA out of memory. Tried to allocate ..."
    requested: int | None
    free: int | None
    total: int | None
    allocated: int | None
    reserved: int | None
    holders: list[Holder] = field(default_factory=list)
    unnamed_bytes: int = 0  # tensors no name reaches, counted after the release below
    unnamed_count: int = 0
    released: int | None = None  # freed when the failed call's frames were released
    address_limit: int | None = None  # an RLIMIT_AS cap that made the host run out
    address_used: int | None = None
    advice: list[str] = field(default_factory=list)
    requested_note: str = ""  # how to read ``requested`` (the allocator's rounded size)

    @property
    def limit_note(self) -> str:
        if self.address_limit is None:
            return ""
        used = (
            f", {fmt_bytes(self.address_used)} of it in use"
            if self.address_used is not None
            else ""
        )
        return f"the process's address space is capped at {fmt_bytes(self.address_limit)} (RLIMIT_AS){used}"

    @property
    def reserved_unallocated(self) -> int | None:
        if self.reserved is None or self.allocated is None:
            return None
        return max(self.reserved - self.allocated, 0)

    @property
    def fragmented(self) -> bool:
        ru = self.reserved_unallocated
        if ru is None or not self.reserved:
            return False
        return ru >= FRAGMENTATION_MIN_BYTES and ru >= FRAGMENTATION_SHARE * self.reserved


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
    allocated = int(stats.get("allocated_bytes.all.current", 0))
    reserved = int(stats.get("reserved_bytes.all.current", 0))
    free, total = mem_info if mem_info is not None else (None, None)
    report = OomReport(
        device=device,
        exception=_short(exc),
        requested=requested_bytes(str(exc)),
        free=free,
        total=total,
        allocated=allocated,
        reserved=reserved,
        holders=sorted(holders, key=lambda h: -h.nbytes),
        unnamed_bytes=unnamed[0],
        unnamed_count=unnamed[1],
        released=released,
        requested_note=_cuda_request_note(str(exc)),
    )
    report.advice = advice(report, cuda=True, retries=int(stats.get("num_alloc_retries", 0)))
    return report


def _cuda_request_note(message: str) -> str:
    if _CUDA_ASK.search(message):
        # CUDACachingAllocator names alloc_size, not the tensor's size (audit M12): a request
        # up to 1 MiB asks for a 2 MiB block, up to 10 MiB for 20 MiB, a larger one is
        # rounded up to 2 MiB.
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
    report = OomReport(
        device="host",
        exception=_short(exc),
        requested=requested_bytes(str(exc)),
        free=free,
        total=total,
        allocated=rss,
        reserved=None,
        holders=sorted(holders, key=lambda h: -h.nbytes),
        unnamed_bytes=unnamed[0],
        unnamed_count=unnamed[1],
        released=released,
        address_limit=address_limit,
        address_used=address_used,
    )
    report.advice = advice(report, cuda=False)
    return report


def advice(report: OomReport, cuda: bool, retries: int = 0) -> list[str]:
    """What to try, most specific first, from what the report found."""
    roles = {h.role for h in report.holders}
    out: list[str] = []
    if (
        report.requested is not None
        and report.total is not None
        and report.requested > report.total
    ):
        out.append(
            "The single allocation is larger than the whole device: check the tensor's shape "
            "(a wrong dimension or a missing batch split), not just the batch size."
        )
    out.append("Reduce the batch size (or accumulate gradients over smaller micro-batches).")
    if "parameter" in roles:
        out.append(
            "Trade compute for activation memory with gradient checkpointing: "
            "torch.utils.checkpoint.checkpoint / checkpoint_sequential."
        )
        out.append(
            "Run the forward pass under torch.autocast (bf16/fp16) to halve activation memory."
        )
    if "gradient" in roles:
        out.append(
            "Free gradients between steps with optimizer.zero_grad(set_to_none=True) "
            "(the default since torch 2.0) instead of zeroing them."
        )
    if cuda:
        if re.search(r"CU(?:BLAS|SOLVER|SPARSE|DNN)_STATUS|CUFFT_ALLOC", report.exception):
            out.append(
                "A CUDA library could not get memory for its handle or workspace, outside "
                "torch's allocator: torch.cuda.empty_cache() before the call hands the "
                "allocator's cached blocks back to the driver for it."
            )
        out.append(
            "Drop references you no longer need (del x), then torch.cuda.empty_cache() "
            "to hand the cached blocks back."
        )
        if report.fragmented or retries > 0:
            out.append(
                "Much memory is reserved but not allocated (fragmentation): set "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch starts."
            )
    else:
        out.append("Drop references you no longer need (del x; gc.collect()).")
    named = sum(h.nbytes for h in report.holders if h.role != "in the failing call")
    if report.released and report.released > named:
        out.insert(
            1,
            "The failing call itself held more than every named tensor together (activations "
            "kept for the backward pass): a smaller batch, checkpointing or autocast shrink "
            "exactly that.",
        )
    if report.unnamed_bytes and report.allocated and report.unnamed_bytes > 0.25 * report.allocated:
        out.append(
            "Much of the memory is held by tensors no variable names: outputs kept in Out[] "
            "or _, lists of losses without .item(), or a previous exception's traceback "
            "(%reset -f out, or del the container)."
        )
    return out
