"""What ``%%gpuprofile`` puts into the user's code: a profiler range per statement of the
cell and one per ``nn.Module`` call, so the trace can say which line and which layer spent
the time (issue 10).

The statement ranges come from the shared cell runner's probe (:mod:`gpumagic.cell`):
``enter(i)`` closes the range of the statement that was running and opens statement
``i``'s, so at most one is open at any instant and the ranges add up to the cell. The
module ranges come from global forward pre/post hooks, registered only while the cell
runs. Both are named by keys only (``gpumagic.line#3 L4``, ``gpumagic.module#7``); what
the keys stand for is :meth:`CodeProbe.labels` (see :mod:`gpumagic.profile.trace.spans`).

The range API. Measured on torch 2.13 (CPU build, this repository's shared 2-core machine)
while a profiler records, µs per enter/exit pair, over runs on a busy and a quiet machine
(``python benchmarks/bench_lines.py --mode ranges``):

* ``torch.profiler.record_function``: 10-25. A Python context manager around two
  dispatcher ops; the op dispatch is most of it (pytorch#107195).
* ``torch.ops.profiler._record_function_enter_new`` / ``_record_function_exit`` called
  directly: slower still, 20-28 with their overloads resolved once and 38-95 through the
  op packets, which resolve the overload on every call.
* ``torch._C._profiler._RecordFunctionFast``: 0.7-2.5. A C++ RecordFunction guard with no
  dispatcher, what torch.compile's generated code uses for its own ranges; 0.15 when no
  profiler runs.

A module call costs 5 µs more with the hooks and its range (2 of them for a pair of global
hooks doing nothing, which makes ``nn.Module.__call__`` take its slow path).

``_RecordFunctionFast`` is private and came with pytorch#107195 (August 2023); where a torch
lacks it, ``record_function`` is used: the same ranges, slower. It records its ranges as
``cpu_op`` events where ``record_function`` makes ``user_annotation`` ones; the loader takes
both out of the host events by name. Entered while the profiler does not record (a
schedule's wait and warm-up steps) it holds no range; left once recording has begun, it
raises a RuntimeError, which is ignored: there was nothing to close.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpumagic.cell import Statement
from gpumagic.profile.trace.spans import (
    CodeLabels,
    ModuleLabel,
    StatementLabel,
    module_range_name,
    statement_range_name,
)
from gpumagic.tracebacks import hidden_hook

__all__ = ["CodeProbe", "namespace_module_names", "range_factory"]


def range_factory() -> tuple[Callable[[str], Any], str]:
    """The fastest profiler range this torch has, and its name (see the module docstring)."""
    import torch

    fast = getattr(getattr(torch._C, "_profiler", None), "_RecordFunctionFast", None)
    if fast is not None:
        return fast, "torch._C._profiler._RecordFunctionFast"
    from torch.autograd.profiler import record_function

    return record_function, "torch.autograd.profiler.record_function"


class _NoRange:
    """A statement range that records nothing: the probe after :meth:`CodeProbe.hand_over`."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_RANGE = _NoRange()


def _close(rng: Any) -> None:
    try:
        rng.__exit__(None, None, None)
    except RuntimeError:
        pass  # entered while the profiler was not recording: no range to close


def _is_compiling() -> Callable[[], bool]:
    import torch

    compiler = getattr(torch, "compiler", None)
    fn = getattr(compiler, "is_compiling", None)
    if fn is None:  # torch < 2.3
        dynamo = getattr(torch, "_dynamo", None)
        fn = getattr(dynamo, "is_compiling", None)
    return fn if fn is not None else (lambda: False)


class CodeProbe:
    """One profiled cell's ranges: implements :class:`gpumagic.cell.Probe` (``enter``), and
    hooks every ``nn.Module`` call between :meth:`start` and :meth:`stop`."""

    def __init__(
        self,
        statements: Sequence[Statement],
        namespace: Mapping[str, Any],
        *,
        modules: bool = True,
        factory: Callable[[str], Any] | None = None,
    ) -> None:
        self.statements = list(statements)
        self.namespace = namespace
        self.factory, self.api = (factory, "given") if factory is not None else range_factory()
        # one range object per statement, reused: a statement's range is never open twice
        self._ranges = [self.factory(statement_range_name(s.index, s.line)) for s in statements]
        self._open: Any = None
        self.modules = _ModuleRanges(self.factory) if modules and "torch" in sys.modules else None
        self._notes: list[str] = []

    def start(self) -> CodeProbe:
        if self.modules is not None:
            why = compile_in_use(self.namespace)
            if why:
                self.modules = None
                self._notes.append(f"No per-module times: {why}. {_COMPILE_NOTE}")
                return self
            try:
                self.modules.install()
            except Exception as exc:  # the cell runs all the same, with its lines timed
                self.modules.remove()
                self.modules = None
                self._notes.append(
                    f"No per-module times: the module hooks could not be registered "
                    f"({type(exc).__name__}: {exc})."
                )
        return self

    @property
    def notes(self) -> list[str]:
        """Why the module table is missing or partial, for the report."""
        notes = list(self._notes)
        if self.modules is not None and self.modules.halted:
            notes.append(
                f"Per-module times stop at the first call of a torch.compile'd "
                f"{self.modules.halted}. {_COMPILE_NOTE}"
            )
        return notes

    @hidden_hook
    def enter(self, index: int) -> None:
        # Ctrl-C lands between bytecodes, here after a C call returns (CPython checks for
        # signals there, and on entering a Python function): each range is forgotten before
        # its exit and remembered before its entry, with no Python call between, so that an
        # interrupt anywhere leaves no range entered that stop() would not exit. A range
        # left entered crashes the process when it is collected under a later profiler
        # (torch 2.13's _RecordFunctionFast: a segfault in the garbage collector).
        prev = self._open
        if prev is not None:
            self._open = None
            try:
                prev.__exit__(None, None, None)
            except RuntimeError:
                pass  # entered while the profiler was not recording: nothing to close
        rng = self._ranges[index]
        self._open = rng
        rng.__enter__()

    def stop(self) -> None:
        """Close the statement still open (the failing one, after an error) and remove the hooks."""
        try:
            if self._open is not None:
                _close(self._open)
                self._open = None
        finally:
            if self.modules is not None:
                self.modules.remove()

    def hand_over(self) -> int | None:
        """The profiler passes to one the cell starts (see :mod:`.exclusive`): close the
        open range, remove the module hooks, and open no range from now on (they would land
        in the cell's own profile). Returns the line of the statement running (None between
        statements)."""
        line = None
        for statement, rng in zip(self.statements, self._ranges):
            if rng is self._open:
                line = statement.line
                break
        try:
            self.stop()
        finally:
            self._ranges = [_NO_RANGE] * len(self._ranges)
        return line

    def labels(self) -> CodeLabels:
        """What the range keys stand for: sources, and module names from the namespace now."""
        statements = [StatementLabel(s.index, s.line, s.depth, s.source) for s in self.statements]
        modules = self.modules.labels(self.namespace) if self.modules is not None else []
        return CodeLabels(statements, modules)


_COMPILE_NOTE = (
    "Global module hooks would make torch.compile's code recompile (its guards check that no "
    "global hook is registered), so %%gpuprofile registers no module hooks while compiled "
    "code is in use; the lines are timed all the same."
)


def compile_in_use(namespace: Mapping[str, Any]) -> str:
    """Why module hooks must stay off ("" when they need not): torch.compile has compiled
    code in this process, or a model in the namespace is compiled (``torch.compile(model)``,
    ``model.compile()``)."""
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        if utils is not None and utils.counters["stats"]["unique_graphs"] > 0:
            return "torch.compile has compiled code in this session"
    except Exception:
        pass
    torch = sys.modules.get("torch")
    if torch is None:
        return ""
    for var, value in list(namespace.items()):
        try:
            if not isinstance(value, torch.nn.Module):
                continue
            if _is_compiled(value) or any(_is_compiled(m) for m in value.modules()):
                return f"{var} is a torch.compile'd model"
        except Exception:
            continue
    return ""


def _is_compiled(module: Any) -> bool:
    return (
        type(module).__name__ == "OptimizedModule"
        or getattr(module, "_compiled_call_impl", None) is not None
    )


@dataclass
class _Seen:
    ref: weakref.ref[Any]
    number: int
    range_name: str
    type: str
    parent: int  # number of the module that called it first (-1: the cell itself)
    attr: str  # its attribute path in that parent ("" when it is not a child of it)


class _ModuleRanges:
    """Global forward hooks that open a range per module call, numbered per module instance.

    Modules are held by weak reference (a cell that builds a model per iteration must not
    keep them all alive); ``id()`` reuse after a module dies is caught by the reference.
    Each thread has its own stack of open calls, since DataParallel replicas and user
    threads run forward passes in parallel. A forward that raises never reaches its post
    hook: the next post hook of a module further out closes the calls left open inside it.
    """

    def __init__(self, factory: Callable[[str], Any]) -> None:
        self.factory = factory
        self.seen: dict[int, _Seen] = {}
        self.order: list[_Seen] = []
        self._local = threading.local()
        self._stacks: list[list[tuple[Any, Any]]] = []
        self._handles: list[Any] = []
        self._compiling = _is_compiling()
        self.halted = ""  # the compiled module whose first call took the hooks off

    def install(self) -> None:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        # one at a time, so that remove() finds the first should the second fail
        self._handles.append(register_module_forward_pre_hook(self._pre))
        self._handles.append(register_module_forward_hook(self._post))

    def _unhook(self) -> None:
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()

    def remove(self) -> None:
        self._unhook()
        stack = getattr(self._local, "stack", None)
        for _module, rng in reversed(stack or []):
            _close(rng)
        for s in self._stacks:  # other threads' calls end when their objects go
            s.clear()

    def _stack(self) -> list[tuple[Any, Any]]:
        stack: list[tuple[Any, Any]] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
            self._stacks.append(stack)
        return stack

    @hidden_hook
    def _pre(self, module: Any, args: Any) -> None:
        if self._compiling():  # inside torch.compile's tracing: leave the graph alone
            return None
        if _is_compiled(module):
            # a model compiled in this very cell: unhook before dynamo compiles it, so its
            # guards never see our hooks (_call_impl iterates over copies of the hook dicts)
            self.halted = type(getattr(module, "_orig_mod", module)).__name__
            self._unhook()
            return None
        stack = self._stack()
        seen = self.seen.get(id(module))
        if seen is None or seen.ref() is not module:
            seen = self._first_sight(module, stack)
        rng = self.factory(seen.range_name)
        stack.append((module, rng))  # before its entry: see CodeProbe.enter
        rng.__enter__()
        return None

    @hidden_hook
    def _post(self, module: Any, args: Any, output: Any) -> None:
        if self._compiling():
            return None
        stack = self._stack()
        for k in range(len(stack) - 1, -1, -1):
            if stack[k][0] is module:
                for _m, rng in reversed(stack[k:]):
                    _close(rng)
                del stack[k:]
                break
        return None

    def _first_sight(self, module: Any, stack: list[tuple[Any, Any]]) -> _Seen:
        number = len(self.order)
        parent, attr = -1, ""
        if stack:
            caller = stack[-1][0]
            caller_seen = self.seen.get(id(caller))
            parent = caller_seen.number if caller_seen is not None else -1
            attr = _child_path(caller, module)
        seen = _Seen(
            weakref.ref(module),
            number,
            module_range_name(number),
            type(module).__name__,
            parent,
            attr,
        )
        self.seen[id(module)] = seen
        self.order.append(seen)
        return seen

    def labels(self, namespace: Mapping[str, Any]) -> list[ModuleLabel]:
        names = namespace_module_names(namespace)
        out: list[ModuleLabel] = []
        resolved: dict[int, str] = {}
        per_type: dict[str, int] = {}
        for s in self.order:
            module = s.ref()
            name = names.get(id(module)) if module is not None else None
            if name is None and s.attr and s.parent in resolved:
                parent = resolved[s.parent]
                if not parent.startswith("<"):
                    name = f"{parent}.{s.attr}"
            if name is None:
                per_type[s.type] = per_type.get(s.type, 0) + 1
                name = f"<{s.type} #{per_type[s.type]}>"
            resolved[s.number] = name
            out.append(ModuleLabel(s.number, name, s.type))
        return out


def _child_path(parent: Any, module: Any) -> str:
    """``module``'s attribute in ``parent``: a direct child, or one inside a ModuleList or
    ModuleDict child (containers are not called, so their items' caller is the parent)."""
    children = getattr(parent, "_modules", None) or {}
    for name, child in children.items():
        if child is module:
            return str(name)
    for name, child in children.items():
        if child is not None and type(child).__name__ in ("ModuleList", "ModuleDict"):
            for inner, item in (getattr(child, "_modules", None) or {}).items():
                if item is module:
                    return f"{name}.{inner}"
    return ""


def namespace_module_names(namespace: Mapping[str, Any]) -> dict[int, str]:
    """``id(module) -> qualified name`` for every module reachable from the namespace's
    ``nn.Module`` variables (``model.layer1.0.conv1``).

    A module reachable several ways gets the name under the outermost model: variables
    whose module sits inside another variable's model (``backbone = model.features``)
    come after the others, and names starting with ``_`` (IPython's ``_``, ``_3``) last.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    module_type = torch.nn.Module
    roots: list[tuple[str, Any]] = []
    for var, value in list(namespace.items()):
        try:
            if isinstance(value, module_type):
                roots.append((var, value))
        except Exception:
            continue
    inside: set[int] = set()
    for _var, root in roots:
        inside.update(id(m) for m in root.modules() if m is not root)
    roots.sort(key=lambda vr: (vr[0].startswith("_"), id(vr[1]) in inside))
    names: dict[int, str] = {}
    for var, root in roots:
        for sub, m in root.named_modules(prefix=var):
            names.setdefault(id(m), sub)
    return names
