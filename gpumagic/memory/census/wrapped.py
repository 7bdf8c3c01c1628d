"""Memory the census would miss behind two of torch's own mechanisms, both of which FSDP2
(``torch.distributed.fsdp.fully_shard``) uses on every step.

* **Wrapper subclasses.** A DTensor (FSDP2's sharded parameters, their gradients, the
  optimizer state made from them) is a ``_make_wrapper_subclass`` tensor whose memory is the
  local tensor inside it (``__tensor_flatten__`` names it). A dispatch mode sees a DTensor
  operation at the DTensor level, and its inner operations run with the mode off, so what a
  DTensor operation allocates is seen only by opening its result; and the wrapper's own
  ``untyped_storage()`` is not the memory (measured, torch 2.13: a sharded parameter counted
  at its global size). :func:`inner_tensors` opens any traceable wrapper subclass.
* **Storage resizes.** FSDP2 frees an unsharded parameter after forward and allocates it
  again before backward with ``untyped_storage().resize_(0)`` and ``resize_(n)``
  (``_fsdp_param.free_storage`` / ``alloc_storage``) so that autograd's saved references stay
  valid; on the CPU (and on fake tensors) that call reaches no dispatcher operation. While the
  census runs, :class:`StorageResizes` wraps ``torch.UntypedStorage.resize_``, as torch's own
  ``MemTracker`` does (``torch/distributed/_tools/mem_tracker.py``, ``_track_resize``), and
  tells each tracker of the new size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

__all__ = ["StorageResizes", "inner_tensors", "is_wrapper", "viewing"]


def is_wrapper(t: Any) -> bool:
    """A tensor whose memory is in the tensors it wraps (DTensor, a float8 wrapper...)."""
    return bool(is_traceable_wrapper_subclass(t))


def inner_tensors(t: Any) -> Iterator[Any]:
    """The tensors holding ``t``'s memory: ``t`` itself, or those its wrappers wrap."""
    if not is_traceable_wrapper_subclass(t):
        yield t
        return
    names, _ = t.__tensor_flatten__()
    for name in names:
        yield from inner_tensors(getattr(t, name))


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
