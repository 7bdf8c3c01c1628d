"""The dry run's namespace: a shadow of the names the cell uses, tensors made fake.

What the cell reads is copied once into a fresh dict, with one ``copy.deepcopy`` memo:

* every tensor becomes a fake one (``FakeTensorMode.from_tensor``: same shape, dtype,
  device, ``requires_grad`` and ``.grad``, views sharing one fake storage); one-element CPU
  tensors keep their value as the fake's constant, so an optimizer's step count stays
  exact;
* models, optimizers, lists, dicts and the user's own objects are deep-copied through that
  memo, so a model, its optimizer and a trainer holding both still share one set of fake
  parameters, and the cell's appends, ``+=`` and attribute changes land in the copies;
* functions the notebook defined are rebound to the shadow (a copy of the function whose
  globals are the shadow dict), so ``train_step(model, x)`` reads the fake ``model``;
* numpy arrays are shared as read-only views (a dataset is not duplicated in RAM, and a
  write raises instead of changing the user's data);
* modules, classes and other functions are used as they are. An object that cannot be
  copied (it holds a lock, a file, a thread) is used as it is and the report says so; an
  iterator or generator is refused, because advancing it would change the user's. Each
  value is told by its ``type()`` (:func:`gpumagic.namespace.is_a`): a proxy's
  ``__class__`` is not asked.

Which names: those the cell's code reads, and, through the notebook's functions it calls,
the names their code reads. Nothing is written to the user's namespace; the bindings are
compared after the run anyway (a method of a class defined in the notebook still reads and
writes the real globals) and any changed binding is put back.
"""

from __future__ import annotations

import contextlib
import copy
import io
import types
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from gpumagic.cell import error_text
from gpumagic.namespace import is_a


class ShadowError(RuntimeError):
    """A name the cell uses cannot be given to a dry run."""


@dataclass
class Shadow:
    namespace: dict[str, Any]
    copied: list[str] = field(default_factory=list)
    as_is: list[tuple[str, str]] = field(default_factory=list)  # (name, why)


def code_names(codes: Iterable[types.CodeType | None]) -> set[str]:
    """Every name the code objects (and the functions, classes and comprehensions inside
    them) load."""
    names: set[str] = set()
    stack = [c for c in codes if c is not None]
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        names.update(code.co_freevars)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return names


def referenced_names(codes: Iterable[types.CodeType | None], user_ns: Mapping[str, Any]) -> list[str]:
    """The names of ``user_ns`` the cell reads, directly or through the notebook's functions."""
    todo = list(code_names(codes))
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in user_ns:
            continue
        seen.add(name)
        value = user_ns[name]
        if _notebook_function(value, user_ns):
            todo.extend(code_names([value.__code__]))
    return sorted(seen)


def _notebook_function(value: Any, user_ns: Mapping[str, Any]) -> bool:
    return is_a(value, types.FunctionType) and value.__globals__ is user_ns


@contextlib.contextmanager
def tensors_become_fakes(fake_mode: Any) -> Iterator[None]:
    """While it lasts, ``copy.deepcopy`` turns tensors into fakes and numpy arrays into
    read-only views (the copy module's per-type table, put back afterwards)."""
    import numpy as np

    def fake(t: torch.Tensor, memo: dict[int, Any]) -> Any:
        out = fake_mode.from_tensor(t)
        if t.numel() <= 1 and t.device.type == "cpu" and not t.requires_grad:
            with contextlib.suppress(Exception):  # the value of a step count, kept exact
                out.constant = t.detach().clone()
                fake_mode.fake_tensor_converter.add_constant_storage_mapping(out)
        return out

    def read_only(a: Any, memo: dict[int, Any]) -> Any:
        view = a.view()
        view.flags.writeable = False
        return view

    table = copy._deepcopy_dispatch  # type: ignore[attr-defined]
    saved = {k: table.get(k) for k in (torch.Tensor, torch.nn.Parameter, np.ndarray)}
    table[torch.Tensor] = fake
    table[torch.nn.Parameter] = fake
    table[np.ndarray] = read_only
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                table.pop(k, None)
            else:
                table[k] = v


def build_shadow(
    names: Iterable[str],
    user_ns: Mapping[str, Any],
    fake_mode: Any,
    hidden: Iterable[str] = (),
) -> Shadow:
    """The shadow namespace of ``names`` (see the module docstring)."""
    hidden = set(hidden)
    ns: dict[str, Any] = {"__builtins__": user_ns.get("__builtins__", __builtins__), "__name__": "__main__"}
    shadow = Shadow(ns)
    memo: dict[int, Any] = {}
    functions: list[str] = []
    with tensors_become_fakes(fake_mode):
        for name in names:
            value = user_ns[name]
            if name in hidden or name.startswith("__") or _kept_as_is(value):
                ns[name] = value
            elif _notebook_function(value, user_ns):
                functions.append(name)
            elif is_a(value, (types.GeneratorType, Iterator)) and not is_a(value, io.IOBase):
                raise ShadowError(
                    f"`{name}` is an iterator ({type(value).__name__}): a dry run cannot copy it, "
                    "and advancing it would change yours. Take a batch from it before the cell "
                    f"(x, y = next({name})) or make one in the cell (torch.randn(...))."
                )
            else:
                try:
                    ns[name] = copy.deepcopy(value, memo)
                    shadow.copied.append(name)
                except Exception as exc:  # a lock, a file, a thread inside
                    ns[name] = value
                    shadow.as_is.append((name, error_text(exc, 120)))
        for name in functions:
            ns[name] = _rebound(user_ns[name], ns, memo)
    return shadow


def _kept_as_is(value: Any) -> bool:
    return is_a(
        value,
        (types.ModuleType, type, types.BuiltinFunctionType, types.BuiltinMethodType,
         torch.device, torch.dtype, str, bytes, int, float, bool, type(None)),
    ) or (is_a(value, types.FunctionType) and value.__module__ != "__main__")


def _rebound(fn: types.FunctionType, ns: dict[str, Any], memo: dict[int, Any]) -> types.FunctionType:
    """``fn`` with the shadow as its globals; its defaults and closure copied like the rest."""
    closure = None
    if fn.__closure__:
        closure = tuple(
            types.CellType(copy.deepcopy(c.cell_contents, memo)) if _filled(c) else types.CellType()
            for c in fn.__closure__
        )
    new = types.FunctionType(fn.__code__, ns, fn.__name__, copy.deepcopy(fn.__defaults__, memo), closure)
    new.__kwdefaults__ = copy.deepcopy(fn.__kwdefaults__, memo)
    new.__qualname__ = fn.__qualname__
    new.__dict__.update(fn.__dict__)
    new.__module__ = fn.__module__
    return new


def _filled(cell: Any) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:  # a cell not yet bound (a name the closure assigns later)
        return False
    return True


@contextlib.contextmanager
def bindings_kept(user_ns: dict[str, Any], changed: list[str]) -> Iterator[None]:
    """Puts back any binding of ``user_ns`` that changed while the block ran (a method of a
    class defined in the notebook writes the real globals), naming them in ``changed``."""
    before = dict(user_ns)
    try:
        yield
    finally:
        for name in [n for n in user_ns if n not in before]:
            del user_ns[name]
            changed.append(name)
        for name, value in before.items():
            if user_ns.get(name, value) is not value or name not in user_ns:
                user_ns[name] = value
                changed.append(name)
