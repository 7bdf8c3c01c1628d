"""What the user's namespace reaches, read so that no user object breaks the magic: names
are looked up with ``type()`` (``isinstance`` asks the object's ``__class__``, which a lazy
proxy may make raise), containers one level deep and only when small.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

__all__ = [
    "CONTAINER_MAX",
    "history",
    "models_in",
    "named_values",
    "saved_by_graphs",
    "tensors_in",
    "user_items",
]

# Containers the namespace scan looks into (one level, as the out-of-memory report does).
CONTAINER_MAX = 64
# The autograd graphs found at the start are walked up to this many nodes in all.
_GRAPH_NODES_MAX = 20_000
_SKIPPED_NAMES = frozenset(("In", "Out", "exit", "quit", "get_ipython"))
_Tensor = torch.Tensor



def user_items(namespace: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """The user's names (not IPython's history, not private names)."""
    for name, value in list(namespace.items()):
        if name.startswith("_") or name in _SKIPPED_NAMES:
            continue
        yield name, value


def history(namespace: Mapping[str, Any]) -> Iterator[Any]:
    """What IPython's output history keeps alive: ``Out`` and ``_``, ``__``, ``___``."""
    out = namespace.get("Out")
    if type(out) is dict:
        yield from list(out.values())
    for name in ("_", "__", "___"):
        if name in namespace:
            yield namespace[name]


def named_values(value: Any) -> Iterator[Any]:
    """The tensors a name holds: itself, or the elements of a small list, tuple or dict."""
    kind = type(value)  # type() never raises, unlike isinstance on a lazy proxy
    if issubclass(kind, _Tensor):
        yield value
    elif kind in (list, tuple) and len(value) <= CONTAINER_MAX:
        yield from (v for v in value if issubclass(type(v), _Tensor))
    elif kind is dict and len(value) <= CONTAINER_MAX:
        yield from (v for v in list(value.values()) if issubclass(type(v), _Tensor))


def models_in(namespace: Mapping[str, Any], with_names: bool = False) -> tuple[list[Any], list[Any]]:
    modules: list[Any] = []
    optimizers: list[Any] = []
    module_t, optim_t = torch.nn.Module, torch.optim.Optimizer
    for name, value in user_items(namespace):
        kind = type(value)
        if issubclass(kind, module_t):
            modules.append((name, value) if with_names else value)
        elif issubclass(kind, optim_t):
            optimizers.append((name, value) if with_names else value)
    return modules, optimizers


def tensors_in(state: Any) -> Iterable[Any]:
    values = state.values() if type(state) is dict else ()
    return [v for v in values if issubclass(type(v), _Tensor)]


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
