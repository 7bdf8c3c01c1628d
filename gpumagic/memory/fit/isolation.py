"""What keeps a dry run off the user's tensors and objects, however the cell reaches them
(issue 25 items 2 and 4).

The shadow (:mod:`.shadow`) copies the names a cell reads, but a cell reaches further:
``get_ipython().user_ns['w']``, a class attribute (``Cfg.w``), a module's global through a
method (``BUF.add_(1)``), a forward hook whose closure appends to a real list. Two guards:

* **Tensors: converted when used, never written.** :class:`RealTensorsFake`, a
  ``TorchFunctionMode`` on top of the dry run's modes, replaces every real tensor in a call's
  arguments by its fake (``FakeTensorMode.from_tensor``, memoised: the same real tensor is
  always the same fake, the one the shadow holds for it) before any mode, autograd or kernel
  sees it. Without it ``FakeTensorMode`` runs an operation whose inputs are all real for
  real (``w.mul_(0)`` zeroed the user's ``w``), and autograd on a real leaf would give it a
  fake ``.grad``. Reads that give values (``.item()``, ``.tolist()``, ``repr``) read the real
  tensor, as before; ``.numpy()`` of one gives a copy, so a write to the array cannot reach
  it. Setting an attribute through torch (``w.grad = ...``, ``w.data = ...``,
  ``w.requires_grad_()``) sets the fake's.
* **Objects: snapshot and put back.** :func:`kept_objects` walks everything the user's
  names reach (:func:`gpumagic.namespace.walk` through code: containers, objects'
  attributes, the user's classes and modules, ``pyplot``'s open figures) and keeps each
  one's shallow state (a list's items, a dict's, an object's ``__dict__`` and slots, a class's
  attributes, a user module's globals); after the run, every one that differs is put back
  (``LOG.append(1)``, ``Cfg.calls += 1``, a hook's ``keep.append(fake)``, a figure the cell drew
  on); the numpy arrays reached are copied and their values put back, or, past
  :data:`ARRAY_COPY` bytes, made read-only while it runs (a write then stops the dry run). Then the real tensors reached are checked: none written (version counter), none
  holding a fake ``.grad``. What the walk's bounds left unread is said in a note.

Kinds never put back, whose state belongs to running machinery rather than to the cell:
threads, queues, locks, IPython's shell, gpumagic's own objects.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes

from gpumagic.namespace import DEEP, instance_dict, user_items, walk
from gpumagic.namespace.rules import _layout
from gpumagic.namespace.walker import _users_module

# Calls that read values out of a tensor: they read the real one, as before (a fake has no
# values to give); .numpy() and __array__ give a copy.
_READS: set[Any] = {
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__repr__, torch.Tensor.__format__,
    torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__,
    torch.Tensor.__complex__, torch.Tensor.__len__, torch.Tensor.numpy, torch.Tensor.__array__,
}
_COPIES: set[Any] = {torch.Tensor.numpy, torch.Tensor.__array__}
# A numpy array reached up to this size is copied and put back (a library's own arrays,
# which it writes, as matplotlib's transforms do); a larger one is the user's data, made
# read-only while the run lasts rather than copied.
ARRAY_COPY = 16 << 20


def _real(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor)


class RealTensorsFake(TorchFunctionMode):
    """Every real tensor a call is given becomes its fake first (see the module docstring)."""

    def __init__(self, fake_mode: Any) -> None:
        super().__init__()
        self.fake_mode = fake_mode
        self.converted: dict[int, torch.Tensor] = {}  # id -> the real tensor, kept alive for the check

    def fake(self, t: torch.Tensor) -> Any:
        try:
            out = self.fake_mode.from_tensor(t)
        except Exception:  # a subclass it cannot convert (a DTensor): FakeTensorMode decides, as before
            return t
        if id(t) not in self.converted:
            self.converted[id(t)] = t
            # as the shadow does: a one-element CPU tensor keeps its value (a step count)
            if t.numel() <= 1 and t.device.type == "cpu" and not t.requires_grad and out.constant is None:
                with contextlib.suppress(Exception), _disable_current_modes(), torch._C.DisableTorchFunction():
                    out.constant = t.detach().clone()  # a real copy: no mode may see it
                    self.fake_mode.fake_tensor_converter.add_constant_storage_mapping(out)
        return out

    def _swap(self, value: Any) -> Any:
        if _real(value):
            return self.fake(value)
        kind = type(value)
        if (kind is list or kind is tuple) and any(_real(v) for v in value):
            return kind(self.fake(v) if _real(v) else v for v in value)
        return value

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func in _READS and args and _real(args[0]):
            out = func(*args, **kwargs)
            return out.copy() if func in _COPIES else out
        if any(_real(a) or (type(a) in (list, tuple) and any(_real(v) for v in a)) for a in args) or any(
            _real(v) or (type(v) in (list, tuple) and any(_real(x) for x in v)) for v in kwargs.values()
        ):
            args = tuple(self._swap(a) for a in args)
            kwargs = {k: self._swap(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


# Modules whose objects are running machinery, not the cell's data: never put back.
_MACHINERY = (
    "gpumagic", "threading", "_thread", "queue", "multiprocessing", "concurrent", "asyncio",
    "IPython", "ipykernel", "zmq", "traitlets", "logging", "weakref", "_weakrefset",
    "torch._subclasses", "torch._C",
)


@dataclass
class Kept:
    """What :func:`kept_objects` found: ``restored``: paths of objects put back;
    ``written``: real tensors changed all the same (a path, what changed); ``cut``: bounds of
    the walk (what lies beyond was not kept)."""

    restored: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)


@contextlib.contextmanager
def kept_objects(user_ns: Mapping[str, Any], hidden: frozenset[str] | set[str] = frozenset()) -> Iterator[Kept]:
    """Snapshot what the user's names reach; put back what changed when the block ends (see
    the module docstring)."""
    kept = Kept()
    roots = [(k, v) for k, v in user_items(user_ns) if k not in hidden]
    roots.extend(_figures())
    found = walk(roots, depth=DEEP, through_code=True, exclude=[user_ns])
    kept.cut = list(found.cut)
    states: list[tuple[str, Any, str, Any]] = []
    tensors: list[tuple[str, torch.Tensor, int, Any]] = []
    arrays: list[Any] = []  # made read-only while the run lasts
    copies: list[tuple[str, Any, Any]] = []  # (path, array, its values before)
    np: Any = sys.modules.get("numpy")
    for reached in found.reached:
        value = reached.value
        if _real(value):
            tensors.append((reached.path, value, value._version, _grad(value)))
        elif np is not None and type(value) is np.ndarray and value.flags.writeable:
            if value.nbytes <= ARRAY_COPY:
                copies.append((reached.path, value, value.copy()))
            else:
                arrays.append(value)
        snap = _snapshot(value)
        if snap is not None:
            states.append((reached.path, value, snap[0], snap[1]))
            if isinstance(value, torch.nn.Module):
                # its tables (parameters, buffers, submodules, hooks): the walk reads
                # what is in them, not them
                for name, table in dict.items(instance_dict(value) or {}):
                    inner = _snapshot(table) if type(table) is not list and isinstance(table, dict) else None
                    if inner is not None:
                        states.append((f"{reached.path}.{name}", table, inner[0], inner[1]))
    try:
        for a in arrays:
            with contextlib.suppress(ValueError):
                a.flags.writeable = False
        yield kept
    finally:
        for a in arrays:
            with contextlib.suppress(ValueError):
                a.flags.writeable = True
        for path, a, values in copies:
            with contextlib.suppress(Exception):
                if not np.array_equal(a, values, equal_nan=a.dtype.kind in "fc"):
                    np.copyto(a, values)
                    kept.restored.append(path)
        for path, value, kind, snap in states:
            with contextlib.suppress(Exception):
                if _put_back(value, kind, snap):
                    kept.restored.append(path)
        for path, t, version, grad in tensors:
            if t._version != version:
                kept.written.append(f"{path} (its data)")
            if _grad(t) is not grad:
                with contextlib.suppress(Exception):
                    t.grad = grad
                kept.written.append(f"{path} (its .grad, put back)")


def _grad(t: torch.Tensor) -> Any:
    # read only where torch keeps one: another non-leaf's .grad warns
    return t.grad if t.is_leaf or t.retains_grad else None


def _machinery(kind: type) -> bool:
    module = vars(kind).get("__module__", "")
    return type(module) is str and module.startswith(_MACHINERY)


def _snapshot(value: Any) -> tuple[str, Any] | None:
    """(kind, shallow state) of ``value``, or None when there is nothing to keep."""
    kind = type(value)
    if _machinery(kind):
        return None
    if issubclass(kind, list):
        return "list", list.copy(value)
    if issubclass(kind, dict):
        return "dict", list(dict.items(value))
    if issubclass(kind, set):
        return "set", set.copy(value)
    if issubclass(kind, bytearray):
        return "bytearray", bytes(value)
    if issubclass(kind, type):
        return "class", dict(vars(value)) if _users_module(str(vars(value).get("__module__", ""))) else None
    if issubclass(kind, types.ModuleType):
        name = vars(value).get("__name__")
        if type(name) is str and name != "__main__" and _users_module(name):
            return "module", list(dict.items(vars(value)))
        return None
    own = instance_dict(value)
    slots = []
    for name, slot in _layout(kind)[1]:
        try:
            slots.append((name, slot, slot.__get__(value, kind)))
        except Exception:  # an unset slot
            continue
    if own is None and not slots:
        return None
    return "object", (list(dict.items(own)) if own is not None else None, slots)


def _same_items(now: list[tuple[Any, Any]], before: list[tuple[Any, Any]]) -> bool:
    return len(now) == len(before) and all(a is c and b is d for (a, b), (c, d) in zip(now, before))


def _refill(d: dict[Any, Any], items: list[tuple[Any, Any]]) -> None:
    kind = type(d)
    # an OrderedDict keeps its order outside the dict: its own methods, not dict's
    clear, update = (kind.clear, kind.update) if kind.__module__ == "collections" else (dict.clear, dict.update)
    clear(d)
    update(d, items)


def _put_back(value: Any, kind: str, snap: Any) -> bool:
    """Put ``value``'s shallow state back if it changed; whether it had."""
    if kind == "list":
        if len(value) == len(snap) and all(a is b for a, b in zip(list.__iter__(value), snap)):
            return False
        list.__setitem__(value, slice(None), snap)
        return True
    if kind == "dict":
        if _same_items(list(dict.items(value)), snap):
            return False
        _refill(value, snap)
        return True
    if kind == "set":
        if set.__len__(value) == len(snap) and all(set.__contains__(value, x) for x in snap):
            return False
        set.clear(value)
        set.update(value, snap)
        return True
    if kind == "bytearray":
        if bytes(value) == snap:
            return False
        value[:] = snap
        return True
    if kind == "class":
        return _put_back_class(value, snap)
    if kind == "module":
        return _put_back_module(vars(value), snap)
    own_items, slots = snap
    changed = False
    own = instance_dict(value)
    if own is not None and own_items is not None and not _same_items(list(dict.items(own)), own_items):
        _refill(own, own_items)
        changed = True
    for _name, slot, before in slots:
        try:
            now = slot.__get__(value, type(value))
        except Exception:
            now = _UNSET
        if now is not before:
            slot.__set__(value, before)
            changed = True
    return changed


_UNSET = object()


def _put_back_class(cls: type, before: dict[str, Any]) -> bool:
    now = dict(vars(cls))
    changed = False
    for k, v in before.items():
        if now.get(k, _UNSET) is not v and k not in ("__dict__", "__weakref__"):
            type.__setattr__(cls, k, v)
            changed = True
    for k in now.keys() - before.keys():
        type.__delattr__(cls, k)
        changed = True
    return changed


def _put_back_module(globals_: dict[str, Any], before: list[tuple[Any, Any]]) -> bool:
    """A user module's globals put back; a submodule imported meanwhile stays (the import
    system set it, and ``sys.modules`` keeps it)."""
    old = dict(before)
    changed = False
    for k, v in before:
        if globals_.get(k, _UNSET) is not v:
            globals_[k] = v
            changed = True
    for k in [k for k in globals_ if k not in old]:
        if not isinstance(globals_[k], types.ModuleType):
            del globals_[k]
            changed = True
    return changed


def _figures() -> list[tuple[str, Any]]:
    """pyplot's open figures, where pyplot is loaded: a cell may draw on them (the figures it
    opens are the magic's to close, :func:`gpumagic.magics.memfit`)."""
    helpers = sys.modules.get("matplotlib._pylab_helpers")
    figures = getattr(getattr(helpers, "Gcf", None), "figs", None)
    if not isinstance(figures, dict):
        return []
    out = []
    for number, manager in list(figures.items()):
        figure = getattr(getattr(manager, "canvas", None), "figure", None)
        if figure is not None:
            out.append((f"plt.figure({number})", figure))
    return out


__all__ = ["Kept", "RealTensorsFake", "kept_objects"]
