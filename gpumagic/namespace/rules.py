"""What is safe to read of a user's namespace, and the one-level reads (see
:mod:`gpumagic.namespace` for the rules and why)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, TypeGuard, TypeVar, overload

__all__ = [
    "IPYTHON_NAMES",
    "SMALL",
    "attributes",
    "history",
    "instance_dict",
    "is_a",
    "is_user_name",
    "key_text",
    "module_tensors",
    "own_tensors",
    "small_items",
    "small_values",
    "submodules",
    "type_name",
    "user_items",
]

_T = TypeVar("_T")

# IPython puts these in every namespace; they are not the user's data.
IPYTHON_NAMES: Final = frozenset(("In", "Out", "exit", "quit", "get_ipython"))
# "A small container": the one-level scans (the census at every statement boundary, the
# out-of-memory report) look into lists, tuples and dicts of at most this many items; a
# list of a million floats is not worth reading at every statement.
SMALL: Final = 64

# Kinds with nothing inside that could hold a tensor.
ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), range, slice, memoryview)
SIMPLE_KEYS = (str, int, float, bool, bytes, type(None))
# The built-in descriptors every read goes through (a metaclass's or a class's own code
# cannot intervene).
_TYPE_NAME: Any = vars(type)["__name__"]
_TYPE_MRO: Any = vars(type)["__mro__"]
_TYPE_DICT: Any = vars(type)["__dict__"]
_TYPE_FLAGS: Any = vars(type)["__flags__"]
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement


# -- kinds, names and keys ------------------------------------------------------------------------


@overload
def is_a(value: Any, kinds: type[_T]) -> TypeGuard[_T]: ...
@overload
def is_a(value: Any, kinds: tuple[type, ...]) -> bool: ...
def is_a(value: Any, kinds: type | tuple[type, ...]) -> bool:
    """``isinstance`` by the object's real type: ``type()`` never raises and never lies,
    where ``isinstance`` also asks ``value.__class__``, a property a lazy proxy may make
    raise, or answer with the class of what it wraps."""
    return issubclass(type(value), kinds)


def type_name(kind: type) -> str:
    """A class's name, read from the class itself (a metaclass cannot intervene)."""
    return str(_TYPE_NAME.__get__(kind))


def is_user_name(name: str) -> bool:
    """Whether a namespace name is the user's: not IPython's own, not private (IPython's
    output history is ``_``, ``__``, ``_5``, its input history ``_i``, ``_i5``)."""
    return not name.startswith("_") and name not in IPYTHON_NAMES


def user_items(namespace: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The user's (name, value) pairs of ``namespace``, as they are now."""
    return [(k, v) for k, v in list(namespace.items()) if type(k) is str and is_user_name(k)]


def history(namespace: Mapping[str, Any]) -> list[Any]:
    """What IPython's output history keeps alive: ``Out``'s values and ``_``, ``__``, ``___``."""
    kept: list[Any] = []
    out = namespace.get("Out")
    if type(out) is dict:
        kept += list(out.values())
    kept += [namespace[name] for name in ("_", "__", "___") if name in namespace]
    return kept


def key_text(key: Any) -> str | None:
    """How a dict key is written in a path: its ``repr`` for a string, a number, ``None``
    (the built-in types' own, which cannot run user code); None for any other key."""
    if type(key) in SIMPLE_KEYS:
        text = repr(key)
        return text if len(text) <= 80 else text[:77] + "..."
    return None


# -- one level ----------------------------------------------------------------------------------


def small_values(value: Any) -> Sequence[Any]:
    """The items of ``value`` when it is a small list, tuple or dict (its values), else ().
    On the census's path at every statement boundary: the common kinds are tested first."""
    kind = type(value)
    if kind is list or kind is tuple:
        return value if len(value) <= SMALL else ()
    if kind is dict:
        return list(value.values()) if len(value) <= SMALL else ()
    if issubclass(kind, (list, tuple)):
        base: Any = list if issubclass(kind, list) else tuple
        return list(base.__iter__(value)) if base.__len__(value) <= SMALL else ()
    if issubclass(kind, dict):
        return list(dict.values(value)) if dict.__len__(value) <= SMALL else ()
    return ()


def small_items(value: Any) -> list[tuple[str, Any]]:
    """``small_values`` with each item's step of a path: ``[0]``, ``['key']`` (a key that is
    no string or number is written ``[<KeyType>]``)."""
    kind = type(value)
    if issubclass(kind, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(small_values(value))]
    if issubclass(kind, dict) and dict.__len__(value) <= SMALL:
        return [
            (f"[{key_text(k) or '<' + type_name(type(k)) + '>'}]", v)
            for k, v in list(dict.items(value))
        ]
    return []


def instance_dict(value: Any) -> dict[str, Any] | None:
    """``value``'s instance ``__dict__``, read through the built-in descriptor its class
    inherits (None for an object without one, or whose class defines its own ``__dict__``:
    that would be the class's code). Read it with ``dict``'s own methods and string keys."""
    get_dict, _ = _layout(type(value))
    if get_dict is None:
        return None
    try:
        own = get_dict.__get__(value, type(value))
    except Exception:
        return None
    return own if type(own) is dict else None


def attributes(value: Any) -> list[tuple[str, Any]]:
    """``value``'s own attributes (its instance ``__dict__``, then its slots), read through
    the built-in descriptors: nothing of the object's class runs. Empty for an object whose
    class defines its own ``__dict__`` (a property), or that has none."""
    kind = type(value)
    own = instance_dict(value)
    found = [(k, v) for k, v in list(own.items()) if type(k) is str] if own is not None else []
    for name, slot in _layout(kind)[1]:
        try:
            found.append((name, slot.__get__(value, kind)))
        except Exception:  # an unset slot
            continue
    return found


# Per class: the built-in ``__dict__`` descriptor (None: not read) and the slots. By id, with
# the class kept alive beside it: a class's own hash may be a metaclass's code.
_layouts: dict[int, tuple[type, Any, tuple[tuple[str, Any], ...]]] = {}


def _layout(kind: type) -> tuple[Any, tuple[tuple[str, Any], ...]]:
    hit = _layouts.get(id(kind))
    if hit is not None and hit[0] is kind:
        return hit[1], hit[2]
    get_dict: Any = None
    decided = False
    slots: list[tuple[str, Any]] = []
    for klass in _TYPE_MRO.__get__(kind):
        own = _TYPE_DICT.__get__(klass)
        if not decided and "__dict__" in own:
            descriptor = own["__dict__"]
            # the one every class with instance dictionaries inherits; anything else is the
            # class's own code (a property), which is not run
            get_dict = descriptor if type(descriptor) is types.GetSetDescriptorType else None
            decided = True
        if _TYPE_FLAGS.__get__(klass) & _HEAP_TYPE:
            # a class's own __slots__; a built-in type's members (a function's __globals__,
            # __builtins__) are its machinery, not data the user put there
            slots += [(n, d) for n, d in own.items() if type(d) is types.MemberDescriptorType]
    if len(_layouts) > 10_000:
        _layouts.clear()
    _layouts[id(kind)] = (kind, get_dict, tuple(slots))
    return get_dict, tuple(slots)


def loaded_torch() -> Any:
    """torch, if the session has imported it (nothing here imports it)."""
    return sys.modules.get("torch")


def module_tensors(module: Any) -> Iterator[tuple[str, str, Any]]:
    """(dotted name, "parameter" or "buffer", tensor) for every parameter, then every buffer,
    of an ``nn.Module`` and its submodules, in the order ``named_parameters()`` and
    ``named_buffers()`` give them, read from the modules' ``_parameters``, ``_buffers`` and
    ``_modules`` (no method of the user's model runs: a model whose ``parameters()`` raises
    is still counted). Each tensor once."""
    seen: set[int] = set()
    for wanted in ("parameter", "buffer"):
        for prefix, m in submodules(module):
            for name, role, t in own_tensors(m):
                if role != wanted or id(t) in seen:
                    continue
                seen.add(id(t))
                yield (f"{prefix}.{name}" if prefix else name), role, t


def own_tensors(module: Any) -> Iterator[tuple[str, str, Any]]:
    """(name, "parameter" or "buffer", tensor) that ``module`` itself registered."""
    for table, role in (("_parameters", "parameter"), ("_buffers", "buffer")):
        for name, t in _dict_attribute(module, table):
            if t is not None:
                yield name, role, t


def submodules(module: Any) -> Iterator[tuple[str, Any]]:
    """(prefix, module) depth first, as ``named_modules()`` orders them, each module once."""
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [("", module)]
    while stack:
        prefix, m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        yield prefix, m
        children = [
            (f"{prefix}.{name}" if prefix else name, child)
            for name, child in _dict_attribute(m, "_modules")
            if child is not None
        ]
        stack.extend(reversed(children))


def _dict_attribute(value: Any, name: str) -> list[tuple[Any, Any]]:
    """The items of the dict ``value`` keeps in its instance ``__dict__`` under ``name``."""
    own = instance_dict(value)
    held: Any = own.get(name) if own is not None else None
    return list(dict.items(held)) if issubclass(type(held), dict) else []
