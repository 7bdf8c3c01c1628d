"""Which tensors a dry run can count: those with one strided storage.

A sparse tensor has no storage of its own to weigh (``untyped_storage()`` raises
``NotImplementedError: Cannot access storage of SparseTensorImpl``), and an
``nn.Embedding(sparse=True)`` makes one as its gradient at every ``backward()``: one such model
in the namespace stopped every ``%%memfit`` with torch's raw error (issue 25, item 6). The
census is handed a ``keep`` that passes over every layout but the strided one, and the
layouts passed over are named in the report's notes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["strided_only"]


def strided_only(keep: Callable[[Any], bool], passed_over: set[str]) -> Callable[[Any], bool]:
    """``keep`` for strided tensors; any other layout is not counted and its name goes into
    ``passed_over`` (``torch.sparse_coo``)."""
    strided = torch.strided

    def counted(t: Any) -> bool:
        layout = t.layout
        if layout is not strided:
            passed_over.add(str(layout))
            return False
        return keep(t)

    return counted
