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
  are told by how a tensor was made and what holds it (:mod:`gpumagic.memory.census.categories`).

The cell behaves as without the magic (:mod:`gpumagic.memory.census.dispatch` says how for the
mode); the optimizer hooks are global, present only while the cell runs, and do nothing
while Dynamo traces (``torch.compiler.is_compiling()``); which module made a tensor is read
off the Python stack, not from module hooks (:meth:`TensorTracker._running_module` says
why); a failure of the tracker's own code is recorded (:attr:`TensorTracker.errors`), stops
tracking, and never reaches the cell.

Tensors from before the cell count when something reaches them at its start: a name in the
namespace (or a small container), a model, an optimizer, the output history, or the autograd
graph hanging from a named tensor. The device's own allocator is not read on the CPU: there is
none to read; on CUDA the caching allocator's counters stay the source of the totals.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import FrameType
from typing import Any

import torch

from gpumagic.cell import error_text
from gpumagic.memory.census.categories import (
    ACTIVATIONS,
    GRADIENTS,
    INPUTS,
    OPTIMIZER,
    OTHER,
    PARAMETERS,
)
from gpumagic.memory.census.dispatch import (
    StorageMode,
    drop_own_frames,
    leave_mode,
    skip_in_dynamo,
)
from gpumagic.memory.census.holdings import grad_fn_of, grad_of, storages
from gpumagic.memory.census.ledger import (
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
from gpumagic.memory.census.reach import (
    history,
    model_tensors,
    models_in,
    named_values,
    saved_by_graphs,
    tensors_in,
    user_items,
)
from gpumagic.memory.census.wrapped import StorageResizes, viewing
from gpumagic.namespace import small_values, submodules

__all__ = ["CUDA_ROUNDING", "TensorTracker", "drop_own_frames", "on_cpu"]

# The CUDA caching allocator hands out multiples of 512 bytes (kMinBlockSize in
# c10/cuda/CUDACachingAllocator.cpp): the census rounds each storage as it does when it
# counts CUDA's memory (``rounding``), for %%memtrace on a GPU and for a dry run alike.
CUDA_ROUNDING = 512

# The walk over models and optimizers (parameters, gradients, state) on every statement that
# leaves new tensors behind, except that a statement run again (a loop) does it at most this
# often unless its tensors came from backward() or an optimizer step, or a new model appeared.
_MODEL_WALK_EVERY_NS = 200_000_000

_compiler = torch.compiler


def on_cpu(t: Any) -> bool:
    """The keep predicate for the CPU's tensors (the tracker tests it inline)."""
    return bool(t.is_cpu)


_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_Module = torch.nn.Module
# What cannot be counted is named in a note: at most this many, then a count.
_UNCOUNTED_NAMED = 8
# How far up the stack the owner of an allocation is looked for: an op is called a few frames
# below its module's forward (a functional wrapper, a helper). A torch function mode's frames
# (each mode re-enters a Python torch function such as F.batch_norm) are not counted.
_MODULE_DEPTH = 12
_PASSING = frozenset(("__torch_function__", "handle_torch_function"))
_current_graph_task = torch._C._current_graph_task_id
_grad_enabled = torch.is_grad_enabled


class TensorTracker:
    """Every storage on one device, from the moment it is made to its free, by category.

    ``namespace``: the user's namespace (names, models, optimizers). ``keep``: a predicate on
    tensors, the traced device (:func:`gpumagic.memory.trace.device.tensor_filter`). ``rounding``:
    the allocator's granularity (CUDA's caching allocator hands out multiples of 512 bytes;
    1 on the CPU). ``tensor_type``: the tensors counted (plain ``torch.Tensor``; a dry run
    passes ``FakeTensor``), subclasses' own wrappers being no memory of their own.
    ``models``: (name, module or optimizer) pairs beyond those the namespace names, counted
    as if it named them (a dry run passes what its deeper walk finds: a trainer's
    ``.model``); ``ledger``: one configured by the caller (a dry run's keeps detail).

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
        models: Sequence[tuple[str, Any]] = (),
        ledger: Ledger | None = None,
    ) -> None:
        self.namespace = namespace
        self.keep = keep
        self.rounding = rounding
        self.tensor_type = tensor_type or _Tensor
        self.ledger = ledger if ledger is not None else Ledger(EventLog() if events else None)
        self.models = list(models)
        self.kinds: dict[int, int] = {}  # id(OpOverload) -> FRESH, VIEW or MUTATED
        self.ops: list[str] = []  # each op's name, when first seen (in kinds)
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
        self._optimizers: list[weakref.ref[Any]] = []
        self._in_step = 0
        self._hooks: list[Any] = []
        self._mode: StorageMode | None = None
        self._on_free = self._freed  # one bound method for every weak reference
        self._walked_ns = 0
        self._walked_statements: set[int] = set()
        self._params: list[weakref.ref[Any]] = []
        self._known_models: set[int] = set()
        # the types whose storage is read directly (anything else goes through holdings)
        self._plain = (self.tensor_type, _Parameter) if self.tensor_type is _Tensor else (self.tensor_type,)
        # what holds memory the census cannot count: who (a name, an op) -> why
        self.uncounted: dict[str, str] = {}
        self.uncounted_more = 0

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, also: Iterable[tuple[Any, int]] = ()) -> None:
        """Register what is alive now, then install the mode and the hooks. ``also``:
        (tensor, category) the caller knows the cell is given beyond what the namespace
        reaches (registered after it, so the namespace's categories win)."""
        self._register_existing()
        for t, cat in also:
            self._existing(t, cat, "a tensor the cell is given")
        self.ledger.begin(-1)
        skip_in_dynamo(f for f in vars(TensorTracker).values() if callable(f))
        from torch.optim import optimizer as optim

        self._hooks = [
            optim.register_optimizer_step_pre_hook(self._step_starts),
            optim.register_optimizer_step_post_hook(self._step_ends),
        ]
        StorageResizes.add(self._on_resize)
        self._mode = StorageMode(self)
        self._mode.__enter__()
        self.active = True

    def stop(self) -> None:
        """Stop seeing new tensors (the cell ended); frees are still counted until close()."""
        self.active = False
        StorageResizes.remove(self._on_resize)
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self._mode is not None:
            leave_mode(self._mode)
            self._mode = None

    def close(self) -> None:
        """Let go of every storage: no callback fires after this."""
        self.stop()
        self._refs.clear()
        self._by_ref.clear()

    def fail(self, exc: BaseException) -> None:
        """The tracker's own code failed: stop tracking, keep the reason for the report."""
        self.active = False
        statement = self.ledger.statement
        self.errors.append(f"{error_text(exc)} (statement {statement})")

    # -- the hot path: an op's outputs ---------------------------------------------------------
    def see(self, t: Any, fresh: bool, func: Any) -> None:
        """An op's output of the counted type: a new storage (``fresh``: the op's schema says
        it allocates), or one the op wrote (``out=``, in place, ``resize_``); ``func`` the op."""
        if not (t.is_cpu if self._cpu_only else self.keep(t)):
            return
        try:
            st = t.untyped_storage()
        except Exception:  # sparse, mkldnn, a functorch wrapper: read by holdings
            self.see_other(t, fresh, func)
            return
        if t.is_nested or t.is_quantized:  # parts beside the storage
            self.see_other(t, fresh, func)
            return
        self._seen(st, fresh)

    def see_other(self, t: Any, fresh: bool, func: Any) -> None:
        """An op's output that is no plain tensor of the counted type (sparse, a DTensor, a fake
        tensor in a real census...): what it holds, by :mod:`~gpumagic.memory.census.holdings`."""
        found, why = storages(t, self.tensor_type, self.keep)
        for st in found:
            self._seen(st, fresh)
        if why:
            name = str(getattr(func, "__name__", func)).removesuffix(".default")
            self._cannot_count(f"what aten.{name} made", why)

    def _seen(self, st: Any, fresh: bool) -> None:
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
            self._running_module() if born == FORWARD else 0,
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

    def adopt(self, t: Any) -> None:
        """Count ``t`` from now on, made now, if ``keep`` takes it now and it is not counted:
        a dry run without a GPU relabels a CPU tensor CUDA when it meets CUDA tensors
        (``torch.arange(n, device=x.device)`` reads the fake's CPU device)."""
        if self.active:
            found, _ = storages(t, self.tensor_type, self.keep)
            for st in found:
                self._seen(st, True)  # a storage already counted stays as it is

    def _cannot_count(self, who: str, why: str) -> None:
        if who in self.uncounted:
            return
        if len(self.uncounted) < _UNCOUNTED_NAMED:
            self.uncounted[who] = why
        else:
            self.uncounted_more += 1

    def _keys(self, t: Any) -> list[int]:
        """The storage keys of what ``t`` holds that the census counts, on any device (only
        those the census tracks matter to a lookup)."""
        if type(t) in self._plain:
            try:
                st = t.untyped_storage()
                if not (t.is_nested or t.is_quantized):
                    return [st._cdata]
            except Exception:
                pass
        found, _ = storages(t, self.tensor_type, _anywhere)
        return [st._cdata for st in found]

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
        rec.nbytes = n  # and keeps its category
        ledger.add(rec)

    def _on_resize(self, storage: Any) -> None:
        """A storage resized outside the dispatcher (:mod:`~gpumagic.memory.census.wrapped`): a
        counted one takes its new size; an uncounted one grown now (FSDP2's) is an allocation."""
        try:
            rec = self._live.get(storage._cdata)
            if rec is not None:
                self._resized(rec, storage)
            elif self.active and storage.nbytes() > 0:
                self.see(viewing(storage), True, "resize_")
        except Exception as exc:
            self.fail(exc)

    def record_of(self, t: Any) -> Record | None:
        return self._live.get(t.untyped_storage()._cdata)  # None: not counted (for sharding)

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

    # -- which module is running ---------------------------------------------------------------
    def _running_module(self) -> int:
        """The token of the innermost ``nn.Module.forward`` on the Python stack (0: none).

        Read off the stack, not from global module hooks: any global hook sends every
        ``Module.__call__`` down torch's slow path, whose closure keeps the call's arguments,
        so a forward pass that ran out of memory would keep its activations in the error."""
        frame: FrameType | None = sys._getframe(4)  # above _seen(), see(), the handler, the op's caller
        depth = 0
        while frame is not None and depth < _MODULE_DEPTH:
            name = frame.f_code.co_name
            if name == "forward":
                module = frame.f_locals.get("self")
                if module is not None and issubclass(type(module), _Module):
                    token = self._module_ids.get(id(module))
                    if token is None or self._module_refs[token]() is not module:
                        token = self._meet(module)
                    return token
            frame = frame.f_back
            depth += name not in _PASSING
        return 0

    def _meet(self, module: Any) -> int:
        """A module first seen making a tensor: a token for it, and its tensors are parameters."""
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
                for t in tensors_in(state):
                    self._classify_tensor(t, OPTIMIZER)
        except Exception as exc:
            self.fail(exc)

    def _classify_tensor(self, t: Any, cat: int) -> None:
        live = self._live
        for key in self._keys(t):
            rec = live.get(key)
            if rec is not None and rec.cat != cat:
                self._named_recs.pop(rec.key, None)
                self.ledger.move(rec, cat)

    # -- statement boundaries ------------------------------------------------------------------
    def settle(self, statement: int) -> Settled:
        """End the open statement (classifying what it left alive) and open ``statement``."""
        self._in_step = 0
        try:
            return self.ledger.settle(self._classify, statement)
        except Exception as exc:
            self.fail(exc)
            return Settled(self.ledger.after(), self.ledger.peak, None, None)

    def settle_quiet(self, statement: int) -> Settled | None:
        """:meth:`settle` when nothing happened since the last one (the ledger's
        :meth:`~.ledger.Ledger.settle_quiet`); None, and nothing done, otherwise."""
        settled = self.ledger.settle_quiet(statement)
        if settled is not None:
            self._in_step = 0
        return settled

    def _classify(self, survivors: list[Record]) -> None:
        """Categories for the storages a statement left alive (see
        :mod:`gpumagic.memory.census.categories`): models and optimizers first, then names, then
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
        for _name, value in user_items(self.namespace):
            kind = type(value)
            if issubclass(kind, _Tensor):
                self._name_tensor(value, named)
            elif issubclass(kind, (module_t, optim_t)):
                new_objects = new_objects or id(value) not in self._known_models
            else:
                for v in small_values(value):
                    if issubclass(type(v), _Tensor):
                        self._name_tensor(v, named)
        return named, new_objects

    def _name_tensor(self, t: Any, named: set[int]) -> None:
        named.update(self._keys(t))
        grad = grad_of(t)
        if grad is not None:
            self._classify_tensor(grad, GRADIENTS)

    def _walk_models(self) -> None:
        """Parameters, buffers, gradients and optimizer state of every model and optimizer
        the namespace names or the cell stepped: each becomes its category."""
        classify = self._classify_tensor
        for t, cat in self._model_tensors():
            classify(t, cat)

    def _model_tensors(self) -> Iterator[tuple[Any, int]]:
        """(tensor, category) for the models and optimizers the namespace names (or the census
        was given), and the optimizers the cell stepped (:func:`.reach.model_tensors`)."""
        modules, optimizers = self.reached_models()
        self._known_models = {id(m) for m in (*modules, *optimizers)}
        for ref in self._optimizers:
            opt = ref()
            if opt is not None and id(opt) not in self._known_models:
                optimizers.append(opt)
        return model_tensors(modules, optimizers)

    # -- what was alive at the start -----------------------------------------------------------
    def _register_existing(self) -> None:
        for t, cat in self._model_tensors():
            self._existing(t, cat, "a model's or optimizer's tensor")
        roots: list[Any] = []
        for name, value in user_items(self.namespace):
            for t in named_values(value):
                grad = grad_of(t)
                if grad is not None:
                    self._existing(grad, GRADIENTS, f"{name}.grad")
                for rec in self._existing(t, INPUTS, name):
                    self._named_recs[rec.key] = rec
                grad_fn = grad_fn_of(t)
                if grad_fn is not None:
                    roots.append(grad_fn)
        for t in saved_by_graphs(roots):
            self._existing(t, ACTIVATIONS, "a tensor an autograd graph keeps")
        for value in history(self.namespace):
            for t in named_values(value):
                self._existing(t, OTHER, "an output IPython keeps (Out)")

    def _existing(self, t: Any, cat: int, who: str) -> list[Record]:
        """Register what ``t`` holds, alive before the cell, as ``cat``; ``who`` names it in
        the note when something of it cannot be counted."""
        found, why = storages(t, self.tensor_type, self.keep)
        if why:
            self._cannot_count(who, why)
        made = []
        for st in found:
            key = st._cdata
            if key in self._live:
                continue
            rec = Record(key, self._size(st.nbytes()), cat, 0, EARLIER, 0, -1)
            self._track(st, rec)
            made.append(rec)
        return made

    def reached_models(self, with_names: bool = False) -> tuple[list[Any], list[Any]]:
        """The namespace's models and optimizers, then those given as ``models``."""
        modules, optimizers = models_in(self.namespace, with_names)
        module_t = torch.nn.Module
        for name, value in self.models:
            found = modules if issubclass(type(value), module_t) else optimizers
            found.append((name, value) if with_names else value)
        return modules, optimizers

    # -- names -----------------------------------------------------------------------------------
    def module_names(self) -> dict[int, str]:
        """Module token -> its name as the namespace names it (``model.layer3.0.conv1``);
        a module no name reaches is named by its class."""
        names: dict[int, str] = {}
        modules, _ = self.reached_models(with_names=True)
        for name, module in modules:
            try:
                for sub, child in submodules(module):
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


def _anywhere(t: Any) -> bool:
    return True
