"""What a dry run's namespace holds deeper than the census looks: models, optimizers and
tensors inside objects and containers (a trainer's ``.model`` and ``.optimizer``, a dict of
batches), named as the namespace reaches them (``trainer.model``).

The census (:mod:`gpumagic.memory.census.reach`) looks at the namespace's names and one level
into small lists, tuples and dicts, which is what ``%%memtrace`` can afford at every
statement. A dry run is given only what the cell reads, once, so it walks a few levels down
(:func:`gpumagic.namespace.walker.walk`: containers, objects' attributes, a bound method's object,
by the namespace's rules) and hands the census what it found: the models and optimizers to
count as if named, and the other tensors the cell was given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from gpumagic.memory.census.reach import named_values
from gpumagic.namespace import DEPTH, is_a, user_items, walk


@dataclass
class Deeper:
    """``models``: (name, module or optimizer) the namespace does not name itself;
    ``tensors``: tensors found below what the census's scan reaches."""

    models: list[tuple[str, Any]] = field(default_factory=list)
    tensors: list[torch.Tensor] = field(default_factory=list)


def deeper(namespace: Mapping[str, Any]) -> Deeper:
    models_t = (torch.nn.Module, torch.optim.Optimizer)
    tensor_t = torch.Tensor
    roots: list[tuple[str, Any]] = []
    counted: list[Any] = []  # what the census counts itself: never reported again
    for name, value in user_items(namespace):
        if is_a(value, models_t):
            counted.append(value)
        else:
            counted += named_values(value)
            roots.append((name, value))
    found = Deeper()
    # models, optimizers and tensors are reached but not looked into: the census counts what
    # a model holds, and a tensor holds no other
    reached = walk(roots, depth=DEPTH, stop=(*models_t, tensor_t), exclude=counted).reached
    for r in reached:
        if r.depth == 0:
            continue
        if is_a(r.value, models_t):
            found.models.append((r.path, r.value))
        elif is_a(r.value, tensor_t):
            found.tensors.append(r.value)
    return found
