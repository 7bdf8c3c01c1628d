"""What the census reaches: the tensors the user's namespace names (a name, or an item of a
small container), its models and optimizers, the tensors inside an optimizer's state or an
operation's arguments, and those the autograd graphs keep for backward. The namespace is
read by :mod:`gpumagic.namespace`'s rules (types by ``type()``, no user code run, IPython's
names left out, containers one level deep and only when small).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from gpumagic.memory.census.categories import GRADIENTS, OPTIMIZER, PARAMETERS
from gpumagic.namespace import history, is_a, module_tensors, small_values, user_items

__all__ = [
    "history",
    "model_tensors",
    "models_in",
    "named_values",
    "saved_by_graphs",
    "storage_of",
    "tensors_in",
    "user_items",
]

# The autograd graphs found at the start are walked up to this many nodes in all.
_GRAPH_NODES_MAX = 20_000
_Tensor = torch.Tensor


def named_values(value: Any) -> Iterator[Any]:
    """The tensors a name holds: itself, or the tensors among a small container's items."""
    if issubclass(type(value), _Tensor):
        yield value
    else:
        yield from (v for v in small_values(value) if issubclass(type(v), _Tensor))


def models_in(namespace: Mapping[str, Any], with_names: bool = False) -> tuple[list[Any], list[Any]]:
    """The models (``nn.Module``) and optimizers the namespace names, with their names if asked."""
    modules: list[Any] = []
    optimizers: list[Any] = []
    module_t, optim_t = torch.nn.Module, torch.optim.Optimizer
    for name, value in user_items(namespace):
        if is_a(value, module_t):
            modules.append((name, value) if with_names else value)
        elif is_a(value, optim_t):
            optimizers.append((name, value) if with_names else value)
    return modules, optimizers


def model_tensors(modules: list[Any], optimizers: list[Any]) -> Iterator[tuple[Any, int]]:
    """(tensor, category) for the parameters, buffers, gradients and optimizer state of
    ``modules`` and ``optimizers``. A model's tensors are read from its modules' tables
    (:func:`gpumagic.namespace.module_tensors`): no method of the user's model runs."""
    for m in modules:
        for _name, role, t in module_tensors(m):
            yield t, PARAMETERS
            if role == "parameter" and t.grad is not None:
                yield t.grad, GRADIENTS
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                yield p, PARAMETERS
                if p.grad is not None:
                    yield p.grad, GRADIENTS
        for state in list(opt.state.values()):
            for t in tensors_in(state):
                yield t, OPTIMIZER


def tensors_in(tree: Any) -> Iterator[Any]:
    """The tensors in nested lists, tuples and dicts: an optimizer's state for a parameter
    (``{'step': ..., 'exp_avg': ...}``), an operation's arguments or outputs."""
    stack = [tree]
    while stack:
        x = stack.pop()
        kind = type(x)
        if issubclass(kind, _Tensor):
            yield x
        elif kind is list or kind is tuple:
            stack.extend(x)
        elif issubclass(kind, (list, tuple)):  # torch.return_types, a namedtuple
            stack.extend((list if issubclass(kind, list) else tuple).__iter__(x))
        elif issubclass(kind, dict):
            stack.extend(dict.values(x))


def storage_of(t: Any) -> Any:
    """``t``'s untyped storage; None for tensors without one (sparse, nested, opaque)."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


_saved_names: dict[type, tuple[str, ...]] = {}


def saved_by_graphs(roots: list[Any]) -> Iterator[Any]:
    """Tensors the autograd graphs under ``roots`` keep for backward (each node's
    ``_saved_*`` attributes; those already freed by a backward pass raise and are skipped)."""
    seen: set[int] = set()
    stack = list(roots)
    while stack and len(seen) < _GRAPH_NODES_MAX:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        kind = type(node)
        names = _saved_names.get(kind)
        if names is None:
            names = _saved_names[kind] = tuple(
                a for a in dir(node) if a.startswith("_saved_")
            )
        for attr in names:
            try:
                value = getattr(node, attr)
            except Exception:  # freed by a backward pass, or not a tensor
                continue
            if issubclass(type(value), _Tensor):
                yield value
            elif type(value) in (list, tuple):
                yield from (v for v in value if issubclass(type(v), _Tensor))
        try:
            nexts = node.next_functions
        except Exception:
            continue
        stack.extend(n for n, _ in nexts if n is not None)
