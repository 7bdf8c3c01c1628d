"""Who owns which tensors, read off a namespace: modules (parameters, buffers, gradients)
and optimizers (state), named as the namespace names them (``model.layer1.0.conv1``).

The walk goes through the namespace's values and, a few levels down, through lists, tuples,
dicts and plain objects' attributes (a trainer holding ``.model`` and ``.optimizer``), so the
names a report shows are the ones a user typed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpumagic.memory.fit.accounting import (
    GRADIENTS,
    INPUTS,
    OPTIMIZER_STATE,
    PARAMETERS,
    AccountingScope,
)

_DEPTH = 3  # how far into containers and attributes the walk looks


@dataclass
class Owners:
    """Modules and optimizers found, by the first name that reaches each, and the plain
    tensors the namespace holds (the cell's inputs)."""

    modules: dict[int, tuple[str, Any]] = field(default_factory=dict)  # id -> (name, module)
    optimizers: list[tuple[str, Any]] = field(default_factory=list)
    plain: list[tuple[str, Any]] = field(default_factory=list)
    _rebuilt_at: int = -2
    _param_owner: dict[int, str] | None = None

    def owner_of(self, param: Any) -> str:
        """The name of the module that holds ``param`` ("" when none found holds it)."""
        if self._param_owner is None:
            self._param_owner = {
                id(p): name
                for name, module in self.modules.values()
                for p in module._parameters.values()
                if p is not None
            }
        return self._param_owner.get(id(param), "")

    def tensors(self) -> Iterator[tuple[Any, str, str]]:
        """(tensor, category, module name) for everything owned, strongest owners first."""
        param_owner: dict[int, str] = {}
        for name, module in self.modules.values():
            for p in module._parameters.values():
                if p is None:
                    continue
                param_owner.setdefault(id(p), name)
                yield p, PARAMETERS, name
                if p.grad is not None:
                    yield p.grad, GRADIENTS, name
            for b in module._buffers.values():
                if b is not None:
                    yield b, PARAMETERS, name
        for _, opt in self.optimizers:
            for group in getattr(opt, "param_groups", []):
                for p in group.get("params", []):
                    owner = param_owner.get(id(p), "")
                    yield p, PARAMETERS, owner
                    if getattr(p, "grad", None) is not None:
                        yield p.grad, GRADIENTS, owner
            for p, state in getattr(opt, "state", {}).items():
                if isinstance(state, Mapping):
                    owner = param_owner.get(id(p), "")
                    for value in state.values():
                        if _is_tensor(value):
                            yield value, OPTIMIZER_STATE, owner
        for _, t in self.plain:
            yield t, INPUTS, ""

    def module_name(self, module: Any, scope: AccountingScope) -> str:
        """The namespace's name for ``module``; a module made after the walk (a model the cell
        builds) is looked up again once per statement, then named by its class."""
        found = self.modules.get(id(module))
        if found is None:
            now = scope.statement()
            if now != self._rebuilt_at:
                self._rebuilt_at = now
                self.modules.update(find_owners(scope.namespace).modules)
                self._param_owner = None
                found = self.modules.get(id(module))
        if found is None:
            return type(module).__name__
        return found[0]


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def find_owners(namespace: Mapping[str, object]) -> Owners:
    import torch

    owners = Owners()
    seen: set[int] = set()
    stack: list[tuple[str, Any, int]] = [
        (name, value, 0)
        for name, value in reversed(list(namespace.items()))
        if not name.startswith("_")
    ]
    while stack:
        name, x, depth = stack.pop()
        if id(x) in seen or isinstance(x, (str, bytes, int, float, bool, type(None))):
            continue
        seen.add(id(x))
        if isinstance(x, torch.nn.Module):
            for sub, m in x.named_modules(prefix=name):
                owners.modules.setdefault(id(m), (sub, m))
            continue
        if isinstance(x, torch.optim.Optimizer):
            owners.optimizers.append((name, x))
            continue
        if isinstance(x, torch.Tensor):
            owners.plain.append((name, x))
            continue
        if depth >= _DEPTH or isinstance(x, type) or (callable(x) and not hasattr(x, "__dict__")):
            continue
        children: list[tuple[str, Any]] = []
        if isinstance(x, Mapping):
            children = [(f"{name}[{k!r}]", v) for k, v in list(x.items())[:1000]]
        elif isinstance(x, (list, tuple)):
            children = [(f"{name}[{i}]", v) for i, v in enumerate(x[:1000])]
        elif _plain_object(x):
            children = [(f"{name}.{k}", v) for k, v in list(vars(x).items())[:200]]
        stack.extend((n, v, depth + 1) for n, v in reversed(children))
    return owners


def _plain_object(x: Any) -> bool:
    """An instance of a class with a ``__dict__`` that is not a module, function or class:
    a trainer, a config, a scheduler (which holds its optimizer)."""
    import types

    if isinstance(x, (types.ModuleType, types.FunctionType, types.MethodType, type)):
        return False
    return hasattr(x, "__dict__")
