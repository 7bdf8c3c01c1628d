"""The device a ``%%memtrace`` run traces: what it is, how ``--device`` resolves to it, and
which tensors are on it.

Two kinds (:mod:`gpumagic.device_kinds`): a CUDA device, read through the caching
allocator's counters, or the host. On the host the bytes are the CPU's tensors, counted by
the tensor census (:mod:`gpumagic.memory.census.tracker`); without torch, or with ``--no-tensors``,
the process's RSS, which counts pages (library code paged in, freed blocks glibc keeps), not
tensors.

Nothing here initialises torch's CUDA state. ``torch.cuda.current_device()``, the device's
name and its properties all run ``torch.cuda._lazy_init``, after which every ``fork``
(DataLoader workers, multiprocessing) fails with "Cannot re-initialize CUDA in forked
subprocess", in a kernel whose cell may never have touched the GPU. Until CUDA is
initialised the current device is 0 (``torch.cuda.set_device`` initialises it), and the
device's name is read once the cell has initialised CUDA itself (:func:`cuda_device`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpumagic.cell import error_text
from gpumagic.device_kinds import CUDA, HOST, DeviceKind
from gpumagic.memory.trace.readers import CudaMemory

__all__ = [
    "DeviceError",
    "TracedDevice",
    "available_devices",
    "cpu_tensors",
    "cuda_device",
    "resolve_device",
    "tensor_filter",
]


class DeviceError(ValueError):
    """An unknown or unusable ``--device``; the message names the devices there are."""


# How a traced device's bytes are read.
ALLOCATOR, TENSORS, RSS = "allocator", "tensors", "rss"


@dataclass(frozen=True)
class TracedDevice:
    """What a trace tracks: ``cuda:N`` through the allocator, the CPU's tensors, or the
    host's RSS."""

    kind: DeviceKind
    label: str  # "cuda:0 (NVIDIA H200)", "cpu" or "host RSS"
    why: str  # one sentence: why this device, and how peaks are measured
    index: int = -1  # the CUDA index; -1 for the host
    measure: str = RSS  # ALLOCATOR, TENSORS or RSS

    @property
    def pages(self) -> bool:
        """True when the traced bytes are the process's pages (RSS), not tensors."""
        return self.measure == RSS

    def measured_by(self, how: str) -> TracedDevice:
        """The same device, its sentence completed with how the peaks are read (the host's
        method is known once its files are open)."""
        return dataclasses.replace(self, why=f"{self.why}, {how}")

    def holds(self) -> Callable[[Any], bool]:
        """A predicate on tensors: on this device (:func:`tensor_filter`)."""
        return tensor_filter(self.kind, self.index)


def tensor_filter(kind: DeviceKind, index: int = -1) -> Callable[[Any], bool]:
    """A predicate on tensors: on the host (``kind=HOST``) or on ``cuda:index``."""
    # On the probe path for every parameter, gradient and optimizer state (ModelMemory):
    # ``t.device`` builds a torch.device object per call, where ``is_cuda`` and
    # ``get_device()`` read the tensor's own fields.
    if kind == CUDA:
        return lambda t: t.is_cuda and t.get_device() == index
    return lambda t: t.is_cpu


def loaded_torch() -> Any:
    """torch, imported if it is installed (it is the cell's business to have imported it;
    asking what devices exist needs it); None when it is not installed."""
    if "torch" in sys.modules:
        return sys.modules["torch"]
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch


def available_devices() -> list[str]:
    torch = loaded_torch()
    names = [HOST]
    if torch is not None and torch.cuda.is_available():
        names += [f"{CUDA}:{i}" for i in range(torch.cuda.device_count())]
    return names


def _unknown(spec: str | None) -> DeviceError:
    return DeviceError(f"unknown device {spec!r}; devices here: {', '.join(available_devices())}")


def resolve_device(spec: str | None) -> tuple[TracedDevice, CudaMemory | None]:
    """The device ``--device spec`` names, and its reader when it is a CUDA device (read once
    here, so an unreadable allocator fails before the cell runs). ``spec``: None or ``auto``
    (CUDA if there is one), ``host``, ``cpu``, ``cuda`` or ``cuda:N``. Raises
    :class:`DeviceError` for a device that does not exist or cannot be read.

    The host's sentence says why the host is traced; the run completes it with how its peaks
    are read (:meth:`TracedDevice.measured_by`).
    """
    torch = loaded_torch()
    choice = (spec or "").strip().lower()
    cuda_ok = torch is not None and torch.cuda.is_available()
    if choice in ("", "auto") and cuda_ok:
        try:
            return _cuda_device(CUDA, torch)
        except Exception as exc:  # e.g. a broken driver behind PYTORCH_NVML_BASED_CUDA_CHECK=1
            why = f"CUDA is available but unusable ({error_text(exc)}): host RSS"
            return TracedDevice(HOST, "host RSS", why), None
    if choice.startswith(CUDA):
        index_text = choice[5:] if choice.startswith("cuda:") else ""
        if (
            not cuda_ok
            or (index_text and not index_text.isdigit())
            or choice not in (CUDA, f"cuda:{index_text}")
        ):
            raise _unknown(spec)
        try:
            return _cuda_device(choice, torch)
        except DeviceError:
            raise
        except Exception as exc:
            raise DeviceError(
                f"device {spec!r} is unusable: {error_text(exc)}"
            ) from None
    if choice not in ("", "auto", HOST, "cpu"):
        raise _unknown(spec)
    if choice in ("", "auto"):
        if torch is None:
            reason = "torch is not installed"
        elif torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            reason = f"torch {torch.__version__} is a CPU-only build"
        else:
            reason = "torch.cuda.is_available() is False"
        why = f"no CUDA device ({reason}): host RSS"
    else:
        why = "host RSS as asked"
    return TracedDevice(HOST, "host RSS", why), None


def _cuda_device(choice: str, torch: Any) -> tuple[TracedDevice, CudaMemory]:
    """``cuda`` (the current device) or ``cuda:N``, without initialising CUDA."""
    if choice == CUDA:
        index = int(torch.cuda.current_device()) if torch.cuda.is_initialized() else 0
    else:
        index = int(choice[5:])
    if index >= torch.cuda.device_count():
        raise _unknown(choice)
    reader = CudaMemory(torch, index)
    reader.read()  # fails here, before the cell runs, if the allocator cannot be read
    return cuda_device(reader), reader


def cpu_tensors(device: TracedDevice) -> TracedDevice:
    """The host traced through its tensors rather than its RSS (the census is running)."""
    if device.why == "host RSS as asked":
        reason = "the host as asked: "
    else:
        reason = device.why.removesuffix(": host RSS") + ": "
    why = (
        f"{reason}tensor bytes on the CPU, each storage torch allocates seen as it is made and "
        "freed (tensors from before the cell count when a name, a model, an optimizer or an "
        "autograd graph reaches them); the host columns are the process's RSS, which counts "
        "pages, not tensors"
    )
    return dataclasses.replace(device, label="cpu", why=why, measure=TENSORS)


def cuda_device(reader: CudaMemory) -> TracedDevice:
    """The traced device of a CUDA reader, labelled with its name once that is known."""
    why = (
        "CUDA caching allocator counters (torch.cuda.memory_stats_as_nested_dict); "
        "per-statement peaks reset torch.cuda's peak counter at each statement"
    )
    index = reader.index
    label = f"cuda:{index} ({reader.name})" if reader.name else f"cuda:{index}"
    return TracedDevice(CUDA, label, why, index, measure=ALLOCATOR)
