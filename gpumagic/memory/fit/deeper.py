"""What a dry run's namespace holds deeper than the census looks: models, optimizers and
tensors inside objects and containers (a trainer's ``.model`` and ``.optimizer``, a dict of
batches), named as the namespace reaches them (``trainer.model``).

The census (:mod:`gpumagic.memory.census.reach`) looks at the namespace's names and one level into
small lists, tuples and dicts, which is what ``%%memtrace`` can afford at every statement. A
dry run is given only what the cell reads, once, so it walks a few levels down, through
lists, tuples, dicts and plain objects' attributes, and hands the census what it found: the
models and optimizers to count as if named, and the other tensors the cell was given.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from gpumagic.memory.census.reach import named_values, user_items

_DEPTH = 3  # how far into containers and attributes the walk looks
_ITEMS = 1000  # elements of one container looked at
_ATTRIBUTES = 200  # attributes of one object looked at


@dataclass
class Deeper:
    """``models``: (name, module or optimizer) the namespace does not name itself;
    ``tensors``: tensors found below what the census's scan reaches."""

    models: list[tuple[str, Any]] = field(default_factory=list)
    tensors: list[torch.Tensor] = field(default_factory=list)


def deeper(namespace: Mapping[str, Any]) -> Deeper:
    found = Deeper()
    module_t, optim_t, tensor_t = torch.nn.Module, torch.optim.Optimizer, torch.Tensor
    seen: set[int] = set()
    stack: list[tuple[str, Any, int]] = []
    for name, value in user_items(namespace):
        if issubclass(type(value), (module_t, optim_t)):
            seen.add(id(value))  # the census counts these itself
            continue
        seen.update(id(t) for t in named_values(value))
        stack.append((name, value, 0))
    stack.reverse()
    while stack:
        name, x, depth = stack.pop()
        kind = type(x)  # type(), never isinstance: a lazy proxy's __class__ may raise
        if id(x) in seen or kind in (str, bytes, int, float, bool, type(None)):
            continue
        seen.add(id(x))
        if issubclass(kind, (module_t, optim_t)):
            found.models.append((name, x))
        elif issubclass(kind, tensor_t):
            found.tensors.append(x)
        elif depth < _DEPTH:
            children = _children(name, x, kind)
            stack.extend((n, v, depth + 1) for n, v in reversed(children))
    return found


def _children(name: str, x: Any, kind: type) -> list[tuple[str, Any]]:
    """What ``x`` holds, named; nothing when reading it fails (the user's object decides)."""
    try:
        if issubclass(kind, Mapping):
            return [(f"{name}[{k!r}]", v) for k, v in list(x.items())[:_ITEMS]]
        if kind in (list, tuple):
            return [(f"{name}[{i}]", v) for i, v in enumerate(x[:_ITEMS])]
        if _plain_object(x, kind):
            return [(f"{name}.{k}", v) for k, v in list(vars(x).items())[:_ATTRIBUTES]]
    except Exception:
        pass
    return []


def _plain_object(x: Any, kind: type) -> bool:
    """An instance of a class with a ``__dict__`` that is not a module, function or class:
    a trainer, a config, a scheduler (which holds its optimizer)."""
    if issubclass(kind, (types.ModuleType, types.FunctionType, types.MethodType, type)):
        return False
    return hasattr(x, "__dict__")
