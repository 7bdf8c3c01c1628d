"""Which memory ran out, and how much was asked for, read from the error itself.

The report follows the error, not the device being traced: a host allocation failing on a
GPU machine is a host report, with host numbers and the CPU tensors that hold the memory (a
CUDA report there would show a GPU with room to spare). Every reading of the error's text
goes through :func:`message`, which never raises: an exception whose ``__str__`` raises
says nothing about memory.
"""

from __future__ import annotations

import re
import sys

from gpumagic.device_kinds import CUDA, HOST, DeviceKind

__all__ = ["ASKED", "is_oom", "message", "oom_device_index", "oom_kind", "requested_bytes"]

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

# "CUDA out of memory. Tried to allocate 2.00 GiB." (torch.OutOfMemoryError): the caching
# allocator's rounded block size (see analyse.py)
ASKED = re.compile(r"Tried to allocate ([\d.]+) ?([KMGTP]?i?B)", re.IGNORECASE)
# "DefaultCPUAllocator: can't allocate memory: you tried to allocate 35184372088832 bytes."
_CPU_ASK = re.compile(r"you tried to allocate (\d+) bytes", re.IGNORECASE)
# numpy: "Unable to allocate 32.0 TiB for an array with shape ..."
_NUMPY_ASK = re.compile(r"Unable to allocate ([\d.]+) ?([KMGTP]?i?B)", re.IGNORECASE)

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




def message(exc: BaseException) -> str:
    """``str(exc)``, or "" when the exception's ``__str__`` raises (or returns no string)."""
    try:
        text = str(exc)
    except Exception:
        return ""
    return text if type(text) is str else ""


def oom_kind(exc: BaseException) -> DeviceKind | None:
    """``"cuda"`` or ``"host"``: which memory ran out, read from the error itself (see the
    module docstring); None when ``exc`` is no out-of-memory error."""
    if isinstance(exc, MemoryError):  # numpy's _ArrayMemoryError included
        return HOST
    if not isinstance(exc, RuntimeError):  # torch.OutOfMemoryError and AcceleratorError are
        return None
    text = message(exc)
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
    m = _CUDA_OOM_DEVICE.search(message(exc))
    return int(m.group(1)) if m else None


def requested_bytes(message: str) -> int | None:
    """The allocation size an OOM message names, in bytes; None when it names none."""
    m = _CPU_ASK.search(message)
    if m:
        return int(m.group(1))
    for pattern in (ASKED, _NUMPY_ASK):
        m = pattern.search(message)
        if m:
            unit = m.group(2).upper()
            return int(float(m.group(1)) * _UNITS.get(unit, 1))
    return None
