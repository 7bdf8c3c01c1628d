"""The kinds of device gpumagic measures: one vocabulary for every core.

``%%memtrace`` traces a CUDA allocator or the host's RSS; ``%gpuwatch`` samples NVIDIA GPUs
or the host. Both name a kind the same way, and the same way torch and the ``device``
columns do (``cuda:0``, ``host``): a GPU is ``"cuda"``, as in ``torch.device("cuda")``
(ROCm GPUs are ``cuda`` in torch too), and the machine itself is ``"host"`` (not ``cpu``:
what is measured there is the process's or the machine's memory, not a torch device).
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = ["CUDA", "HOST", "DeviceKind", "device_key"]

DeviceKind = Literal["cuda", "host"]

CUDA: Final = "cuda"
HOST: Final = "host"


def device_key(kind: DeviceKind, index: int | None) -> str:
    """``cuda:0`` for CUDA device 0, ``host`` for the host: the ``device`` column's value."""
    return f"{CUDA}:{index}" if kind == CUDA else HOST
