"""Rules about the optimizer step: per-parameter loops, zeroing gradients in place."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gpumagic.profile.analysis import tree
from gpumagic.profile.analysis.where import EvidenceRows
from gpumagic.profile.rules.base import Advice, Context, Evidence, Facts
from gpumagic.units import fmt_mean_count, fmt_us

# --- optimizer -------------------------------------------------------------------------

_FOREACH = re.compile(r"_foreach_|_fused_|fused", re.IGNORECASE)


@dataclass(frozen=True, eq=False, kw_only=True)
class PerParameterLoop(Evidence):
    """``Optimizer.step`` spans that repeat the same op once per parameter (no
    ``_foreach_``/fused kernels), and what they cost per step."""

    optimizer: str  # the class the span names: "SGD", "Adam"
    step_calls: int
    repeats: int  # times the most repeated op runs per step() call
    host_us: float  # per step, the optimizer spans
    kernel_us: float  # per step, GPU time of the kernels launched from inside them

    def quoted(self) -> dict[str, float | int | str]:
        return {
            "optimizer": self.optimizer,
            "step_calls": self.step_calls,
            "ops_per_parameter_loop": self.repeats,
            "optimizer_us_per_step": round(self.host_us, 1),
            "optimizer_kernel_us_per_step": round(self.kernel_us, 1),
        }


def detect_optimizer(c: Context) -> PerParameterLoop | None:
    if not c.has_gpu:
        return None
    host = c.trace.host
    spans = host.name.mask(lambda n: n.startswith("Optimizer.step#")) & c.host_in_steps(host.ts)
    if not spans.any():
        return None
    if any(_FOREACH.search(host.name.at(i)) for i in np.flatnonzero(spans).tolist()):
        return None
    host_par, _ = c.a.parents
    inside = tree.any_ancestor(host_par, spans)
    inner = np.flatnonzero(inside)
    if len(inner) == 0 or any(
        _FOREACH.search(v) for v in {host.name.at(i) for i in inner.tolist()}
    ):
        return None
    if c.live is not None and any(o.foreach or o.fused for o in c.live.optimizers):
        return None
    # a per-parameter loop repeats the same op once per parameter in every step() call
    direct = np.flatnonzero(spans[np.maximum(host_par, 0)] & (host_par >= 0))
    counts = np.bincount(host.name.codes[direct]) if len(direct) else np.zeros(1, np.int64)
    calls = int(spans.sum())
    repeats = int(counts.max()) // max(calls, 1)
    if repeats < 8:
        return None
    span_us = float((host.end - host.ts)[spans].sum())
    # GPU time of the kernels launched from inside the optimizer (what must remain)
    gpu, op = c.trace.gpu, c.a.launch_op
    from_opt = (op >= 0) & (inside[np.maximum(op, 0)] | spans[np.maximum(op, 0)])
    kernel_us = float((gpu.end - gpu.ts)[from_opt].sum())
    return PerParameterLoop(
        saving_us=c.per_step(max(span_us - kernel_us, 0.0)),
        rows=EvidenceRows(host=np.flatnonzero(spans), host_weight=(host.end - host.ts)[spans]),
        optimizer=host.name.at(int(np.flatnonzero(spans)[0])).split("#", 1)[1].split(".")[0],
        step_calls=calls,
        repeats=repeats,
        host_us=c.per_step(span_us),
        kernel_us=c.per_step(kernel_us),
    )


def advise_optimizer(e: PerParameterLoop, facts: Facts) -> Advice:
    message = (
        f"{e.optimizer}.step() loops over parameters one tensor at a time (the same op "
        f"{e.repeats} times per call, no _foreach_/fused kernels): {fmt_us(e.host_us)} per step "
        f"on the CPU for {fmt_us(e.kernel_us)} of GPU work."
    )
    snippet = (
        f"optimizer = torch.optim.{e.optimizer}(model.parameters(), lr=lr, foreach=True)  # multi-tensor kernels\n"
        f"# or, where supported (Adam, AdamW, SGD on CUDA): fused=True, one kernel for all parameters"
    )
    return Advice(
        "Single-tensor optimizer loop",
        message,
        "Use the multi-tensor (foreach=True) or fused (fused=True) optimizer implementation.",
        snippet,
    )


# --- zero_grad -------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, kw_only=True)
class InPlaceZeroGrad(Evidence):
    """Gradients zeroed with ``zero_`` calls instead of being set to None, per step."""

    calls: float
    host_us: float
    device_us: float

    def quoted(self) -> dict[str, float | int | str]:
        return {
            "zero_calls_per_step": round(self.calls, 1),
            "host_us_per_step": round(self.host_us, 1),
            "device_us_per_step": round(self.device_us, 1),
        }


def detect_zero_grad(c: Context) -> InPlaceZeroGrad | None:
    host = c.trace.host
    in_steps = c.host_in_steps(host.ts)
    zero = host.name.mask(lambda n: n == "aten::zero_") & in_steps
    # PyTorch 2 zeroes all gradients of a device in one aten::_foreach_zero_ call
    foreach = host.name.mask(lambda n: n == "aten::_foreach_zero_") & in_steps
    if not zero.any() and not foreach.any():
        return None
    host_par, _ = c.a.parents
    # zeroing a gradient is called from Python, not from inside another operator; the
    # zero_ calls nested in aten ops (aten::zeros, autograd) are not zero_grad
    is_op = host.name.mask(lambda n: "::" in n)
    in_zero_grad = tree.any_ancestor(host_par, host.name.mask(lambda n: "zero_grad" in n))
    # inside Optimizer.zero_grad (PyTorch >= 1.9 records it) any zeroing is the tell;
    # older traces have no such span, so ask for several top-level zero_ per step
    in_span = (zero | foreach) & in_zero_grad
    top_level = zero & ~tree.any_ancestor(host_par, is_op) & ~in_zero_grad
    if not in_span.any() and c.per_step(int(top_level.sum())) < 4:
        return None
    rows = np.flatnonzero(in_span | top_level)
    host_us = float((host.end - host.ts)[rows].sum())
    dev_us = float(c.a.device_time[1][rows].sum())
    return InPlaceZeroGrad(
        saving_us=c.per_step(max(host_us, dev_us)),
        rows=EvidenceRows(host=rows, host_weight=(host.end - host.ts)[rows]),
        calls=c.per_step(len(rows)),
        host_us=c.per_step(host_us),
        device_us=c.per_step(dev_us),
    )


def advise_zero_grad(e: InPlaceZeroGrad, facts: Facts) -> Advice:
    message = (
        f"Gradients are zeroed in place, {fmt_mean_count(e.calls)} zero_ calls per step "
        f"({fmt_us(e.host_us)} CPU, {fmt_us(e.device_us)} GPU); setting them to None "
        "skips that work and the memory traffic."
    )
    return Advice(
        "Gradients zeroed instead of set to None",
        message,
        "Use zero_grad(set_to_none=True) (the default since PyTorch 2.0).",
        "optimizer.zero_grad(set_to_none=True)\n# model.zero_grad(set_to_none=True) likewise",
    )
