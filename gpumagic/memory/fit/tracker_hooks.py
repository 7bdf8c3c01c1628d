"""The hooks :class:`~.storage_tracker.StorageTracker` runs under, installed together and
removed together (``install`` returns the functions that remove them, in order).

* a ``TorchDispatchMode`` on top of the mode stack: every operation's inputs and outputs;
* ``saved_tensors_hooks``: what autograd keeps for backward is an activation, charged to the
  module whose forward saved it;
* global module forward hooks (``always_call``, so a forward that raises still leaves): the
  module running now;
* global optimizer step hooks: gradients a step reads, the state it leaves;
* gradient-accumulation hooks on the parameters known before the run: a gradient freed
  before any step (``zero_grad`` right after ``backward``) is still a gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpumagic.memory.fit.accounting import (
    ACTIVATIONS,
    GRADIENTS,
    INPUTS,
    OPTIMIZER_STATE,
    PARAMETERS,
    TEMPORARIES,
)

if TYPE_CHECKING:
    from gpumagic.memory.fit.storage_tracker import _TrackedRun


def install(run: _TrackedRun) -> list[Callable[[], object]]:
    import torch
    from torch.nn.modules import module as module_hooks
    from torch.optim import optimizer as optimizer_hooks

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
    return t


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
    import torch

    run.in_step = max(0, run.in_step - 1)
    for p, state in opt.state.items():
        owner = run.owners.owner_of(p)
        for value in state.values() if isinstance(state, dict) else ():
            if isinstance(value, torch.Tensor):
                run.see(value, OPTIMIZER_STATE, owner)


def _in_backward() -> bool:
    import torch

    return bool(torch._C._current_graph_task_id() != -1)


def _dispatch_mode_class() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode

    from gpumagic.memory.fit.storage_tracker import _storage, _tensors

    class Counter(TorchDispatchMode):
        def __init__(self, run: _TrackedRun) -> None:
            super().__init__()
            self.run = run

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            run = self.run
            led = run.ledger
            kwargs = kwargs or {}
            all_inputs = True
            for t in _tensors((args, kwargs)):
                st = _storage(t)
                if st is None:
                    continue
                key = led.key_of(st)
                if key is None:  # made outside the dispatcher: counted from here, as an input
                    key = led.add(st, run.label_of(t), INPUTS, "", run.scope.statement())
                if led.category[key] != INPUTS:
                    all_inputs = False
            out = func(*args, **kwargs)
            name = func.__name__
            run.ops[name] = run.ops.get(name, 0) + 1
            new_category = (
                INPUTS
                if all_inputs and not run.stack and not run.in_step and not _in_backward()
                else TEMPORARIES
            )
            module = run.module_now()
            for t in _tensors(out):
                st = _storage(t)
                if st is None:
                    continue
                key = led.key_of(st)
                if key is None:
                    led.add(st, run.label_of(t), new_category, module, run.scope.statement())
                else:
                    led.resized(key, st)
            return out

    return Counter


_COUNTER: type | None = None


def _DispatchCounter(run: _TrackedRun) -> Any:  # noqa: N802 - a class built on first use
    global _COUNTER
    if _COUNTER is None:
        _COUNTER = _dispatch_mode_class()
    return _COUNTER(run)
