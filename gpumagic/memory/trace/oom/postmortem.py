"""The out-of-memory post-mortem: what was asked for, what is free, what is fragmented, who
holds it, and the release of the failed call's frames.

:func:`post_mortem` is the whole of it, run once when a traced cell fails: which memory ran
out (:func:`oom_kind`), the state at the failure, the holders, the release, what the release
gave back. The report builders under it are pure functions over plain data (an
allocator-stat dictionary of the shape ``torch.cuda.memory_stats()`` returns, numbers from
``/proc`` or psutil, a list of holders) so they are tested without a GPU.
"""

from __future__ import annotations

import os
import re
import resource
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpumagic.cell import error_text
from gpumagic.device_kinds import CUDA, HOST, DeviceKind
from gpumagic.memory.fit.suggest import oom_memfit_line
from gpumagic.memory.trace.device import (
    TENSORS,
    TracedDevice,
    cuda_device,
    loaded_torch,
    tensor_filter,
)
from gpumagic.memory.trace.oom.holders import (
    Holder,
    frame_tensors,
    named_tensors,
    unnamed_tensor_bytes,
)
from gpumagic.memory.trace.readers import CudaMemory, HostMemory, Reader, Reading
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

# The report keeps the error's first line whole: torch's CUDA message is one long line, whose
# end (the allocator's advice) the report's readers search.
_WHOLE_LINE = sys.maxsize
# Fragmentation worth a word: reserved-but-unallocated above this share of the reserved pool.
FRAGMENTATION_SHARE = 0.2
FRAGMENTATION_MIN_BYTES = 256 * 2**20


# Out-of-memory errors that do not come through the caching allocator's own OutOfMemoryError:
# the CUDA runtime failing an allocation (context creation, NCCL, a kernel's
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


def oom_kind(exc: BaseException) -> DeviceKind | None:
    """``"cuda"`` or ``"host"``: which memory ran out, read from the error itself; None when
    ``exc`` is no out-of-memory error.

    The report follows the error, not the device being traced: a host allocation failing
    on a GPU machine is a host report, with host numbers and the CPU tensors that hold the
    memory (a CUDA report there would show a GPU with room to spare).
    """
    if isinstance(exc, MemoryError):  # numpy's _ArrayMemoryError included
        return HOST
    if not isinstance(exc, RuntimeError):  # torch.OutOfMemoryError and AcceleratorError are
        return None
    try:
        text = str(exc)
    except Exception:  # an error whose __str__ raises says nothing about memory
        return None
    if _CUDA_OOM_TEXT.search(text):
        return CUDA
    if _HOST_OOM_TEXT.search(text):
        return HOST
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_type is not None and isinstance(exc, oom_type):
        # Another backend's allocator (MPS shares the host's memory): not CUDA's.
        return HOST
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
    # The tensor census at the failure (None without it): bytes by category, in
    # gpumagic.memory.census.categories' order, and the activations alive by module, largest first.
    categories: tuple[int, ...] | None = None
    activations: list[tuple[str, int]] = field(default_factory=list)
    # The %%memfit line that answers "what fits" (a dry run: nothing allocated, no GPU
    # needed), the report's last word; "" when none was made.
    memfit: str = ""

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


def memfit_next(report: OomReport, sources: Sequence[str], namespace: Mapping[str, Any]) -> str:
    """The ``%%memfit`` line for ``report``'s cell (its statements' ``sources``): the card
    that ran out and the batch-size variable the cell reads (see
    :func:`gpumagic.memory.fit.suggest.oom_memfit_line`)."""
    torch = loaded_torch()
    try:
        gpu_here = bool(torch is not None and torch.cuda.is_available())
        return oom_memfit_line(
            cuda=report.device != HOST,
            device=report.device,
            total=report.total,
            sources=sources,
            namespace=namespace,
            gpu_here=gpu_here,
        )
    except Exception:  # a next step is no reason to lose the report (a user's odd namespace)
        return ""


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
        exception=error_text(exc, _WHOLE_LINE),
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
    report = OomReport(
        device=HOST,
        exception=error_text(exc, _WHOLE_LINE),
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


# ---------------------------------------------------------------------------------------------
# The post-mortem of a traced cell that ran out of memory


@dataclass(frozen=True)
class PostMortem:
    """What :func:`post_mortem` found: the report (None when even building it ran out of
    memory) and the traced device's memory once the failed call's frames were released
    (None when another device's memory ran out, or it could not be read)."""

    report: OomReport | None
    traced_after_release: Reading | None


def post_mortem(
    error: BaseException,
    *,
    traced: TracedDevice,
    reader: Reader,
    host: HostMemory,
    namespace: Mapping[str, Any],
    cell_filename: str | None,
    rss_fallback: int,
) -> PostMortem:
    """Report an out-of-memory ``error``, then release the failed call's frames, then measure
    what the release gave back.

    ``traced``/``reader``: the device the run traced and its reader; ``host``: the host's
    reader; ``cell_filename``: the cell's code name, where the release starts (None: no
    release); ``rss_fallback``: the host's RSS to report when it cannot be read again.

    The report follows the error, not the traced device (:func:`oom_kind`). The state at the
    failure (free, reserved, fragmentation, who holds what) is read first; then the failed
    call's frames are cleared, which frees its activations; what that gave back is reported
    as held by the failing call, and the tensors no name reaches are counted only after it,
    so what remains is what leaks. Building the report must not fail the cell a second
    time: under a tight cap even walking the heap can raise MemoryError, and then a report
    without holders is shown.
    """
    kind = oom_kind(error) or traced.kind
    failed: Reader | None
    if kind == CUDA:
        failed = _cuda_reader_for(error, reader)
        keep = tensor_filter(CUDA, failed.index) if failed is not None else traced.holds()
    else:
        # The release is measured in the CPU's tensors when the census counts them (exact),
        # in RSS pages otherwise; the report's "allocated" stays the RSS either way.
        failed = reader if traced.kind == HOST and traced.measure == TENSORS else host
        keep = tensor_filter(HOST)
    at_failure: dict[str, Any] = {}
    holders: list[Holder] = []
    released: int | None = None
    unnamed = (0, 0)
    before: int | None = None
    after: Reading | None = None
    try:
        try:
            at_failure = _state_at_failure(kind, failed, host)
            holders = list(named_tensors(namespace, keep))
            if cell_filename is not None:
                seen = {h.storage for h in holders}
                holders += frame_tensors(error, cell_filename, keep, seen)
        except MemoryError:
            holders = []
        if failed is not None:
            before = failed.read().current
    finally:
        if cell_filename is not None:
            release_frames(error, cell_filename)
    try:
        if failed is not None and before is not None:
            after = failed.read()
            released = max(before - after.current, 0)
        unnamed = unnamed_tensor_bytes({h.storage for h in holders}, keep)
    except MemoryError:
        pass
    report: OomReport | None
    try:
        report = _build(kind, failed, error, at_failure, holders, unnamed, released, rss_fallback)
    except MemoryError:
        report = None
    return PostMortem(report, after if failed is reader else None)


def _cuda_reader_for(error: BaseException, traced: Reader) -> CudaMemory | None:
    """The traced CUDA reader, or one for the device the error names when the host (or
    another device) is traced; CUDA is initialised by then: the error came from it."""
    index = oom_device_index(error)
    if isinstance(traced, CudaMemory) and (index is None or index == traced.index):
        return traced
    torch = loaded_torch()
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        return CudaMemory(torch, int(torch.cuda.current_device()) if index is None else index)
    except Exception:
        return None


def _state_at_failure(kind: DeviceKind, reader: Reader | None, host: HostMemory) -> dict[str, Any]:
    if kind == CUDA:
        if not isinstance(reader, CudaMemory):
            return {}
        return {"stats": reader.stats(), "mem_info": reader.mem_get_info()}
    import psutil

    vm = psutil.virtual_memory()
    limit, used = _address_space_limit()
    return {
        "rss": host.read().current,
        "available": int(vm.available),
        "total": int(vm.total),
        "limit": limit,
        "used": used,
    }


def _build(
    kind: DeviceKind,
    reader: Reader | None,
    error: BaseException,
    state: dict[str, Any],
    holders: list[Holder],
    unnamed: tuple[int, int],
    released: int | None,
    rss_fallback: int,
) -> OomReport:
    if kind == CUDA:
        if isinstance(reader, CudaMemory):
            label = cuda_device(reader).label if reader.describe() else f"cuda:{reader.index}"
        else:
            label = CUDA
        return build_cuda_report(
            error,
            state.get("stats", {}),
            state.get("mem_info"),
            label,
            holders,
            unnamed,
            released=released,
        )
    return build_host_report(
        error,
        state.get("rss", rss_fallback),
        state.get("available"),
        state.get("total"),
        holders,
        unnamed,
        address_limit=state.get("limit"),
        address_used=state.get("used"),
        released=released,
    )


def _address_space_limit() -> tuple[int | None, int | None]:
    """(RLIMIT_AS soft limit, virtual size in use) when a cap is set, else (None, None)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None, None
    try:
        with open("/proc/self/statm", "rb") as f:
            used: int | None = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        used = None
    return int(soft), used


def release_frames(error: BaseException, cell_filename: str) -> None:
    """Drop the locals of the failed cell's frames so the tensors they hold are freed.

    An OOM's traceback keeps every frame of the failing call alive (and IPython keeps the
    traceback in ``sys.last_traceback``), and with them the activations the user was
    trying to free. Only frames from the cell's own code down are cleared (the magic's
    frames keep what the traceback display needs), and only for OOM errors: for other
    errors the locals stay for ``%debug``.
    """
    seen: set[int] = set()
    exc: BaseException | None = error
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != cell_filename:
            tb = tb.tb_next
        while tb is not None:
            frame = tb.tb_frame
            try:
                frame.clear()
            except RuntimeError:  # still executing: not one of the failed call's frames
                pass
            else:
                # A locals snapshot (frame.f_locals, read by frame_tensors or a debugger)
                # outlives clear() on Python < 3.13; reading it again re-syncs it with the
                # now empty locals, which drops its references.
                _ = frame.f_locals
            tb = tb.tb_next
        exc = exc.__context__


