"""One rank's memory over the recorded step, for a sharding mode and a number of GPUs.

The recording run's allocations and frees are replayed in their order with each storage at
the size it has on the busiest rank, and the mode's own allocations put in at the marks where
the real system makes them (:mod:`.machines`): the peak's moment is found on that timeline,
not from totals. What changes, per storage:

* a parameter: its shard (FSDP: ``ceil(rows / N)`` rows; ZeRO-3: ``ceil(numel / N)``
  elements, none for one under the persistence threshold) where the mode divides parameters;
* a gradient made by backward: whole until the mode reduces it (FSDP: its unit's
  post-backward; ZeRO-2 and -3: as soon as it is ready, copied into the bucket), its shard
  after, where the mode divides gradients; one accumulated into an existing gradient is
  whole for as long again (FSDP: a new unsharded gradient each backward);
* optimizer state: its share where the mode divides it (ZeRO with 16-bit parameters: in
  fp32, and an fp32 master copy of the share from the start);
* a temporary of the optimizer step: its share where the optimizer state is divided;
* everything else (activations, inputs, the forward's and backward's temporaries): as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpumagic.memory.census.categories import ACTIVATIONS, INPUTS, OTHER, TEMPORARIES
from gpumagic.memory.census.ledger import BACKWARD, EARLIER, STEP
from gpumagic.memory.fit.accounting import FIT_KEYS
from gpumagic.memory.fit.sharding.machines import (
    Synthetic,
    fsdp_machine,
    simple_machine,
    zero3_machine,
)
from gpumagic.memory.fit.sharding.modes import MODES, ZERO_PERSISTENCE, fsdp_rows
from gpumagic.memory.fit.sharding.record import (
    BACKWARD_END,
    GRAD,
    GRAD_READY,
    PARAM,
    STATE,
    StepTrace,
)

__all__ = ["BUFFERS", "CATEGORIES", "RankPeak", "Replayer"]

BUFFERS = "buffers"
CATEGORIES = (*FIT_KEYS, BUFFERS)
_P, _G, _O, _A, _T, _I, _B = range(7)


@dataclass
class RankPeak:
    """One rank's predicted peak: ``categories`` alive then (``buffers``: the mode's own
    collective buffers), ``statement`` running then (-1: before the cell), ``model_states``
    the parameters, gradients and optimizer state one rank holds after a step (the ZeRO
    paper's quantity)."""

    mode: str
    gpus: int
    peak: int
    categories: dict[str, int]
    statement: int
    model_states: int
    parts: dict[str, int] = field(default_factory=dict)  # model states: params, grads, state


class Replayer:
    """A recorded step, ready to be replayed for any mode and N (the per-trace work is done
    once here)."""

    def __init__(self, trace: StepTrace) -> None:
        self.trace = trace
        self.r = max(trace.rounding, 1)
        recs = trace.records
        self.nbytes = np.array([rec.nbytes for rec in recs], dtype=np.int64)
        self.born = np.array([rec.born for rec in recs], dtype=np.int64)
        self.statement = np.array([rec.statement for rec in recs], dtype=np.int64)
        self.ev_rec = np.array(trace.events, dtype=np.int64)
        self.ev_sign = np.array(trace.signs, dtype=np.int64)
        n_ev = len(trace.events)
        self.alloc = np.full(len(recs), n_ev, dtype=np.int64)
        self.free = np.full(len(recs), n_ev, dtype=np.int64)
        plus = self.ev_sign > 0
        idx = np.arange(n_ev)
        np.minimum.at(self.alloc, self.ev_rec[plus], idx[plus])
        minus = ~plus
        self.free[:] = n_ev
        np.maximum.at(self.free, self.ev_rec[minus], idx[minus])
        self.free[self.free < self.alloc] = n_ev  # never freed after its last allocation
        self.cat = np.array([_fit_cat(rec) for rec in recs], dtype=np.int64)
        self.grads: dict[int, list[int]] = {}
        for r, (role, p, _n, _s) in trace.roles.items():
            self.cat[r] = {PARAM: _P, GRAD: _G, STATE: _O}[role]
            if role == GRAD:
                self.grads.setdefault(p, []).append(r)
        for rs in self.grads.values():
            rs.sort(key=lambda r: self.alloc[r])
        self.backward_ends = [pos for pos, kind, _ in trace.marks if kind == BACKWARD_END]

    def round(self, nbytes: int) -> int:
        r = self.r
        return -(-int(nbytes) // r) * r if r > 1 else int(nbytes)

    # -- sizes on one rank ---------------------------------------------------------------------
    def share(self, p: int, mode: str, n: int, numel: int | None = None) -> int:
        """Elements of parameter ``p`` (or of a tensor of its size) on the busiest rank."""
        spec = self.trace.plan.params[p]
        if numel is not None and numel != spec.numel:
            # a state tensor of another size: a step count stays, a factored moment divides
            return numel if n <= 1 or numel <= 1 else -(-numel // n)
        if n <= 1:
            return spec.numel
        if mode == "fsdp":
            rows = spec.shape[0]
            return fsdp_rows(rows, n) * (spec.numel // max(rows, 1))
        if mode == "zero3" and spec.numel < ZERO_PERSISTENCE:
            return spec.numel  # under the persistence threshold: whole, and gathered never
        return -(-spec.numel // n)

    def _sizes(self, mode: str, n: int) -> np.ndarray:
        m = MODES[mode]
        sizes = self.nbytes.copy()
        half_params = self._half_params()
        for r, (role, p, numel, itemsize) in self.trace.roles.items():
            if role == PARAM and m.params:
                sizes[r] = self.round(self.share(p, mode, n) * itemsize)
            elif role == GRAD and m.grads:
                sizes[r] = self.round(self.share(p, "zero2" if mode == "zero3" else mode, n) * itemsize)
            elif role == STATE and m.state:
                state_bytes = 4 if (mode.startswith("zero") and half_params and numel > 1) else itemsize
                sizes[r] = self.round(self.share(p, mode if mode == "fsdp" else "zero2", n, numel) * state_bytes)
        if m.state and n > 1:
            step_temps = (self.born == STEP) & (self.cat != _O) & (self.cat != _P) & (self.cat != _G)
            sizes[step_temps] = [self.round(-(-int(b) // n)) for b in self.nbytes[step_temps]]
        return sizes

    def _half_params(self) -> bool:
        """16-bit trainable parameters: DeepSpeed's mixed precision (fp32 master and state)."""
        specs = [s for s in self.trace.plan.params if s.trainable and s.floating]
        return bool(specs) and all(s.itemsize == 2 for s in specs)

    # -- the replay ---------------------------------------------------------------------------
    def rank(self, mode: str, n: int) -> RankPeak:
        sizes = self._sizes(mode, n)
        syn = Synthetic()
        switches = self._machine(mode, n, syn)
        if MODES[mode].grads and n > 1:
            self._grow_grads(mode, n, sizes, switches, syn)
        if mode.startswith("zero") and self._half_params() and n > 1:
            master = sum(self.round(4 * self.share(p, "zero2", n)) for p, s in enumerate(self.trace.plan.params)
                         if s.trainable and s.floating)
            syn.add(0, master, _O, sub=-1)
        return self._peak(mode, n, sizes, syn)

    def _machine(self, mode: str, n: int, syn: Synthetic) -> dict[int, list[tuple[int, int]]]:
        """The mode's own allocations at the marks; returns where each parameter's new
        gradient is reduced: parameter -> [(position, order)]."""
        if n <= 1 and mode not in ("ddp", "fsdp"):
            return {}  # FSDP2 gathers its units into new tensors even on one GPU (measured)
        if mode == "fsdp":
            return fsdp_machine(self, n, syn)
        if mode == "zero3":
            return zero3_machine(self, n, syn)
        return simple_machine(self, mode, n, syn)

    def _grow_grads(self, mode: str, n: int, sizes: np.ndarray, switches: dict[int, list[tuple[int, int]]],
                    syn: Synthetic) -> None:
        """Each gradient backward makes: whole from its allocation to its reduction."""
        for p, records in self.grads.items():
            points = switches.get(p, [])
            for r in records:
                extra = int(self.nbytes[r] - sizes[r])
                if self.born[r] != BACKWARD or extra <= 0:
                    continue
                a, f = int(self.alloc[r]), int(self.free[r])
                syn.add(a, extra, _G, sub=2)
                at = next(((pos, seq) for pos, seq in points if pos > a), None)
                if at is not None and at[0] <= f:
                    syn.add(at[0], -extra, _G, seq=at[1])
                else:
                    syn.add(f, -extra, _G, sub=1)

    def _peak(self, mode: str, n: int, sizes: np.ndarray, syn: Synthetic) -> RankPeak:
        n_ev = len(self.ev_rec)
        s_pos, s_sub, s_seq, s_delta, s_cat = syn.arrays()
        pos = np.concatenate([np.arange(n_ev), s_pos])
        sub = np.concatenate([np.ones(n_ev, dtype=np.int64), s_sub])
        seq = np.concatenate([np.zeros(n_ev, dtype=np.int64), s_seq])
        delta = np.concatenate([self.ev_sign * sizes[self.ev_rec], s_delta])
        cat = np.concatenate([self.cat[self.ev_rec], s_cat])
        source = np.concatenate([self.ev_rec, np.full(len(s_pos), -1, dtype=np.int64)])
        order = np.lexsort((seq, sub, pos))
        running = np.cumsum(delta[order])
        if len(running) == 0:
            return RankPeak(mode, n, 0, dict.fromkeys(CATEGORIES, 0), -1, 0)
        top = int(np.argmax(running))
        upto = order[: top + 1]
        by_cat = np.bincount(cat[upto], weights=delta[upto], minlength=len(CATEGORIES))
        real = source[upto][source[upto] >= 0]
        statement = int(self.statement[real[-1]]) if len(real) else -1
        parts = self.model_state_parts(mode, n, sizes)
        return RankPeak(
            mode, n, int(running[top]), {k: int(v) for k, v in zip(CATEGORIES, by_cat)}, statement,
            sum(parts.values()), parts,
        )

    def model_state_parts(self, mode: str, n: int, sizes: np.ndarray) -> dict[str, int]:
        """Parameters, gradients (one per trainable parameter) and optimizer state (what
        outlives the step, a master copy included) one rank holds after a step."""
        m = MODES[mode]
        specs = self.trace.plan.params
        params = sum(self.round(self.share(p, mode, n) * s.itemsize) if m.params else self.round(s.numel * s.itemsize)
                     for p, s in enumerate(specs))
        grads = sum(self.round((self.share(p, "zero2" if mode == "zero3" else mode, n) if m.grads else s.numel)
                               * s.itemsize) for p, s in enumerate(specs) if s.trainable)
        n_ev = len(self.ev_rec)
        state = sum(int(sizes[r]) for r, (role, *_rest) in self.trace.roles.items()
                    if role == STATE and self.free[r] == n_ev)
        if mode.startswith("zero") and self._half_params() and n > 1:
            state += sum(self.round(4 * self.share(p, "zero2", n)) for p, s in enumerate(specs) if s.trainable and s.floating)
        return {"parameters": params, "gradients": grads, "optimizer_state": state}

    def grad_alive_at(self, p: int, position: int) -> int | None:
        """The gradient record of parameter ``p`` alive at ``position`` (None: none)."""
        for r in self.grads.get(p, []):
            if self.alloc[r] <= position < self.free[r] or (self.alloc[r] <= position and self.free[r] == len(self.ev_rec)):
                return r
        return None

    def backward_start(self, position: int) -> int:
        """Where the backward that ``position`` belongs to began (after the last one ended)."""
        return max((e for e in self.backward_ends if e <= position), default=0)

    def grad_marks(self) -> list[tuple[int, int]]:
        return [(pos, p) for pos, kind, p in self.trace.marks if kind == GRAD_READY]


def _fit_cat(rec: Any) -> int:
    """A census record's category as %%memfit reports it (the accounting's split of "other")."""
    cat = rec.cat
    if cat == OTHER:
        return INPUTS if rec.born == EARLIER else TEMPORARIES
    if cat > OTHER:  # still pending: a temporary of a statement that did not end
        return TEMPORARIES
    if cat == ACTIVATIONS:
        return _A
    return int(cat)
