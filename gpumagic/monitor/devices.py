"""Which physical GPUs this process sees, and under which CUDA index.

NVML numbers GPUs by PCI bus order and ignores ``CUDA_VISIBLE_DEVICES``; PyTorch's
``cuda:N`` counts only the visible ones, in the order that variable lists them. A chart
labelled with one numbering while the user thinks in the other points at the wrong GPU,
so every device carries both.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    """One row of every sample: a GPU (``kind="gpu"``) or the host (``kind="host"``)."""

    kind: str
    name: str
    nvml_index: int | None = None  # physical index (nvidia-smi's ``index``)
    cuda_index: int | None = None  # index as CUDA/PyTorch sees it (``cuda:N``)
    uuid: str | None = None

    @property
    def key(self) -> str:
        """``cuda:0`` for a GPU, ``host`` for the host (the ``device`` column)."""
        return f"cuda:{self.cuda_index}" if self.kind == "gpu" else "host"

    @property
    def label(self) -> str:
        """Both numberings when they differ: ``cuda:0 (GPU 2)``; ``GPU 0`` when they agree."""
        if self.kind != "gpu":
            return "host"
        if self.cuda_index == self.nvml_index:
            return f"GPU {self.nvml_index}"
        return f"cuda:{self.cuda_index} (GPU {self.nvml_index})"


def _norm_uuid(uuid: str) -> str:
    return uuid.strip().lower().removeprefix("gpu-")


def parse_visible_devices(
    env: str | None, uuids: Sequence[str | None]
) -> tuple[list[int], list[str]]:
    """NVML indexes of the GPUs CUDA would expose, in CUDA order, plus notes on ignored entries.

    ``env`` is ``CUDA_VISIBLE_DEVICES`` (None when unset); ``uuids`` are the NVML UUIDs by
    NVML index. Follows the CUDA runtime's rules: entries are integer indexes or (prefixes
    of) ``GPU-<uuid>`` strings; the first entry that names no device ends the list, so
    ``0,7,1`` on a 2-GPU box exposes GPU 0 only.
    """
    count = len(uuids)
    if env is None:
        return list(range(count)), []
    chosen: list[int] = []
    notes: list[str] = []
    for raw in env.split(","):
        token = raw.strip()
        if not token:
            break
        index: int | None = None
        if token.lstrip("+-").isdigit():
            number = int(token)
            index = number if 0 <= number < count else None
        elif token.lower().startswith("gpu-"):
            wanted = _norm_uuid(token)
            matches = [
                i for i, u in enumerate(uuids) if u is not None and _norm_uuid(u).startswith(wanted)
            ]
            index = matches[0] if len(matches) == 1 else None
        elif token.lower().startswith("mig-"):
            notes.append(f"CUDA_VISIBLE_DEVICES entry {token!r} is a MIG instance: not watched")
            break
        if index is None or index in chosen:
            notes.append(
                f"CUDA_VISIBLE_DEVICES entry {token!r} names no GPU (or repeats one): "
                "CUDA ignores it and every entry after it"
            )
            break
        chosen.append(index)
    return chosen, notes


def torch_visible_uuids() -> list[str] | None:
    """UUIDs of ``cuda:0..N-1`` from PyTorch, only if this process already initialised CUDA.

    The exact mapping when ``CUDA_DEVICE_ORDER`` is CUDA's default ``FASTEST_FIRST`` (which
    can differ from NVML's PCI order on mixed-GPU machines). Never initialises CUDA itself:
    that would create a context (hundreds of MiB) in a kernel that may not want one.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized() or getattr(torch.version, "hip", None):
            return None
        return [
            f"GPU-{torch.cuda.get_device_properties(i).uuid}"
            for i in range(torch.cuda.device_count())
        ]
    except Exception:  # any torch build quirk: fall back to the environment variable
        return None


def map_from_torch(torch_uuids: Sequence[str], uuids: Sequence[str | None]) -> list[int] | None:
    """NVML indexes for torch's UUID list, or None unless every one is found exactly once."""
    by_uuid = {_norm_uuid(u): i for i, u in enumerate(uuids) if u is not None}
    out: list[int] = []
    for t in torch_uuids:
        index = by_uuid.get(_norm_uuid(t))
        if index is None or index in out:
            return None
        out.append(index)
    return out
