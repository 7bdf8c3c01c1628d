"""Which modules a sharded run gathers together (its units), and what each parameter is.

The wrapping policy assumed, as people wrap transformers for FSDP and DeepSpeed ZeRO-3:

* a model that names its own repeated block (Hugging Face's ``_no_split_modules``:
  ``GPT2Block``, ``LlamaDecoderLayer``, ...) has each of those modules as a unit, as
  ``transformers`` and ``accelerate`` wrap it (``transformer_auto_wrap_policy``);
* otherwise each repeated block is a unit: the children of an ``nn.ModuleList`` or
  ``nn.Sequential`` that share a class with parameters, two or more of them (a stack of
  ``Block``, the ``Linear`` layers of a plain ``Sequential``);
* the model itself is the root unit, holding every parameter no unit holds (embeddings, the
  final norm, the head), as ``fully_shard(block)`` for each block and then
  ``fully_shard(model)`` leaves them.

A parameter shared by two modules (tied embeddings) belongs to the first unit that holds it,
in that order (the blocks, then the root), as FSDP2 assigns it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from gpumagic.namespace import is_a, user_items

__all__ = ["ParamSpec", "Plan", "UnitSpec", "find_model", "plan_units", "unit_modules"]


@dataclass(frozen=True)
class ParamSpec:
    """One parameter as a sharded run sees it: ``shape``, bytes per element, whether it
    trains, the unit that holds it."""

    name: str
    shape: tuple[int, ...]
    itemsize: int
    trainable: bool
    unit: int
    floating: bool = True

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class UnitSpec:
    name: str
    params: list[int] = field(default_factory=list)  # indices into Plan.params
    root: bool = False


@dataclass
class Plan:
    """The units and the parameters of one model (``objects`` are the parameters themselves,
    in ``params``' order, for the recording run's hooks)."""

    model_name: str
    units: list[UnitSpec]
    params: list[ParamSpec]
    objects: list[Any]
    modules: list[Any]  # the unit's module, in ``units``' order


def find_model(namespace: Any) -> tuple[str, nn.Module] | None:
    """The namespace's largest model that is no part of another (the one a sharded run wraps)."""
    models = [(n, m) for n, m in user_items(namespace) if is_a(m, nn.Module)]
    inner = {id(sub) for _, m in models for sub in list(m.modules())[1:]}
    models = [(n, m) for n, m in models if id(m) not in inner]
    if not models:
        return None
    return max(models, key=lambda nm: sum(p.numel() for p in nm[1].parameters()))


def unit_modules(model: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    """The modules wrapped as units below the root (see the module docstring), outermost
    first, none inside another."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    if names:
        found = [(n, m) for n, m in _outermost(model, lambda m: type(m).__name__ in names)]
        if found:
            return [(_join(prefix, n), m) for n, m in found]
    blocks: list[tuple[str, nn.Module]] = []
    _repeated(model, "", blocks)
    return [(_join(prefix, n), m) for n, m in blocks]


def _outermost(model: nn.Module, wanted: Any) -> Iterator[tuple[str, nn.Module]]:
    stack: list[tuple[str, nn.Module]] = [(n, c) for n, c in reversed(list(model.named_children()))]
    while stack:
        name, m = stack.pop()
        if wanted(m):
            yield name, m
            continue
        stack.extend((f"{name}.{n}", c) for n, c in reversed(list(m.named_children())))


def _repeated(module: nn.Module, prefix: str, out: list[tuple[str, nn.Module]]) -> None:
    for name, child in module.named_children():
        path = _join(prefix, name)
        if isinstance(child, (nn.ModuleList, nn.Sequential)):
            by_class: dict[type, list[tuple[str, nn.Module]]] = {}
            for n, c in child.named_children():
                if any(True for _ in c.parameters()):
                    by_class.setdefault(type(c), []).append((f"{path}.{n}", c))
            repeated = {k for k, v in by_class.items() if len(v) >= 2}
            for n, c in child.named_children():
                if type(c) in repeated and any(True for _ in c.parameters()):
                    out.append((f"{path}.{n}", c))
                else:
                    _repeated(c, f"{path}.{n}", out)
        else:
            _repeated(child, path, out)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def plan_units(model: nn.Module, model_name: str) -> Plan:
    """The units of ``model`` and each parameter's spec (see the module docstring)."""
    blocks = unit_modules(model, model_name)
    units = [UnitSpec(name) for name, _ in blocks] + [UnitSpec(model_name, root=True)]
    modules: list[Any] = [m for _, m in blocks] + [model]
    params: list[ParamSpec] = []
    objects: list[Any] = []
    seen: set[int] = set()
    for index, (module, unit) in enumerate(zip(modules, units)):
        for name, p in module.named_parameters(prefix=unit.name):
            if id(p) in seen:
                continue
            seen.add(id(p))
            unit.params.append(len(params))
            params.append(
                ParamSpec(name, tuple(p.shape) or (1,), p.element_size(), bool(p.requires_grad), index,
                          p.dtype.is_floating_point or p.dtype.is_complex)
            )
            objects.append(p)
    return Plan(model_name, units, params, objects, modules)
