"""Tensors in an operation's arguments, and their storages: the two reads every dispatch-level
layer of a dry run makes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def tensors_in(tree: Any) -> Iterator[torch.Tensor]:
    """The tensors in nested lists, tuples and dicts (an operation's args and kwargs, or its
    outputs)."""
    stack = [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())


def storage_of(t: torch.Tensor) -> Any:
    """``t``'s untyped storage; None for tensors without one (sparse, nested, opaque)."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
