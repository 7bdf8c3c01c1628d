"""The walk: everything reachable from a namespace's names, each object once, with a path
naming how (see :mod:`gpumagic.namespace` for the rules it follows)."""

from __future__ import annotations

import functools
import itertools
import os
import sys
import sysconfig
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from gpumagic.namespace.rules import (
    ATOMS,
    attributes,
    key_text,
    loaded_torch,
    type_name,
    user_items,
)

__all__ = ["DEEP", "DEPTH", "ITEMS", "OBJECTS", "Reached", "Walk", "reachable_tensors", "walk"]

# A walk looks at the first this many items of one container,
ITEMS: Final = 1000
# this many levels below its roots by default (a dry run's look past the census),
DEPTH: Final = 3
# or this many when it looks for everything a cell can reach (a model's modules nest deep),
DEEP: Final = 64
# and at this many objects in all, whatever the namespace holds.
OBJECTS: Final = 200_000

_TYPE_QUALNAME: Any = vars(type)["__qualname__"]
_TYPE_MRO: Any = vars(type)["__mro__"]
_TYPE_DICT: Any = vars(type)["__dict__"]
_MODULE_DICT: Any = vars(types.ModuleType)["__dict__"]
_FUNCTION_GLOBALS: Any = vars(types.FunctionType)["__globals__"]
_FUNCTION_DEFAULTS: Any = vars(types.FunctionType)["__defaults__"]
_FUNCTION_KWDEFAULTS: Any = vars(types.FunctionType)["__kwdefaults__"]
_FUNCTION_CLOSURE: Any = vars(types.FunctionType)["__closure__"]


@dataclass(frozen=True)
class Reached:
    """An object a walk reached: ``path`` names how (a Python expression that reads it,
    where one can be written), ``depth`` how many steps below its root."""

    path: str
    value: Any
    depth: int


@dataclass
class Walk:
    """What a walk reached, in the order it reached it (roots first, then breadth first),
    each object once; ``cut``: each bound that left something unread, in words (a long
    container, the objects' limit)."""

    reached: list[Reached] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)


class _Named:
    """A path step that is a name of its own: a class (``mylib.Cfg``), a module (``mylib``), a
    module's global (``mylib.BUF``), however the walk came to it."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _Key:
    """A step through a dict whose key is an object: written with the key's own path once
    the walk is done (``opt.state[model.fc.weight]``)."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key


class _Element:
    """An element with no name: a set's, or a dict's key (``list(s)[0]``)."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n


# How a walk stepped from an object to one inside it.
Step = str | _Named | _Key | _Element


def walk(
    roots: Iterable[tuple[str, Any]],
    *,
    depth: int = DEPTH,
    items: int = ITEMS,
    objects: int = OBJECTS,
    stop: tuple[type, ...] = (),
    through_code: bool = False,
    exclude: Iterable[Any] = (),
) -> Walk:
    """Everything reachable from ``roots`` ((name, value) pairs), breadth first, by the rules
    of :mod:`gpumagic.namespace`. ``depth``: levels looked into below the roots; ``items``: items
    of one container; ``objects``: objects in all; ``stop``: kinds reached but not looked into
    (a dry run's walk leaves models to the census); ``through_code``: also through functions,
    classes and modules of the user's own code; ``exclude``: objects never reached (the
    namespace itself, which a notebook function's globals are)."""
    return _Walker(depth, items, objects, stop, through_code, exclude).run(roots)


def reachable_tensors(
    roots: Iterable[tuple[str, Any]],
    *,
    exclude: Iterable[Any] = (),
    depth: int = DEEP,
    items: int = ITEMS,
    objects: int = OBJECTS,
) -> tuple[list[tuple[str, Any]], list[str]]:
    """Every real tensor (no ``FakeTensor``) reachable from ``roots``: through names,
    containers, attributes of objects, ``.grad`` and views' bases, and through code (module
    globals reached through the functions and classes the roots name, class attributes,
    closures, defaults), each once, with the first path that reaches it; and the bounds that
    cut the walk (a tensor beyond them is not found, and the caller should say so)."""
    torch = loaded_torch()
    found = walk(roots, depth=depth, items=items, objects=objects, through_code=True, exclude=exclude)
    if torch is None:
        return [], found.cut
    fake_module = sys.modules.get("torch._subclasses.fake_tensor")
    fake = getattr(fake_module, "FakeTensor", None) if fake_module is not None else None
    tensor_t = torch.Tensor
    tensors = [
        (r.path, r.value)
        for r in found.reached
        if issubclass(type(r.value), tensor_t) and not (fake is not None and issubclass(type(r.value), fake))
    ]
    return tensors, found.cut


class _Walker:
    def __init__(
        self,
        depth: int,
        items: int,
        objects: int,
        stop: tuple[type, ...],
        through_code: bool,
        exclude: Iterable[Any],
    ) -> None:
        self.depth = depth
        self.items = items
        self.objects = objects
        self.stop = stop
        self.code = through_code
        self.keep_alive = list(exclude)  # ids stay unique while the walk runs
        self.excluded = {id(x) for x in self.keep_alive}
        # per object reached: its parent's index (-1: a root or a name of its own), the
        # step from there (text, or a _Key), the object, its depth
        self.parents: list[int] = []
        self.steps: list[Step] = []
        self.values: list[Any] = []
        self.depths: list[int] = []
        self.index: dict[int, int] = {}  # id -> position
        self.cut: list[str] = []
        self.full = False  # an object was left out: the objects' bound was reached
        torch = loaded_torch()
        self.tensor_t: Any = torch.Tensor if torch is not None else None
        self.module_t: Any = torch.nn.Module if torch is not None else None
        self.tensor_base: Any = torch._C.TensorBase.__dict__ if torch is not None else None

    def run(self, roots: Iterable[tuple[str, Any]]) -> Walk:
        for name, value in roots:
            self._add(-1, name, value, 0)
        i = 0
        while i < len(self.values):
            if self.depths[i] < self.depth and not self.full:
                value = self.values[i]
                kind = type(value)
                if not (self.stop and issubclass(kind, self.stop)):
                    try:
                        children = list(self._inside(i, value, kind))
                    except Exception:  # whatever a read met: this object stays unread
                        children = []
                    for step, child in children:
                        self._add(i, step, child, self.depths[i] + 1)
            i += 1
        if self.full:
            self.cut.append(f"the walk stopped at {self.objects:,} objects")
        paths = self._paths()
        reached = [Reached(p, v, d) for p, v, d in zip(paths, self.values, self.depths)]
        return Walk(reached, self.cut)

    def _add(self, parent: int, step: Step, value: Any, depth: int) -> None:
        key = id(value)
        if key in self.excluded:
            return
        if key in self.index:
            self._rename(self.index[key], parent, step, depth)
            return
        if len(self.values) >= self.objects:
            self.full = True
            return
        if parent >= 0 and issubclass(type(value), ATOMS):
            return  # nothing inside, and not worth a row
        self.index[key] = len(self.values)
        self.parents.append(parent)
        self.steps.append(step)
        self.values.append(value)
        self.depths.append(depth)

    def _rename(self, i: int, parent: int, step: Step, depth: int) -> None:
        """An object first reached as a dict's key or a set's element (``list(opt.state)[0]``)
        and now by a name at no greater depth (``model.fc.weight``) takes the name: the path
        a user would write. Paths are written once the walk is done, so what lies below it
        is named from there too."""
        if not isinstance(self.steps[i], _Element) or isinstance(step, _Element):
            return
        if depth > self.depths[i]:
            return
        up = parent
        while up >= 0:  # never under itself
            if up == i:
                return
            up = self.parents[up]
        self.parents[i], self.steps[i] = parent, step

    def _first(self, iterable: Iterable[Any], size: int, where: int) -> Iterator[Any]:
        if size > self.items and len(self.cut) < 20:
            self.cut.append(f"{self._path(where)}: the first {self.items:,} of {size:,} items")
        return itertools.islice(iterable, self.items)

    # -- what is inside an object -----------------------------------------------------------
    def _inside(self, i: int, value: Any, kind: type) -> Iterator[tuple[Step, Any]]:
        if issubclass(kind, ATOMS):
            return
        if self.tensor_t is not None and issubclass(kind, self.tensor_t):
            yield from self._tensor(value, kind)
        elif issubclass(kind, (list, tuple)):
            base: Any = list if issubclass(kind, list) else tuple
            for k, v in enumerate(self._first(base.__iter__(value), base.__len__(value), i)):
                yield f"[{k}]", v
        elif issubclass(kind, dict):
            pairs = list(self._first(dict.items(value), dict.__len__(value), i))
            for k, v in pairs:
                text = key_text(k)
                yield (f"[{text}]" if text is not None else _Key(k)), v
            for n, (k, _) in enumerate(pairs):  # an object as a key is reachable too
                if key_text(k) is None:
                    yield _Element(n), k
        elif issubclass(kind, (set, frozenset)):
            base = set if issubclass(kind, set) else frozenset
            for n, v in enumerate(self._first(base.__iter__(value), base.__len__(value), i)):
                yield _Element(n), v
        elif issubclass(kind, type):
            if self.code and _users_class(value):
                yield from self._class(value)
        elif issubclass(kind, types.ModuleType):
            if self.code:
                yield from self._module(value)
        elif kind is types.FunctionType:
            if self.code:
                yield from self._function(value)
        elif kind is types.MethodType:
            yield ".__self__", value.__self__  # the bound object is data the name holds
            if self.code:
                yield ".__func__", value.__func__
        elif kind is staticmethod or kind is classmethod:
            if self.code:
                yield ".__func__", value.__func__
        elif kind is property:
            if self.code:
                yield from ((f".{n}", getattr(value, n)) for n in ("fget", "fset", "fdel"))
        elif kind is functools.partial:
            yield ".func", value.func
            yield ".args", value.args
            yield ".keywords", value.keywords
        elif not issubclass(kind, _OPAQUE):
            yield from self._object(i, value, kind)

    def _tensor(self, t: Any, kind: type) -> Iterator[tuple[Step, Any]]:
        base = self.tensor_base
        # .grad is read only where torch keeps one: reading it on another non-leaf tensor
        # makes torch warn, and a warning turned error would fail the scan
        if base["is_leaf"].__get__(t) or base["retains_grad"].__get__(t):
            grad = base["grad"].__get__(t)
            if grad is not None:
                yield ".grad", grad
        view_of = base["_base"].__get__(t)
        if view_of is not None:
            yield "._base", view_of
        if kind is self.tensor_t or type_name(kind) == "Parameter":
            yield from ((f".{k}", v) for k, v in attributes(t))

    def _object(self, i: int, value: Any, kind: type) -> Iterator[tuple[Step, Any]]:
        own = attributes(value)
        if self.module_t is not None and issubclass(kind, self.module_t):
            # a model's parameters, buffers and submodules by the names it gives them
            held = {"_parameters", "_buffers", "_modules"}
            for name, table in own:
                if name in held and issubclass(type(table), dict):
                    yield from ((f".{k}", v) for k, v in list(dict.items(table)) if v is not None)
            own = [(k, v) for k, v in own if k not in held]
        yield from ((f".{k}", v) for k, v in self._first(own, len(own), i))
        if self.code and _users_class(kind):
            yield _Named(_class_path(kind)), kind

    def _class(self, cls: type) -> Iterator[tuple[Step, Any]]:
        name = _class_path(cls)
        for attr, v in list(_TYPE_DICT.__get__(cls).items()):
            if attr.startswith("__") and attr.endswith("__") and type(v) is not types.FunctionType:
                continue  # the class's machinery (__dict__, __module__, __doc__...)
            yield _Named(f"{name}.{attr}"), v
        for base in _TYPE_MRO.__get__(cls)[1:]:
            if _users_class(base):
                yield _Named(_class_path(base)), base
        module = sys.modules.get(_class_module(cls))
        if module is not None:
            yield _Named(_class_module(cls)), module

    def _module(self, module: types.ModuleType) -> Iterator[tuple[Step, Any]]:
        own = _MODULE_DICT.__get__(module)
        name = own.get("__name__")
        if type(name) is not str or not _users_module(name) or id(own) in self.excluded:
            return
        if name == "__main__":  # the notebook's globals: the user's names only
            yield from ((_Named(k), v) for k, v in user_items(own))
            return
        for k, v in list(own.items()):
            if type(k) is str and not (k.startswith("__") and k.endswith("__")):
                yield _Named(f"{name}.{k}"), v

    def _function(self, fn: types.FunctionType) -> Iterator[tuple[Step, Any]]:
        globals_ = _FUNCTION_GLOBALS.__get__(fn)
        name = globals_.get("__name__")
        if type(name) is not str or not _users_module(name):
            return  # a library's function: its globals, closures and defaults are its own
        module = sys.modules.get(name)
        if module is not None and _MODULE_DICT.__get__(module) is globals_:
            yield _Named(name), module
        elif id(globals_) not in self.excluded:
            yield ".__globals__", globals_
        closure = _FUNCTION_CLOSURE.__get__(fn) or ()
        for k, cell in enumerate(closure):
            try:
                yield f".__closure__[{k}].cell_contents", cell.cell_contents
            except ValueError:  # a cell not bound yet
                continue
        yield ".__defaults__", _FUNCTION_DEFAULTS.__get__(fn)
        yield ".__kwdefaults__", _FUNCTION_KWDEFAULTS.__get__(fn)
        yield from ((f".{k}", v) for k, v in attributes(fn))

    # -- paths ------------------------------------------------------------------------------
    def _paths(self) -> list[str]:
        done: dict[int, str] = {}
        return [self._path(i, done) for i in range(len(self.values))]

    def _path(self, i: int, done: dict[int, str] | None = None, busy: frozenset[int] = frozenset()) -> str:
        if done is not None and i in done:
            return done[i]
        step = self.steps[i]
        busy = busy | {i}

        def up(k: int) -> str:
            return self._path(k, done, busy) if k >= 0 else ""

        if isinstance(step, str):
            text = up(self.parents[i]) + step
        elif isinstance(step, _Named):
            text = step.text
        elif isinstance(step, _Element):
            text = f"list({up(self.parents[i])})[{step.n}]"
        else:  # a key: its own path where the walk reached it, else its kind
            k = self.index.get(id(step.key), -1)
            inner = up(k) if k >= 0 and k not in busy else f"<{type_name(type(step.key))}>"
            text = f"{up(self.parents[i])}[{inner}]"
        if done is not None:
            done[i] = text
        return text


# Objects with no attributes of their own worth reading, or whose reading would act:
# iterators and generators (their frames), weak references, code.
_OPAQUE = (
    types.GeneratorType,
    types.CoroutineType,
    types.AsyncGeneratorType,
    types.FrameType,
    types.TracebackType,
    types.CodeType,
    types.BuiltinFunctionType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
    types.MethodDescriptorType,
    types.GetSetDescriptorType,
    types.MemberDescriptorType,
    types.CellType,
)


def _class_module(cls: type) -> str:
    module = _TYPE_DICT.__get__(cls).get("__module__")
    return module if type(module) is str else ""


def _class_path(cls: type) -> str:
    """How a class is named: ``Cfg`` for the notebook's, ``mylib.Cfg`` for a module's."""
    module = _class_module(cls)
    qualname = str(_TYPE_QUALNAME.__get__(cls))
    return qualname if module in ("__main__", "builtins", "") else f"{module}.{qualname}"


def _users_class(cls: type) -> bool:
    return _users_module(_class_module(cls))


def _users_module(name: str) -> bool:
    """Whether the module ``name`` is the user's code: the notebook (``__main__``), or a file
    outside the Python installation and outside gpumagic. A library's globals are its own
    state, not the user's data, and walking them would cost the whole of torch."""
    if name == "__main__":
        return True
    if not name or name == "gpumagic" or name.startswith("gpumagic."):
        return False
    module = sys.modules.get(name)
    if module is None:
        return False
    known = _modules_seen.get(name)
    if known is not None and known[0] is module:  # the same module object: the same answer
        return known[1]
    try:
        path = _MODULE_DICT.__get__(module).get("__file__")
    except Exception:
        path = None
    users = type(path) is str and not os.path.realpath(path).startswith(_installation())
    if len(_modules_seen) > 4096:
        _modules_seen.clear()
    _modules_seen[name] = (module, users)
    return users


# module name -> (the module object asked about, whether it is the user's code)
_modules_seen: dict[str, tuple[Any, bool]] = {}


@functools.lru_cache(maxsize=1)
def _installation() -> tuple[str, ...]:
    """The folders Python and its packages are installed in."""
    paths = sysconfig.get_paths()
    roots = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        *(paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")),
    }
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots if r)
