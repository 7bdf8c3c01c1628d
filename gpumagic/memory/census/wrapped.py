"""Memory the census would miss behind one of torch's own mechanisms, which FSDP2
(``torch.distributed.fsdp.fully_shard``) uses on every step (a DTensor, FSDP2's other one, is
read by what it wraps: :mod:`gpumagic.memory.census.holdings`).

* **Storage resizes.** FSDP2 frees an unsharded parameter after forward and allocates it
  again before backward with ``untyped_storage().resize_(0)`` and ``resize_(n)``
  (``_fsdp_param.free_storage`` / ``alloc_storage``) so that autograd's saved references stay
  valid; on the CPU (and on fake tensors) that call reaches no dispatcher operation. While the
  census runs, :class:`StorageResizes` wraps ``torch.UntypedStorage.resize_``, as torch's own
  ``MemTracker`` does (``torch/distributed/_tools/mem_tracker.py``, ``_track_resize``), and
  tells each tracker of the new size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

__all__ = ["StorageResizes", "viewing"]


def viewing(storage: Any) -> torch.Tensor:
    """A byte tensor over ``storage``, made with the dispatch modes off (the census must not
    see its own bookkeeping as the cell's operations)."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class StorageResizes:
    """While at least one census is active, ``torch.UntypedStorage.resize_`` also calls each
    registered ``resized(storage)``; the original method is put back when the last one leaves.
    A callback's failure is the census's own and never reaches the code that resized."""

    _listeners: ClassVar[list[Callable[[Any], None]]] = []
    _original: ClassVar[Any] = None

    @classmethod
    def add(cls, listener: Callable[[Any], None]) -> None:
        if not cls._listeners:
            cls._original = torch.UntypedStorage.resize_
            original = cls._original
            listeners = cls._listeners

            def resize_(self: Any, size: int) -> Any:
                out = original(self, size)
                for listen in list(listeners):
                    listen(self)
                return out

            torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
        cls._listeners.append(listener)

    @classmethod
    def remove(cls, listener: Callable[[Any], None]) -> None:
        if listener in cls._listeners:
            cls._listeners.remove(listener)
        if not cls._listeners and cls._original is not None:
            torch.UntypedStorage.resize_ = cls._original  # type: ignore[method-assign]
            cls._original = None
