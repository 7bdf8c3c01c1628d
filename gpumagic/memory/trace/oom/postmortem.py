"""The out-of-memory post-mortem of a traced cell, in order: which memory ran out
(:mod:`.detect`), the state at the failure and who holds the memory (:mod:`.holders`), the
release of the failed call's frames (:mod:`.release`), what the release gave back, and the
report (:mod:`.analyse`, :mod:`.model`, :mod:`.advice`).
"""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpumagic.device_kinds import CUDA, HOST, DeviceKind
from gpumagic.memory.trace.device import (
    TENSORS,
    TracedDevice,
    cuda_device,
    loaded_torch,
    tensor_filter,
)
from gpumagic.memory.trace.oom.analyse import build_cuda_report, build_host_report
from gpumagic.memory.trace.oom.detect import oom_device_index, oom_kind
from gpumagic.memory.trace.oom.holders import (
    Holder,
    frame_tensors,
    named_tensors,
    unnamed_tensor_bytes,
)
from gpumagic.memory.trace.oom.model import OomReport
from gpumagic.memory.trace.oom.release import release_frames
from gpumagic.memory.trace.readers import CudaMemory, HostMemory, Reader, Reading

__all__ = ["PostMortem", "post_mortem"]


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
