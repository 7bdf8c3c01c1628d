"""The recording dry run: the cell's own single-process step, with marks at the moments a
sharded run acts, placed in the census's sequence of allocations and frees.

FSDP2 (``torch/distributed/fsdp/_fully_shard/_fsdp_state.py``) acts at four moments of each
unit: before its forward (a forward pre-hook: all-gather), after it (a forward hook:
reshard), before its backward (a hook on the grad of each of its outputs: all-gather again,
prefetch the next unit) and after it (an autograd function around its inputs, whose backward
runs once the unit's backward is done: reduce-scatter of its gradients), plus a callback when
the whole backward ends. DDP's reducer and DeepSpeed act when each parameter's gradient is
ready. The recording run puts hooks at the same places on the shadow's model (they allocate
nothing: the run's memory is the plain run's) and notes, at each, how many allocations and
frees the census has logged, and which of the census's records hold each unit's parameters,
each parameter's gradient and the optimizer's state for it.

Nothing of the user's is touched: the hooks are on the shadow's copies (they go with it), and
the two global optimizer hooks are removed by :meth:`StepRecorder.finish`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from gpumagic.memory.census.dispatch import StorageMode
from gpumagic.memory.census.reach import tensors_in
from gpumagic.memory.fit.sharding.units import Plan, find_model, plan_units

__all__ = ["GRAD", "PARAM", "STATE", "Mark", "StepRecorder", "StepTrace"]

# What a record holds for the sharding model.
PARAM, GRAD, STATE = 1, 2, 3
# Marks: (position in the event log, kind, unit or parameter index)
FORWARD_IN, FORWARD_OUT, BACKWARD_IN, BACKWARD_OUT = "F+", "F-", "B+", "B-"
GRAD_READY, BACKWARD_END, STEP_IN, STEP_OUT = "G", "E", "S+", "S-"
Mark = tuple[int, str, int]


@dataclass
class StepTrace:
    """What the sharding model replays: the census's events (record index, +1/-1 per
    event; ``records`` the census's records), the marks, the plan, and the role of each
    record that holds a parameter, a gradient or optimizer state: record index ->
    (role, parameter index, elements, bytes per element)."""

    plan: Plan
    records: list[Any]
    events: list[int]
    signs: list[int]
    marks: list[Mark]
    roles: dict[int, tuple[int, int, int, int]]
    rounding: int
    problems: list[str] = field(default_factory=list)


class _AfterBackward(torch.autograd.Function):
    """Identity on a unit's inputs whose backward runs when the unit's backward is done (as
    FSDP2's ``RegisterPostBackwardFunction``); it allocates nothing."""

    @staticmethod
    def forward(ctx: Any, mark: Any, *inputs: torch.Tensor) -> Any:
        ctx.mark = mark
        return inputs

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        ctx.mark()
        return (None, *grads)


def _census() -> Any:
    """The census counting the run now (its dispatch mode is on the stack while it counts)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, StorageMode):
            return mode.tracker
    return None


class StepRecorder:
    """The transform a recording dry run is made with (:func:`~..dry_run.dry_run`'s
    ``transform``): :meth:`install` puts the hooks on the shadow's model; after the run,
    :meth:`finish` removes the global ones and returns the :class:`StepTrace`."""

    def __init__(self) -> None:
        self.plan: Plan | None = None
        self.problem = ""
        self._reset()

    def _reset(self) -> None:
        self.census: Any = None
        self.marks: list[Mark] = []
        self.roles: dict[int, tuple[int, int, int, int]] = {}  # id(record) -> role
        self.kept: dict[int, Any] = {}  # id(record) -> record (kept alive for the ids)
        self.index: dict[int, int] = {}  # id(parameter) -> its index
        self.backward_open = False
        self.failed = ""
        self._global: list[Any] = []

    # -- installing ---------------------------------------------------------------------------
    def install(self, shadow: Any) -> list[str]:
        self.finish_hooks()
        self._reset()
        found = find_model(shadow.namespace)
        if found is None:
            self.plan = None
            self.problem = "no model (nn.Module) in the namespace the cell reads: build it in an earlier cell"
            return []
        self.plan = plan_units(found[1], found[0])
        self.index = {id(p): i for i, p in enumerate(self.plan.objects)}
        for u, module in enumerate(self.plan.modules):
            module.register_forward_pre_hook(self._forward_in(u), with_kwargs=True)
            module.register_forward_hook(self._forward_out(u))
        for i, p in enumerate(self.plan.objects):
            if p.requires_grad and p.is_leaf:
                p.register_post_accumulate_grad_hook(self._grad_ready(i))
        from torch.optim import optimizer as optim

        self._global = [
            optim.register_optimizer_step_pre_hook(self._step(STEP_IN)),
            optim.register_optimizer_step_post_hook(self._step(STEP_OUT)),
        ]
        return []

    def finish_hooks(self) -> None:
        for handle in self._global:
            handle.remove()
        self._global = []

    # -- the marks ----------------------------------------------------------------------------
    def _mark(self, kind: str, index: int) -> None:
        census = self.census if self.census is not None else _census()
        if census is None or census.ledger.events is None:
            return
        self.census = census
        events = census.ledger.events
        self.marks.append((len(events.signs) + events.dropped, kind, index))

    def _role(self, t: Any, role: int, param: int) -> None:
        census = self.census
        if census is None or not isinstance(t, torch.Tensor):
            return
        rec = census.record_of(t)
        if rec is not None:
            self.roles[id(rec)] = (role, param, t.numel(), t.element_size())
            self.kept[id(rec)] = rec

    def _guarded(self, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.failed:
                return None
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # the model's own run goes on; the report says why
                self.failed = f"the sharding model's hooks failed: {type(exc).__name__}: {exc}"
                return None

        return call

    def _forward_in(self, unit: int) -> Any:
        def hook(module: Any, args: Any, kwargs: Any) -> Any:
            self._mark(FORWARD_IN, unit)
            assert self.plan is not None
            for i in self.plan.units[unit].params:
                self._role(self.plan.objects[i], PARAM, i)
            if not torch.is_grad_enabled():
                return None
            flat, spec = tree_flatten((args, kwargs))
            wanted = [k for k, x in enumerate(flat) if isinstance(x, torch.Tensor) and x.requires_grad]
            if not wanted:
                return None  # its post-backward comes with the end of backward, as FSDP2's
            outs = _AfterBackward.apply(self._guarded(lambda: self._mark(BACKWARD_OUT, unit)), *(flat[k] for k in wanted))
            for k, out in zip(wanted, outs):
                flat[k] = out
            new_args, new_kwargs = tree_unflatten(flat, spec)
            return new_args, new_kwargs

        return self._guarded(hook)

    def _forward_out(self, unit: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            self._mark(FORWARD_OUT, unit)
            if not torch.is_grad_enabled():
                return
            for t in tensors_in(output):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(self._guarded(lambda grad, _u=unit: self._backward_in(_u)))

        return self._guarded(hook)

    def _backward_in(self, unit: int) -> None:
        self._mark(BACKWARD_IN, unit)
        if not self.backward_open:
            self.backward_open = True
            torch.autograd.Variable._execution_engine.queue_callback(self._guarded(self._backward_end))

    def _backward_end(self) -> None:
        self.backward_open = False
        self._mark(BACKWARD_END, -1)

    def _grad_ready(self, index: int) -> Any:
        def hook(p: Any) -> None:
            self._mark(GRAD_READY, index)
            self._role(p, PARAM, index)
            if p.grad is not None:
                self._role(p.grad, GRAD, index)

        return self._guarded(hook)

    def _step(self, kind: str) -> Any:
        def hook(opt: Any, args: Any, kwargs: Any) -> None:
            self._mark(kind, -1)
            for group in opt.param_groups:
                for p in group["params"]:
                    i = self.index.get(id(p))
                    if i is None:
                        continue
                    self._role(p, PARAM, i)
                    if p.grad is not None:
                        self._role(p.grad, GRAD, i)
                    for t in tensors_in(opt.state.get(p, {})):
                        self._role(t, STATE, i)

        return self._guarded(hook)

    # -- the answer ---------------------------------------------------------------------------
    def finish(self) -> StepTrace | None:
        """The trace of the last recording run (None, with :attr:`problem` set, when there is
        none to replay)."""
        self.finish_hooks()
        if self.plan is None:
            return None
        census = self.census
        if census is None or census.ledger.events is None:
            self.problem = self.failed or "the model never ran in the cell (no forward pass, no optimizer step)"
            return None
        log = census.ledger.events
        if log.dropped:
            self.problem = f"the step made more than {len(log.signs):,} allocations: too long to replay"
            return None
        order: dict[int, int] = {}
        records: list[Any] = []
        events: list[int] = []
        for rec in log.records:
            i = order.get(id(rec))
            if i is None:
                i = order[id(rec)] = len(records)
                records.append(rec)
            events.append(i)
        roles = {order[k]: v for k, v in self.roles.items() if k in order}
        problems = [self.failed] if self.failed else []
        return StepTrace(self.plan, records, events, list(log.signs), list(self.marks), roles,
                         census.rounding, problems)
