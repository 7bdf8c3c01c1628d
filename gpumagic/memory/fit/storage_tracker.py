"""The interim engine behind :class:`~.accounting.TensorAccounting`: every tensor storage
the cell's operations make, counted once, by category and module, at the dispatcher.

How it counts (torch 2.13; the same scheme as torch's
``torch.distributed._tools.mem_tracker.MemTracker``, pytorch#124688, without its per-module
snapshots):

* A ``TorchDispatchMode`` sees every operation's outputs; a storage it has not seen is an
  allocation of ``nbytes`` rounded up to ``round_to``. Views share their base's storage, so
  nothing is counted twice. A weak reference to the storage's Python object (preserved by
  torch as long as the storage lives) says when it is freed. Fake tensors have storages too,
  which is what lets a dry run be counted like a real one.
* Tensors that existed before (the namespace's parameters, gradients, optimizer state,
  batches) are registered before the first statement; a storage first met as an operation's
  input (a tensor made outside the dispatcher, ``torch.from_numpy``) from then on.
* Categories: parameters, gradients and optimizer state by what owns them (modules and
  optimizers found from the namespace, optimizer step hooks, gradient-accumulation hooks);
  activations are what autograd packs for backward (``saved_tensors_hooks``); inputs are
  the namespace's other tensors and what the cell makes outside any model, backward or
  optimizer step from inputs alone; everything else is a temporary. A storage keeps the
  strongest category it was ever given (parameters > gradients > optimizer state > inputs
  > activations > temporaries), as torch's ``_memory_profiler`` gives one category per
  tensor for its whole life.
* What the dispatcher does not see: memory a kernel allocates for itself (cuDNN and cuBLAS
  workspaces, the 1.7% the profiler saw above this count on a ResNet step): the headroom
  states it.
* What the hooks change: under ``saved_tensors_hooks`` autograd no longer checks that a
  saved tensor was not modified in place, and ``torch.func`` transforms refuse to run; a dry
  run does not check a cell's correctness, and says so when it stops.

Until issue 16's accounting engine is in ``gpumagic.memory``, this is the engine: the tests
compare a dry run with this same tracker on real tensors.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules import module as module_hooks
from torch.optim import optimizer as optimizer_hooks
from torch.utils._python_dispatch import TorchDispatchMode

from gpumagic.memory.fit.accounting import (
    ACTIVATIONS,
    CATEGORIES,
    GRADIENTS,
    INPUTS,
    OPTIMIZER_STATE,
    PARAMETERS,
    TEMPORARIES,
    Accounting,
    AccountingScope,
)
from gpumagic.memory.fit.owners import Owners, find_owners
from gpumagic.memory.fit.storages import storage_of, tensors_in

# Strongest first; a storage keeps the highest rank it was given.
_RANK = {c: i for i, c in enumerate((TEMPORARIES, ACTIVATIONS, INPUTS, OPTIMIZER_STATE, GRADIENTS, PARAMETERS))}


class _Ledger:
    """Storages by key (nbytes, device label, category, module) and the allocation events."""

    def __init__(self, round_to: int, statement: Callable[[], int]) -> None:
        self.round_to = max(1, round_to)
        self.statement = statement
        self.keys: dict[int, int] = {}  # id(storage object) -> key, while the storage lives
        self.refs: dict[int, weakref.ref[Any]] = {}
        self.nbytes: list[int] = []
        self.label: list[object] = []  # str, or a label object read when the run ends
        self.category: list[str] = []
        self.module: list[str] = []
        self.events: list[tuple[int, int, int]] = []  # (key, delta bytes, statement)
        self.closed = False

    def rounded(self, n: int) -> int:
        return -(-n // self.round_to) * self.round_to

    def key_of(self, storage: Any) -> int | None:
        return self.keys.get(id(storage))

    def add(self, storage: Any, label: object, category: str, module: str, when: int) -> int:
        key = len(self.nbytes)
        ident = id(storage)
        self.keys[ident] = key
        self.refs[key] = weakref.ref(storage, _Freed(self, key, ident))
        size = self.rounded(int(storage.nbytes()))
        self.nbytes.append(size)
        self.label.append(label)
        self.category.append(category)
        self.module.append(module)
        self.events.append((key, size, when))
        return key

    def resized(self, key: int, storage: Any) -> None:
        size = self.rounded(int(storage.nbytes()))
        if size != self.nbytes[key]:  # resize_ (out= variants) changes a storage in place
            self.events.append((key, size - self.nbytes[key], self.statement()))
            self.nbytes[key] = size

    def mark(self, key: int, category: str, module: str) -> None:
        if _RANK[category] > _RANK[self.category[key]]:
            self.category[key] = category
            self.module[key] = module
        elif category == self.category[key] and module and not self.module[key]:
            self.module[key] = module

    def freed(self, key: int, ident: int) -> None:
        if self.closed:
            return
        if self.keys.get(ident) == key:
            del self.keys[ident]
        self.refs.pop(key, None)
        self.events.append((key, -self.nbytes[key], self.statement()))


class _Freed:
    """A storage's weak-reference callback: record its free."""

    def __init__(self, ledger: _Ledger, key: int, ident: int) -> None:
        self.ledger, self.key, self.ident = ledger, key, ident

    def __call__(self, _ref: object) -> None:
        self.ledger.freed(self.key, self.ident)


class StorageTracker:
    """:class:`~.accounting.TensorAccounting` by storages at the dispatcher (see the module
    docstring)."""

    def __call__(
        self, fn: Callable[[], object], scope: AccountingScope
    ) -> tuple[Accounting, Exception | None]:
        run = _TrackedRun(scope)
        error: Exception | None = None
        with run:
            try:
                fn()
            except Exception as exc:  # the cell's error: the accounting so far still answers
                error = exc
        return run.result(), error


class _TrackedRun:
    """One run: the dispatch mode, the hooks, and the ledger they fill."""

    def __init__(self, scope: AccountingScope) -> None:
        self.scope = scope
        self.ledger = _Ledger(scope.round_to, scope.statement)
        self.stack: list[Any] = []  # modules whose forward is running
        self.in_step = 0  # optimizer.step() depth
        self.ops: dict[str, int] = {}  # aten op name -> calls
        self.owners: Owners = find_owners(scope.namespace)
        self._undo: list[Callable[[], object]] = []

    # -- labels, categories, module names ------------------------------------------------------
    def label_of(self, t: Any) -> object:
        """The device the run counts ``t`` on: the scope's label (kept, not copied: a dry run
        may relabel a tensor later), else the tensor's own device."""
        if self.scope.device_of is not None:
            return self.scope.device_of(t)
        return str(t.device.type)

    def module_now(self) -> str:
        return self.owners.module_name(self.stack[-1], self.scope) if self.stack else ""

    def see(self, t: Any, category: str, module: str, when: int | None = None) -> int | None:
        st = storage_of(t)
        if st is None:
            return None
        key = self.ledger.key_of(st)
        if key is None:
            stamp = self.scope.statement() if when is None else when
            return self.ledger.add(st, self.label_of(t), category, module, stamp)
        self.ledger.mark(key, category, module)
        return key

    # -- entering and leaving ------------------------------------------------------------------
    def __enter__(self) -> _TrackedRun:
        try:
            for t, category, module in self.owners.tensors():
                self.see(t, category, module, when=-1)
            self._undo = _install(self)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        while self._undo:
            self._undo.pop()()
        # What the namespace owns at the end (a model or an optimizer the cell made).
        try:
            for t, category, module in find_owners(self.scope.namespace).tensors():
                st = storage_of(t)
                key = self.ledger.key_of(st) if st is not None else None
                if key is not None:
                    self.ledger.mark(key, category, module)
        finally:
            self.ledger.closed = True

    # -- the answer ----------------------------------------------------------------------------
    def result(self) -> Accounting:
        led = self.ledger
        labels = [str(lab) for lab in led.label]
        seen = {lab for lab in labels if lab != "meta"}
        counted = self.scope.counted(seen) if seen else set()
        total = peak = start = 0
        peak_at = -1
        peak_statement = -1
        trace: list[tuple[int, int]] = []
        for i, (key, delta, when) in enumerate(led.events):
            if labels[key] not in counted:
                continue
            trace.append((key, delta))
            total += delta
            if when == -1:
                start = total
            if total > peak:
                peak, peak_at, peak_statement = total, i, when
        live: dict[int, int] = {}
        for key, delta, _ in led.events[: peak_at + 1]:
            if labels[key] in counted:
                live[key] = live.get(key, 0) + delta
        categories = dict.fromkeys(CATEGORIES, 0)
        by_module: dict[tuple[str, str], int] = {}
        for key, size in live.items():
            if size <= 0:
                continue
            cat = led.category[key]
            categories[cat] += size
            slot = (led.module[key], cat)
            by_module[slot] = by_module.get(slot, 0) + size
        modules = sorted(((m, c, b) for (m, c), b in by_module.items()), key=lambda r: -r[2])
        return Accounting(
            peak_bytes=peak,
            categories=categories,
            modules=modules,
            peak_statement=peak_statement,
            start_bytes=start,
            end_bytes=total,
            devices=counted,
            trace=trace,
            ops=dict(self.ops),
        )


# -- the hooks the run installs, and removes in reverse order ------------------------------


def _install(run: _TrackedRun) -> list[Callable[[], object]]:
    undo: list[Callable[[], object]] = []
    try:
        handles = [
            module_hooks.register_module_forward_pre_hook(lambda m, a: _push(run, m)),
            module_hooks.register_module_forward_hook(
                lambda m, a, o: _pop(run, m), always_call=True
            ),
            optimizer_hooks.register_optimizer_step_pre_hook(lambda o, a, k: _step_starts(run, o)),
            optimizer_hooks.register_optimizer_step_post_hook(lambda o, a, k: _step_ends(run, o)),
        ]
        undo.extend(h.remove for h in handles)
        for p, category, module in run.owners.tensors():
            if category == PARAMETERS and p.requires_grad and p.is_leaf:
                handle = p.register_post_accumulate_grad_hook(
                    lambda q, m=module: _gradient(run, q, m)
                )
                undo.append(handle.remove)
        saved = torch.autograd.graph.saved_tensors_hooks(lambda t: _pack(run, t), lambda t: t)
        saved.__enter__()
        undo.append(lambda: saved.__exit__(None, None, None))
        mode = _DispatchCounter(run)
        mode.__enter__()
        undo.append(lambda: mode.__exit__(None, None, None))
    except BaseException:
        while undo:
            undo.pop()()
        raise
    return undo


def _push(run: _TrackedRun, module: Any) -> None:
    run.stack.append(module)


def _pop(run: _TrackedRun, module: Any) -> None:
    for i in range(len(run.stack) - 1, -1, -1):
        if run.stack[i] is module:
            del run.stack[i:]
            return


def _pack(run: _TrackedRun, t: Any) -> Any:
    run.see(t, ACTIVATIONS, run.module_now())
    # Not t itself: an op that saves its own output (relu, sigmoid, exp) would then hold its
    # output through the hook's reference, a cycle through C++ that keeps it alive until the
    # garbage collector runs, where autograd alone frees it. A detached alias shares the
    # storage and breaks the cycle.
    return t.detach()


def _gradient(run: _TrackedRun, p: Any, module: str) -> None:
    if p.grad is not None:
        run.see(p.grad, GRADIENTS, module)


def _step_starts(run: _TrackedRun, opt: Any) -> None:
    run.in_step += 1
    for group in opt.param_groups:
        for p in group["params"]:
            owner = run.owners.owner_of(p)
            run.see(p, PARAMETERS, owner)
            if p.grad is not None:
                run.see(p.grad, GRADIENTS, owner)


def _step_ends(run: _TrackedRun, opt: Any) -> None:
    run.in_step = max(0, run.in_step - 1)
    for p, state in opt.state.items():
        owner = run.owners.owner_of(p)
        for value in state.values() if isinstance(state, dict) else ():
            if isinstance(value, torch.Tensor):
                run.see(value, OPTIMIZER_STATE, owner)


def _in_backward() -> bool:
    return bool(torch._C._current_graph_task_id() != -1)


class _DispatchCounter(TorchDispatchMode):
    """Every operation's inputs (a storage first met here existed before: an input) and
    outputs (a new storage is an allocation, charged to the statement and module running)."""

    def __init__(self, run: _TrackedRun) -> None:
        super().__init__()
        self.run = run

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        run = self.run
        led = run.ledger
        kwargs = kwargs or {}
        all_inputs = True
        for t in tensors_in((args, kwargs)):
            st = storage_of(t)
            if st is None:
                continue
            key = led.key_of(st)
            if key is None:  # made outside the dispatcher (torch.from_numpy): counted from here
                key = led.add(st, run.label_of(t), INPUTS, "", run.scope.statement())
            if led.category[key] != INPUTS:
                all_inputs = False
        out = func(*args, **kwargs)
        name = func.__name__
        run.ops[name] = run.ops.get(name, 0) + 1
        # What the cell makes outside any model, backward or step from inputs alone (the
        # batch moved or scaled) is an input too; everything else new is a temporary.
        outside = not run.stack and not run.in_step and not _in_backward()
        category = INPUTS if all_inputs and outside else TEMPORARIES
        module = run.module_now()
        for t in tensors_in(out):
            st = storage_of(t)
            if st is None:
                continue
            key = led.key_of(st)
            if key is None:
                led.add(st, run.label_of(t), category, module, run.scope.statement())
            else:
                led.resized(key, st)
        return out
