"""Rules about the optimizer step: per-parameter loops, zeroing gradients in place."""

from __future__ import annotations

import re

import numpy as np

from gpumagic.profile.analysis import tree
from gpumagic.profile.analysis.where import EvidenceRows
from gpumagic.profile.rules.base import Context, Finding
from gpumagic.units import fmt_mean_count, fmt_us

_FOREACH = re.compile(r"_foreach_|_fused_|fused", re.IGNORECASE)


def optimizer(c: Context) -> Finding | None:
    if not c.has_gpu:
        return None
    host = c.trace.host
    spans = host.name.mask(lambda n: n.startswith("Optimizer.step#")) & c.host_in_steps(host.ts)
    if not spans.any():
        return None
    if any(_FOREACH.search(host.name.at(i)) for i in np.flatnonzero(spans).tolist()):
        return None
    host_par, rt_par = c.a.parents
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
    gpu = c.trace.gpu
    linked = c.a.launch_runtime >= 0
    op = np.full(len(gpu.ts), -1, np.int64)
    op[linked] = rt_par[c.a.launch_runtime[linked]]
    from_opt = (op >= 0) & (inside[np.maximum(op, 0)] | spans[np.maximum(op, 0)])
    kernel_us = float((gpu.end - gpu.ts)[from_opt].sum())
    saving = c.per_step(max(span_us - kernel_us, 0.0))
    kind = host.name.at(int(np.flatnonzero(spans)[0])).split("#", 1)[1].split(".")[0]
    evidence: dict[str, float | int | str] = {
        "optimizer": kind,
        "step_calls": calls,
        "ops_per_parameter_loop": repeats,
        "optimizer_us_per_step": round(c.per_step(span_us), 1),
        "optimizer_kernel_us_per_step": round(c.per_step(kernel_us), 1),
    }
    message = (
        f"{kind}.step() loops over parameters one tensor at a time (the same op {repeats} times per call, "
        f"no _foreach_/fused kernels): {fmt_us(c.per_step(span_us))} per step on the CPU for "
        f"{fmt_us(c.per_step(kernel_us))} of GPU work."
    )
    snippet = (
        f"optimizer = torch.optim.{kind}(model.parameters(), lr=lr, foreach=True)  # multi-tensor kernels\n"
        f"# or, where supported (Adam, AdamW, SGD on CUDA): fused=True, one kernel for all parameters"
    )
    return c.finding(
        "optimizer",
        "Single-tensor optimizer loop",
        saving,
        message,
        evidence=evidence,
        fix="Use the multi-tensor (foreach=True) or fused (fused=True) optimizer implementation.",
        snippet=snippet,
        rows=EvidenceRows(
            host=np.flatnonzero(spans), host_weight=(host.end - host.ts)[spans]
        ),
    )


def zero_grad(c: Context) -> Finding | None:
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
    direct = in_span | top_level
    n = int(direct.sum())
    rows = np.flatnonzero(direct)
    host_us = float((host.end - host.ts)[rows].sum())
    dev_us = float(c.a.device_time[1][rows].sum())
    saving = c.per_step(max(host_us, dev_us))
    evidence: dict[str, float | int | str] = {
        "zero_calls_per_step": round(c.per_step(n), 1),
        "host_us_per_step": round(c.per_step(host_us), 1),
        "device_us_per_step": round(c.per_step(dev_us), 1),
    }
    message = (
        f"Gradients are zeroed in place, {fmt_mean_count(c.per_step(n))} zero_ calls per step "
        f"({fmt_us(c.per_step(host_us))} CPU, {fmt_us(c.per_step(dev_us))} GPU); setting them to None "
        "skips that work and the memory traffic."
    )
    return c.finding(
        "zero_grad",
        "Gradients zeroed instead of set to None",
        saving,
        message,
        evidence=evidence,
        fix="Use zero_grad(set_to_none=True) (the default since PyTorch 2.0).",
        snippet="optimizer.zero_grad(set_to_none=True)\n# model.zero_grad(set_to_none=True) likewise",
        rows=EvidenceRows(host=rows, host_weight=(host.end - host.ts)[rows]),
    )
