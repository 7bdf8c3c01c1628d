"""What each mode allocates of its own at the recorded marks: a small state machine per mode,
following the real system's code path (the sources are named in :mod:`.modes`).

FSDP2, per unit (one ``FSDPParamGroup``), torch 2.13's ``_fsdp_param_group.py``:

* ``pre_forward``: ``unshard`` all-gathers into one flat buffer (N × the unit's padded
  shards); ``wait_for_unshard`` frees the previous unit's flat buffer kept from forward,
  copies out into per-parameter buffers (the unsharded parameters) and keeps this flat
  buffer until the next unit's copy-out (the root's ``post_forward`` frees the last);
* ``post_forward``: ``reshard`` frees the unsharded parameters, except the root's;
* ``pre_backward``: unshard (if not prefetched) and copy out, freeing the flat buffer at
  once; then ``_backward_prefetch`` all-gathers the unit that finished forward just before
  this one (its flat buffer waits for its own ``pre_backward``);
* ``post_backward``: reshard; free the previous unit's reduce-scatter input; allocate this
  unit's (N × padded shards), copy the unsharded gradients in and free them; the
  reduce-scatter output becomes the sharded gradients;
* the root's final callback runs ``post_backward`` for the units whose inputs needed no
  gradient (the root) and frees the last reduce-scatter input.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpumagic.memory.fit.sharding.modes import ZERO_PERSISTENCE, ZERO_REDUCE_BUCKET, ddp_buckets
from gpumagic.memory.fit.sharding.record import (
    BACKWARD_END,
    BACKWARD_IN,
    BACKWARD_OUT,
    FORWARD_IN,
    FORWARD_OUT,
    GRAD_READY,
)

# The replay's Replayer (sizes, records, marks); not imported: it imports this module.
Replayer = Any

__all__ = ["Synthetic", "fsdp_machine", "simple_machine", "zero3_machine"]

_P, _G, _B = 0, 1, 6  # parameters, gradients, buffers (replay.CATEGORIES)
Switches = dict[int, list[tuple[int, int]]]


class Synthetic:
    """Allocations (+) and frees (-) a mode adds, each at a position of the event log
    (before the event of that index; ``sub`` orders them against it: -1 before all, 0 before,
    1 just after, 2 after the event's own allocation) in the order they are added."""

    def __init__(self) -> None:
        self.pos: list[int] = []
        self.sub: list[int] = []
        self.seq: list[int] = []
        self.delta: list[int] = []
        self.cat: list[int] = []
        self.n = 0

    def reserve(self) -> int:
        self.n += 1
        return self.n - 1

    def add(self, pos: int, delta: int, cat: int, sub: int = 0, seq: int | None = None) -> None:
        if delta == 0:
            return
        self.pos.append(pos)
        self.sub.append(sub)
        self.seq.append(self.reserve() if seq is None else seq)
        self.delta.append(delta)
        self.cat.append(cat)

    def arrays(self) -> tuple[np.ndarray, ...]:
        return tuple(np.array(x, dtype=np.int64) for x in (self.pos, self.sub, self.seq, self.delta, self.cat))


def _grad_itemsize(rp: Replayer) -> int:
    return max((s.itemsize for s in rp.trace.plan.params if s.trainable), default=4)


def simple_machine(rp: Replayer, mode: str, n: int, syn: Synthetic) -> Switches:
    """DDP's buckets (kept from construction); ZeRO-1's and -2's gradient bucket for each
    backward (``ipg_buffer``, ``reduce_bucket_size`` elements); ZeRO-2 reduces each gradient
    when it is ready."""
    specs = rp.trace.plan.params
    if mode == "ddp":
        sizes = [(s.numel * s.itemsize, s.itemsize) for s in specs if s.trainable]
        syn.add(0, sum(rp.round(b) for b in ddp_buckets(sizes)), _B, sub=-1)
        return {}
    bucket = rp.round(ZERO_REDUCE_BUCKET * _grad_itemsize(rp))
    switches: Switches = {}
    open_ = False
    for pos, kind, x in rp.trace.marks:
        if kind == BACKWARD_IN and not open_:
            syn.add(pos, bucket, _B)
            open_ = True
        elif kind == BACKWARD_END and open_:
            syn.add(pos, -bucket, _B)
            open_ = False
        elif kind == GRAD_READY and mode == "zero2":
            switches.setdefault(x, []).append((pos, syn.reserve()))
    return switches


def zero3_machine(rp: Replayer, n: int, syn: Synthetic) -> Switches:
    """ZeRO-3: the persistent gradient bucket; each unit's parameters (those over the
    persistence threshold) gathered for its forward and its backward, the next one
    prefetched, released after use; each gradient reduced when it is ready."""
    plan = rp.trace.plan
    specs = plan.params
    gathered_size = [
        rp.round(sum(specs[p].numel * specs[p].itemsize for p in u.params if specs[p].numel >= ZERO_PERSISTENCE))
        for u in plan.units
    ]
    syn.add(0, rp.round(ZERO_REDUCE_BUCKET * _grad_itemsize(rp)), _B, sub=-1)
    marks = rp.trace.marks
    following = _next_of_kind(marks)
    gathered = [False] * len(plan.units)
    switches: Switches = {}
    in_backward = False

    def gather(pos: int, u: int) -> None:
        if u >= 0 and not gathered[u]:
            gathered[u] = True
            syn.add(pos, gathered_size[u], _P)

    def release(pos: int, u: int) -> None:
        if gathered[u]:
            gathered[u] = False
            syn.add(pos, -gathered_size[u], _P)

    for i, (pos, kind, x) in enumerate(marks):
        if kind in (FORWARD_IN, BACKWARD_IN):
            in_backward = in_backward or kind == BACKWARD_IN
            gather(pos, x)
            gather(pos, following[i])
        elif (kind == FORWARD_OUT and not in_backward) or kind == BACKWARD_OUT:
            release(pos, x)
        elif kind == GRAD_READY:
            switches.setdefault(x, []).append((pos, syn.reserve()))
        elif kind == BACKWARD_END:
            in_backward = False
            for u in range(len(plan.units)):
                release(pos, u)
    return switches


def _next_of_kind(marks: list[tuple[int, str, int]]) -> list[int]:
    """For each F+ (B+) mark, the unit of the next F+ (B+) mark of another unit before the
    pass ends (-1: none): the unit a prefetch fetches."""
    out = [-1] * len(marks)
    for i, (_, kind, u) in enumerate(marks):
        if kind not in (FORWARD_IN, BACKWARD_IN):
            continue
        for _, k2, u2 in marks[i + 1:]:
            if k2 == BACKWARD_END or (kind == FORWARD_IN and k2 == BACKWARD_IN):
                break
            if k2 == kind and u2 != u:
                out[i] = u2
                break
    return out


class _Fsdp:
    """FSDP2's per-unit state over the marks (see the module docstring)."""

    def __init__(self, rp: Replayer, n: int, syn: Synthetic) -> None:
        plan = rp.trace.plan
        specs = plan.params
        self.rp, self.syn, self.n = rp, syn, n
        self.units = plan.units
        self.root = next(i for i, u in enumerate(plan.units) if u.root)
        full = [[n * rp.share(p, "fsdp", n) * specs[p].itemsize for p in u.params] for u in plan.units]
        self.params = [sum(rp.round(b) for b in f) for f in full]  # per-parameter buffers
        self.flat = [rp.round(sum(f)) for f in full]  # the all-gather output
        self.rs_in = [rp.round(sum(b for p, b in zip(u.params, f) if specs[p].trainable))
                      for u, f in zip(plan.units, full)]
        self.unit_of = {p: i for i, u in enumerate(plan.units) for p in u.params}
        k = len(plan.units)
        self.gathered, self.pending = [False] * k, [False] * k
        self.phase = ["idle"] * k
        self.indices: list[list[int]] = [[] for _ in range(k)]
        self.has_grads = [False] * k
        self.accumulated: list[list[int]] = [[] for _ in range(k)]  # bytes of whole grads added
        self.order: list[int] = []
        self.kept_flat: int | None = None
        self.rs: list[int] = []
        self.switches: Switches = {}

    def unshard(self, pos: int, u: int) -> None:
        if not (self.pending[u] or self.gathered[u]):
            self.pending[u] = True
            self.syn.add(pos, self.flat[u], _B)

    def wait(self, pos: int, u: int, forward: bool) -> None:
        if not self.pending[u]:
            return
        if forward and self.kept_flat is not None:
            self.syn.add(pos, -self.flat[self.kept_flat], _B)
            self.kept_flat = None
        self.syn.add(pos, self.params[u], _P)
        self.gathered[u], self.pending[u] = True, False
        if forward and self.n > 1:
            self.kept_flat = u
        else:
            self.syn.add(pos, -self.flat[u], _B)

    def reshard(self, pos: int, u: int) -> None:
        if self.gathered[u]:
            self.gathered[u] = False
            self.syn.add(pos, -self.params[u], _P)

    def forward_in(self, pos: int, u: int) -> None:
        if self.phase[u] == "pre_backward":  # recomputed under checkpointing
            self.unshard(pos, u)
            self.wait(pos, u, forward=False)
            return
        self.phase[u] = "forward"
        self.unshard(pos, u)
        self.wait(pos, u, forward=True)

    def forward_out(self, pos: int, u: int) -> None:
        if self.phase[u] == "pre_backward":
            return
        if u != self.root:
            self.reshard(pos, u)
        self.order.append(u)
        self.indices[u].append(len(self.order) - 1)
        self.phase[u] = "idle"
        if u == self.root and self.kept_flat is not None:
            self.syn.add(pos, -self.flat[self.kept_flat], _B)
            self.kept_flat = None

    def backward_in(self, pos: int, u: int) -> None:
        if self.phase[u] == "pre_backward":
            return
        self.phase[u] = "pre_backward"
        self.unshard(pos, u)
        self.wait(pos, u, forward=False)
        if self.indices[u]:
            i = self.indices[u].pop()
            if i >= 1:
                self.unshard(pos, self.order[i - 1])

    def post_backward(self, pos: int, u: int) -> None:
        self.phase[u] = "post_backward"
        self.reshard(pos, u)
        while self.rs:
            self.syn.add(pos, -self.rs_in[self.rs.pop(0)], _B)
        if not self.has_grads[u]:
            return
        self.has_grads[u] = False
        self.syn.add(pos, self.rs_in[u], _B)
        self.rs.append(u)
        seq = self.syn.reserve()
        for p in self.units[u].params:
            self.switches.setdefault(p, []).append((pos, seq))
        for nbytes in self.accumulated[u]:
            self.syn.add(pos, -nbytes, _G)
        self.accumulated[u] = []

    def grad_ready(self, pos: int, p: int) -> None:
        u = self.unit_of.get(p)
        if u is None:
            return
        self.has_grads[u] = True
        r = self.rp.grad_alive_at(p, pos)
        if r is not None and self.rp.alloc[r] < self.rp.backward_start(pos):
            # accumulated into a gradient from before: the unsharded one is new and whole
            nbytes = int(self.rp.nbytes[r])
            self.syn.add(pos, nbytes, _G)
            self.accumulated[u].append(nbytes)

    def backward_end(self, pos: int) -> None:
        for u in [self.root, *(i for i in range(len(self.units)) if i != self.root)]:
            if self.phase[u] != "post_backward":
                self.post_backward(pos, u)
        while self.rs:
            self.syn.add(pos, -self.rs_in[self.rs.pop(0)], _B)
        self.phase = ["idle"] * len(self.units)
        self.order = []
        self.indices = [[] for _ in self.units]


def fsdp_machine(rp: Replayer, n: int, syn: Synthetic) -> Switches:
    machine = _Fsdp(rp, n, syn)
    handlers = {
        FORWARD_IN: machine.forward_in,
        FORWARD_OUT: machine.forward_out,
        BACKWARD_IN: machine.backward_in,
        BACKWARD_OUT: machine.post_backward,
        GRAD_READY: machine.grad_ready,
    }
    for pos, kind, x in rp.trace.marks:
        if kind == BACKWARD_END:
            machine.backward_end(pos)
        elif kind in handlers:
            handlers[kind](pos, x)
    return machine.switches
