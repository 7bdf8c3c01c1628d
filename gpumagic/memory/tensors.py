"""Exact tensor bytes by category on one device: a storage tracker over torch's dispatcher.

Why a dispatch mode, measured on this machine (torch 2.13 CPU build, 2 shared cores):

* torch has no CPU allocator statistics. Its CPU allocator reports each allocation to the
  profiler (``profile_memory=True``), but the profiler records every op into buffers that
  grow for as long as the cell runs, there is one per process (a cell that profiles itself,
  or ``%%gpuprofile``, would collide with it), results only come when it stops, and it
  prints Kineto's start-up lines.
* A ``TorchDispatchMode`` sees every op's outputs; each new storage gets a weak reference
  whose callback is its free (storages keep their Python object as long as they live, so
  the callback fires exactly when torch frees the memory). That is what
  ``torch.distributed._tools.mem_tracker.MemTracker`` does. It saw 311.3 MiB at the peak of a
  ResNet-like Adam step where the profiler's ``[memory]`` events peaked at 316.6 MiB: the
  1.7% are buffers kernels allocate inside themselves, which no op returns. It costs about
  6 µs per op with nothing to do (Python's dispatch round trip), and runs unchanged on
  ``FakeTensorMode`` tensors, which a dry run (``%%memfit``) needs.
* ``torch.autograd.graph.saved_tensors_hooks`` would name the tensors saved for backward
  exactly, but with hooks installed autograd no longer raises "one of the variables needed
  for gradient computation has been modified by an inplace operation", an output saved by
  its own op is never freed (the hook's reference closes a cycle through C++), and
  ``torch.func.grad`` refuses to run. A cell must behave as without the magic, so activations
  are told by how a tensor was made and what holds it (:mod:`gpumagic.memory.categories`).

So that the cell behaves exactly as without the magic:

* the op runs as called (``func._op``: torch's own call, without ``OpOverload.__call__``'s
  Python frame), and its exception propagates unchanged; this handler's frame is hidden
  from IPython's tracebacks (``__tracebackhide__``);
* ``ignore_compile_internals``: ``torch.compile`` compiles and runs as without the mode
  (by default Dynamo skips compiling while a mode is active, which would silently run the
  cell eagerly); what a compiled region allocates inside is not seen (:attr:`unseen`);
* the handler is not wrapped in ``torch._dynamo.disable`` (``_should_skip_dynamo``):
  that wrapper imports ``torch._dynamo`` (1.8 s here) into every kernel at the first op and
  adds two Python frames to every op; the tracker's code objects are marked for Dynamo to
  skip instead, which is what the wrapper achieves;
* module and optimizer hooks are global, only while the cell runs, and do nothing while
  Dynamo traces (``torch.compiler.is_compiling()``);
* a failure of the tracker's own code is recorded (:attr:`errors`), stops tracking, and never
  reaches the cell.

Tensors from before the cell count when something reaches them at its start: a name in the
namespace (or a small container), a model, an optimizer, the output history, or the autograd
graph hanging from a named tensor. The device's own allocator is not read on the CPU: there is
none to read; on CUDA the caching allocator's counters stay the source of the totals.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpumagic.memory.categories import (
    ACTIVATIONS,
    GRADIENTS,
    INPUTS,
    OPTIMIZER,
    OTHER,
    PARAMETERS,
)
from gpumagic.memory.ledger import (
    BACKWARD,
    EARLIER,
    FORWARD,
    OTHERWISE,
    PENDING,
    STEP,
    EventLog,
    Ledger,
    Record,
    Settled,
)
from gpumagic.memory.probes import Reading

__all__ = ["TensorMemory", "TensorTracker", "drop_own_frames", "on_cpu"]

# Containers the namespace scan looks into (one level, as the out-of-memory report does).
_CONTAINER_MAX = 64
# The walk over models and optimizers (parameters, gradients, state) on every statement that
# leaves new tensors behind, except that a statement run again (a loop) does it at most this
# often unless its tensors came from backward() or an optimizer step, or a new model appeared.
_MODEL_WALK_EVERY_NS = 200_000_000
# The autograd graphs found at the start are walked up to this many nodes in all.
_GRAPH_NODES_MAX = 20_000
_SKIPPED_NAMES = frozenset(("In", "Out", "exit", "quit", "get_ipython"))

# How an op's outputs relate to its inputs, from its schema: fresh storage, a view (the same
# storage: nothing to do), or an argument whose storage may have changed size: an ``out=``
# argument, or ``resize_`` and its kin. An in-place op writes its argument's storage but
# cannot resize it, so it is a view here; most of an optimizer's ops are in place, and each
# op the tracker looks at costs microseconds. ``_unsafe_view`` returns a view without saying
# so in its schema.
_FRESH, _VIEW, _MUTATED = 0, 1, 2
_UNANNOTATED_VIEWS = frozenset(("_unsafe_view", "_reshape_alias", "alias"))
_RESIZING = frozenset(("resize_", "resize_as_", "set_", "_resize_output_", "sparse_resize_"))
# torch.tensor() builds its data out of the modes' sight, then hands it to them through
# lift_fresh, whose schema says it returns its argument: that is the tensor's allocation.
_LIFTED = frozenset(("lift_fresh", "lift"))


def _output_kind(func: Any) -> int:
    schema = func._schema
    name = schema.name.split("::")[-1]
    if name in _LIFTED:
        return _FRESH
    if name in _UNANNOTATED_VIEWS:
        return _VIEW
    if name in _RESIZING or any(
        a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
        for a in schema.arguments
    ):
        return _MUTATED
    if any(r.alias_info is not None for r in schema.returns):
        return _VIEW
    return _FRESH


_compiler = torch.compiler


def on_cpu(t: Any) -> bool:
    """The keep predicate for the CPU's tensors (the tracker tests it inline)."""
    return bool(t.is_cpu)


_Tensor = torch.Tensor
_current_graph_task = torch._C._current_graph_task_id
_grad_enabled = torch.is_grad_enabled


def _output_kind(func: Any) -> int:
    returns = func._schema.returns
    name = func._schema.name.split("::")[-1]
    if name in _LIFTED:
        return _FRESH
    if name in _UNANNOTATED_VIEWS:
        return _VIEW
    kind = _FRESH
    for ret in returns:
        info = ret.alias_info
        if info is not None:
            if info.is_write:
                return _MUTATED
            kind = _VIEW
    return kind


class _StorageMode(TorchDispatchMode):
    """The dispatch mode: runs each op, then tells the tracker about its outputs."""

    def __init__(self, tracker: TensorTracker) -> None:
        super().__init__()
        self.tracker = tracker

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        __tracebackhide__ = True
        out = func._op(*args, **kwargs) if kwargs else func._op(*args)
        tracker = self.tracker
        if tracker.active:
            try:
                # by id: OpOverload's __hash__ is Python code, and each op is one object
                kind = tracker.kinds.get(id(func))
                if kind is None:
                    kind = tracker.kinds[id(func)] = _output_kind(func)
                if kind != _VIEW:
                    fresh = kind == _FRESH
                    if type(out) is tracker.tensor_type:
                        tracker.see(out, fresh)
                    elif type(out) is tuple or type(out) is list:
                        for item in out:
                            if type(item) is tracker.tensor_type:
                                tracker.see(item, fresh)
            except Exception as exc:  # the tracker's own failure never reaches the cell
                tracker.fail(exc)
        return out


class TensorTracker:
    """Every storage on one device, from the moment it is made to its free, by category.

    ``namespace``: the user's namespace (names, models, optimizers). ``keep``: a predicate on
    tensors, the traced device (:func:`gpumagic.memory.device.tensor_filter`). ``rounding``:
    the allocator's granularity (CUDA's caching allocator hands out multiples of 512 bytes;
    1 on the CPU). ``tensor_type``: the tensors counted (plain ``torch.Tensor``; a dry run
    passes ``FakeTensor``), subclasses' own wrappers being no memory of their own.

    :meth:`start` registers what is alive and installs the mode and the hooks; :meth:`settle`
    ends a statement; :meth:`stop` removes the mode and the hooks (frees are still counted);
    :meth:`close` lets go of every storage.
    """

    def __init__(
        self,
        namespace: Mapping[str, Any],
        keep: Callable[[Any], bool],
        *,
        rounding: int = 1,
        tensor_type: type | None = None,
        events: bool = True,
    ) -> None:
        self.namespace = namespace
        self.keep = keep
        self.rounding = rounding
        self.tensor_type = tensor_type or _Tensor
        self.ledger = Ledger(EventLog() if events else None)
        self.kinds: dict[int, int] = {}  # id(OpOverload) -> _FRESH, _VIEW or _MUTATED
        self._cpu_only = keep is on_cpu  # the common case, tested inline on the hot path
        self.active = False
        self.unseen = 0  # mutated outputs whose storage was never seen (made out of sight)
        self.errors: list[str] = []
        self._live: dict[int, Record] = {}
        self._refs: dict[int, weakref.ref[Any]] = {}  # storage key -> its weak reference
        self._by_ref: dict[int, Record] = {}  # id(weak reference) -> record
        self._named_recs: dict[int, Record] = {}  # records classified as inputs
        self._module_ids: dict[int, int] = {}  # id(module) -> token
        self._module_refs: dict[int, weakref.ref[Any]] = {}  # token -> module
        self.module_classes: dict[int, str] = {}  # token -> class name
        self._stack: list[int] = []  # modules running now, innermost last
        self._optimizers: list[weakref.ref[Any]] = []
        self._in_step = 0
        self._hooks: list[Any] = []
        self._mode: _StorageMode | None = None
        self._on_free = self._freed  # one bound method for every weak reference
        self._walked_ns = 0
        self._walked_statements: set[int] = set()
        self._params: list[weakref.ref[Any]] = []
        self._known_models: set[int] = set()

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Register what is alive now, then install the mode and the hooks."""
        self._register_existing()
        self.ledger.begin(-1)
        _skip_in_dynamo()
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        self._hooks = [
            nn_module.register_module_forward_pre_hook(self._module_entered),
            nn_module.register_module_forward_hook(self._module_left, always_call=True),
            optim.register_optimizer_step_pre_hook(self._step_starts),
            optim.register_optimizer_step_post_hook(self._step_ends),
        ]
        self._mode = _StorageMode(self)
        self._mode.__enter__()
        self.active = True

    def stop(self) -> None:
        """Stop seeing new tensors (the cell ended); frees are still counted until close()."""
        self.active = False
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self._mode is not None:
            _leave_mode(self._mode)
            self._mode = None
        self._stack.clear()

    def close(self) -> None:
        """Let go of every storage: no callback fires after this."""
        self.stop()
        self._refs.clear()
        self._by_ref.clear()

    def fail(self, exc: BaseException) -> None:
        """The tracker's own code failed: stop tracking, keep the reason for the report."""
        self.active = False
        statement = self.ledger.statement
        self.errors.append(f"{type(exc).__name__}: {exc}"[:300] + f" (statement {statement})")

    # -- the hot path: an op's outputs ---------------------------------------------------------
    def see(self, t: Any, fresh: bool) -> None:
        """An op's output: a new storage (``fresh``: the op's schema says it allocates), or
        one the op wrote (``out=``, in place, ``resize_``)."""
        if not (t.is_cpu if self._cpu_only else self.keep(t)):
            return
        st = t.untyped_storage()
        key = st._cdata
        rec = self._live.get(key)
        if rec is not None:
            if not fresh:
                self._resized(rec, st)
            return
        if not fresh:
            self.unseen += 1  # an in-place op on memory made out of sight
            return
        if _current_graph_task() != -1:
            born = BACKWARD
        elif self._in_step:
            born = STEP
        elif _grad_enabled():
            born = FORWARD
        else:
            born = OTHERWISE
        n = st.nbytes()
        r = self.rounding
        ledger = self.ledger
        rec = Record(
            key,
            -(-n // r) * r if r > 1 else n,
            PENDING,
            self._stack[-1] if self._stack else 0,
            born,
            ledger.serial,
            ledger.statement,
        )
        # One shared callback, the record found by the reference's id: a partial per storage
        # would be one more object for the garbage collector per allocation.
        ref = weakref.ref(st, self._on_free)
        self._live[key] = rec
        self._refs[key] = ref
        self._by_ref[id(ref)] = rec
        ledger.add(rec)

    def _size(self, nbytes: int) -> int:
        r = self.rounding
        return -(-nbytes // r) * r if r > 1 else nbytes

    def _track(self, st: Any, rec: Record) -> None:
        ref = weakref.ref(st, self._on_free)
        self._live[rec.key] = rec
        self._refs[rec.key] = ref
        self._by_ref[id(ref)] = rec
        self.ledger.add(rec)

    def _resized(self, rec: Record, st: Any) -> None:
        n = self._size(st.nbytes())
        if n == rec.nbytes:
            return
        # resize_ or an out= op grew (or shrank) the storage: the old size is freed, the new
        # size allocated, under the same record
        ledger = self.ledger
        ledger.drop(rec, False)
        rec.alive = True
        rec.nbytes = n
        if rec.cat not in (PENDING, ACTIVATIONS) and rec.serial != ledger.serial:
            pass  # keeps its category
        ledger.add(rec)

    def _freed(self, ref: Any) -> None:
        try:
            rec = self._by_ref.pop(id(ref), None)
            if rec is not None and self._live.get(rec.key) is rec:
                del self._live[rec.key]
                del self._refs[rec.key]
                self._named_recs.pop(rec.key, None)
                self.ledger.drop(rec, _current_graph_task() != -1)
        except Exception as exc:  # a weakref callback must not print "Exception ignored"
            self.fail(exc)

    # -- hooks ---------------------------------------------------------------------------------
    def _module_entered(self, module: Any, args: Any) -> None:
        if _compiler.is_compiling() or not self.active:
            return
        try:
            token = self._module_ids.get(id(module))
            if token is None or self._module_refs[token]() is not module:
                token = self._meet(module)
            self._stack.append(token)
        except Exception as exc:
            self.fail(exc)

    def _module_left(self, module: Any, args: Any, output: Any) -> None:
        if _compiler.is_compiling() or not self.active:
            return
        if self._stack:
            self._stack.pop()

    def _meet(self, module: Any) -> int:
        """A module's first call in the cell: a token for it, and its tensors are parameters."""
        token = len(self._module_refs) + 1
        self._module_ids[id(module)] = token
        self._module_refs[token] = weakref.ref(module)
        self.module_classes[token] = type(module).__name__
        for t in (*module._parameters.values(), *module._buffers.values()):
            if t is not None:
                self._classify_tensor(t, PARAMETERS)
        return token

    def _step_starts(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if _compiler.is_compiling() or not self.active:
            return
        self._in_step += 1
        try:
            if not any(ref() is optimizer for ref in self._optimizers):
                self._optimizers.append(weakref.ref(optimizer))
            for group in optimizer.param_groups:
                for p in group["params"]:
                    self._classify_tensor(p, PARAMETERS)
                    if p.grad is not None:
                        self._classify_tensor(p.grad, GRADIENTS)
        except Exception as exc:
            self.fail(exc)

    def _step_ends(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if _compiler.is_compiling() or not self.active:
            return
        self._in_step = max(self._in_step - 1, 0)
        try:
            for state in list(optimizer.state.values()):
                for t in _tensors_in(state):
                    self._classify_tensor(t, OPTIMIZER)
        except Exception as exc:
            self.fail(exc)

    def _classify_tensor(self, t: Any, cat: int) -> None:
        if not issubclass(type(t), self.tensor_type):
            return
        rec = self._live.get(t.untyped_storage()._cdata)
        if rec is not None and rec.cat != cat:
            self._named_recs.pop(rec.key, None)
            self.ledger.move(rec, cat)

    # -- statement boundaries ------------------------------------------------------------------
    def settle(self, statement: int) -> Settled:
        """End the open statement (classifying what it left alive) and open ``statement``."""
        self._in_step = 0
        self._stack.clear()
        try:
            return self.ledger.settle(self._classify, statement)
        except Exception as exc:
            self.fail(exc)
            return Settled(self.ledger.after(), self.ledger.peak, None, None)

    def _classify(self, survivors: list[Record]) -> None:
        """Categories for the storages a statement left alive (see
        :mod:`gpumagic.memory.categories`): models and optimizers first, then names, then
        how each was made."""
        named, new_objects = self._scan_namespace()
        statement = self.ledger.statement
        first_time = statement not in self._walked_statements
        made_by_autograd_or_step = any(r.born in (BACKWARD, STEP) for r in survivors)
        now = time.perf_counter_ns()
        if (
            first_time
            or new_objects
            or made_by_autograd_or_step
            or now - self._walked_ns >= _MODEL_WALK_EVERY_NS
        ):
            self._walked_statements.add(statement)
            self._walk_models()
            self._walked_ns = time.perf_counter_ns()
        move = self.ledger.move
        for rec in survivors:
            if rec.cat != PENDING or not rec.alive:
                continue  # a model's tensor, found by the walk
            if rec.key in named:
                move(rec, INPUTS)
                self._named_recs[rec.key] = rec
            else:
                move(rec, ACTIVATIONS if rec.born == FORWARD else OTHER)
        for key, rec in list(self._named_recs.items()):
            if key not in named:  # its name went, something else keeps it
                del self._named_recs[key]
                if rec.alive and rec.cat == INPUTS:
                    move(rec, ACTIVATIONS if rec.born == FORWARD else OTHER)

    def _scan_namespace(self) -> tuple[set[int], bool]:
        """(storage keys of the tensors the namespace names, whether a model or optimizer
        appeared that the walk has not seen)."""
        named: set[int] = set()
        new_objects = False
        module_t, optim_t = torch.nn.Module, torch.optim.Optimizer
        for _name, value in _user_items(self.namespace):
            kind = type(value)
            if issubclass(kind, _Tensor):
                self._name_tensor(value, named)
            elif kind is list or kind is tuple:
                if len(value) <= _CONTAINER_MAX:
                    for v in value:
                        if issubclass(type(v), _Tensor):
                            self._name_tensor(v, named)
            elif kind is dict:
                if len(value) <= _CONTAINER_MAX:
                    for v in list(value.values()):
                        if issubclass(type(v), _Tensor):
                            self._name_tensor(v, named)
            elif issubclass(kind, (module_t, optim_t)) and id(value) not in self._known_models:
                new_objects = True
        return named, new_objects

    def _name_tensor(self, t: Any, named: set[int]) -> None:
        if self.keep(t):
            named.add(t.untyped_storage()._cdata)
            if t.is_leaf and t.requires_grad and t.grad is not None:
                self._classify_tensor(t.grad, GRADIENTS)

    def _walk_models(self) -> None:
        """Parameters, buffers, gradients and optimizer state of every model and optimizer
        the namespace names or the cell stepped: each becomes its category."""
        classify = self._classify_tensor
        modules, optimizers = _models_in(self.namespace)
        self._known_models = {id(m) for m in (*modules, *optimizers)}
        for ref in self._optimizers:
            opt = ref()
            if opt is not None and id(opt) not in self._known_models:
                optimizers.append(opt)
        params: list[Any] = []
        for m in modules:
            for p in m.parameters():
                params.append(p)
            for b in m.buffers():
                classify(b, PARAMETERS)
        for opt in optimizers:
            for group in opt.param_groups:
                params.extend(group["params"])
            for state in list(opt.state.values()):
                for t in _tensors_in(state):
                    classify(t, OPTIMIZER)
        for p in params:
            classify(p, PARAMETERS)
            if p.grad is not None:
                classify(p.grad, GRADIENTS)

    # -- what was alive at the start -----------------------------------------------------------
    def _register_existing(self) -> None:
        modules, optimizers = _models_in(self.namespace)
        self._known_models = {id(m) for m in (*modules, *optimizers)}
        for m in modules:
            for p in m.parameters():
                self._existing(p, PARAMETERS)
                if p.grad is not None:
                    self._existing(p.grad, GRADIENTS)
            for b in m.buffers():
                self._existing(b, PARAMETERS)
        for opt in optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    self._existing(p, PARAMETERS)
                    if p.grad is not None:
                        self._existing(p.grad, GRADIENTS)
            for state in list(opt.state.values()):
                for t in _tensors_in(state):
                    self._existing(t, OPTIMIZER)
        roots: list[Any] = []
        for _name, value in _user_items(self.namespace):
            for t in _named_values(value):
                if t.is_leaf and t.requires_grad and t.grad is not None:
                    self._existing(t.grad, GRADIENTS)
                rec = self._existing(t, INPUTS)
                if rec is not None:
                    self._named_recs[rec.key] = rec
                if t.grad_fn is not None:
                    roots.append(t.grad_fn)
        for t in _saved_by_graphs(roots):
            self._existing(t, ACTIVATIONS)
        for value in _history(self.namespace):
            for t in _named_values(value):
                self._existing(t, OTHER)

    def _existing(self, t: Any, cat: int) -> Record | None:
        if not issubclass(type(t), self.tensor_type):
            return None
        if not self.keep(t):
            return None
        st = t.untyped_storage()
        key = st._cdata
        if key in self._live:
            return None
        rec = Record(key, self._size(st.nbytes()), cat, 0, EARLIER, 0, -1)
        self._track(st, rec)
        return rec

    # -- names -----------------------------------------------------------------------------------
    def module_names(self) -> dict[int, str]:
        """Module token -> its name as the namespace names it (``model.layer3.0.conv1``);
        a module no name reaches is named by its class."""
        names: dict[int, str] = {}
        modules, _ = _models_in(self.namespace, with_names=True)
        for name, module in modules:
            try:
                for sub, child in module.named_modules():
                    token = self._module_ids.get(id(child))
                    if token is not None and token not in names:
                        ref = self._module_refs.get(token)
                        if ref is not None and ref() is child:
                            names[token] = f"{name}.{sub}" if sub else name
            except Exception:
                continue
        for token, cls in self.module_classes.items():
            names.setdefault(token, f"{cls} (no name reaches it)")
        return names


# ---------------------------------------------------------------------------------------------
# Helpers: reading the namespace without letting any user object break the magic


def _user_items(namespace: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """The user's names (not IPython's history, not private names)."""
    for name, value in list(namespace.items()):
        if name.startswith("_") or name in _SKIPPED_NAMES:
            continue
        yield name, value


def _history(namespace: Mapping[str, Any]) -> Iterator[Any]:
    """What IPython's output history keeps alive: ``Out`` and ``_``, ``__``, ``___``."""
    out = namespace.get("Out")
    if type(out) is dict:
        yield from list(out.values())
    for name in ("_", "__", "___"):
        if name in namespace:
            yield namespace[name]


def _named_values(value: Any) -> Iterator[Any]:
    """The tensors a name holds: itself, or the elements of a small list, tuple or dict."""
    kind = type(value)  # type() never raises, unlike isinstance on a lazy proxy
    if issubclass(kind, _Tensor):
        yield value
    elif kind in (list, tuple) and len(value) <= _CONTAINER_MAX:
        yield from (v for v in value if issubclass(type(v), _Tensor))
    elif kind is dict and len(value) <= _CONTAINER_MAX:
        yield from (v for v in list(value.values()) if issubclass(type(v), _Tensor))


def _models_in(namespace: Mapping[str, Any], with_names: bool = False) -> tuple[list[Any], list[Any]]:
    modules: list[Any] = []
    optimizers: list[Any] = []
    module_t, optim_t = torch.nn.Module, torch.optim.Optimizer
    for name, value in _user_items(namespace):
        kind = type(value)
        if issubclass(kind, module_t):
            modules.append((name, value) if with_names else value)
        elif issubclass(kind, optim_t):
            optimizers.append((name, value) if with_names else value)
    return modules, optimizers


def _tensors_in(state: Any) -> Iterable[Any]:
    values = state.values() if type(state) is dict else ()
    return [v for v in values if issubclass(type(v), _Tensor)]


_saved_names: dict[type, tuple[str, ...]] = {}


def _saved_by_graphs(roots: list[Any]) -> Iterator[Any]:
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


def drop_own_frames(error: BaseException) -> None:
    """Take the census's dispatch frame out of ``error``'s traceback (and its context's).

    An op that raises under the census raises out of ``__torch_dispatch__``, so that frame is
    the innermost of the traceback, and IPython shows the innermost frame even when it asks
    to be hidden (``__tracebackhide__``). Without the census the innermost frame is the
    cell's own line (the op is C++), and so it is again once the frame is unlinked."""
    code = _StorageMode.__torch_dispatch__.__code__
    seen: set[int] = set()
    exc: BaseException | None = error
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code is code:
            tb = tb.tb_next
        if tb is not exc.__traceback__:
            exc.__traceback__ = tb
        while tb is not None:
            nxt = tb.tb_next
            while nxt is not None and nxt.tb_frame.f_code is code:
                nxt = nxt.tb_next
            tb.tb_next = nxt
            tb = nxt
        exc = exc.__context__


def _leave_mode(mode: TorchDispatchMode) -> None:
    """Take ``mode`` off the dispatch mode stack, wherever the cell left it: a cell that
    entered a mode of its own without leaving it keeps that mode."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    stack = _get_current_dispatch_mode_stack()
    if stack and stack[-1] is mode:
        mode.__exit__(None, None, None)
        return
    if not any(m is mode for m in stack):
        return
    from torch.utils._python_dispatch import _pop_mode, _push_mode

    above = []
    while True:
        top = _pop_mode()
        if top is mode:
            break
        above.append(top)
    for m in reversed(above):
        _push_mode(m)


_skipped = False


def _skip_in_dynamo() -> None:
    """Mark the tracker's functions for Dynamo to run as they are (never trace them): its
    frame callback may meet them while a compiled region runs."""
    global _skipped
    if _skipped:
        return
    try:
        from torch._C._dynamo import eval_frame

        strategy = eval_frame._FrameExecStrategy(
            eval_frame._FrameAction.SKIP, eval_frame._FrameAction.DEFAULT
        )
        codes = [
            fn.__code__
            for fn in (
                _StorageMode.__torch_dispatch__,
                *(f for f in vars(TensorTracker).values() if callable(f) and hasattr(f, "__code__")),
            )
        ]
        for code in codes:
            eval_frame.set_code_exec_strategy(code, strategy)
    except Exception:  # an older torch without this API: Dynamo skips modes there anyway
        pass
    _skipped = True



class TensorMemory:
    """The CPU's tensor bytes as the tracer's reader (:class:`gpumagic.memory.probes.Reader`):
    the census's running total and the open statement's peak. The peak restarts when the
    census settles a statement, which the tracer does at every boundary."""

    def __init__(self, tracker: TensorTracker) -> None:
        self.tracker = tracker

    def read(self) -> Reading:
        ledger = self.tracker.ledger
        return Reading(ledger.current, max(ledger.peak, ledger.current), ledger.current)

    def reset_peak(self) -> None:
        pass
