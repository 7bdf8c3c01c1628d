"""Rules about kernels and device memory: low utilisation, small grids, memory near
capacity, cuDNN autotuning."""

from __future__ import annotations

import re

import numpy as np

from gpumagic.profile.analysis import tree
from gpumagic.profile.analysis.where import EvidenceRows
from gpumagic.profile.rules.base import Context, Finding, kernels_named
from gpumagic.profile.trace.model import KERNEL
from gpumagic.units import fmt_bytes, fmt_percent, fmt_us


def low_utilization(c: Context) -> Finding | None:
    util = c.a.gpu_utilization_percent
    if util is None or util >= 50.0:
        return None
    idle_us = c.step_us * (100.0 - util) / 100.0
    cats = c.a.device_gaps.total_by_category()
    evidence: dict[str, float | int | str] = {
        "gpu_utilization_percent": round(util, 1),
        "gpu_idle_us_per_step": round(idle_us, 1),
    }
    for cat, us in cats.items():
        evidence[f"idle_{cat}_us_per_step"] = round(c.per_step(us), 1)
    message = (
        f"Kernels run only {fmt_percent(util)} of the step; the GPU is idle {fmt_us(idle_us)} per step. "
        "The other findings name causes; what they do not explain is shown as the saving."
    )
    if c.a.comms.kernels.any():  # utilisation counts compute kernels only (issue 11)
        message = (
            f"Compute kernels run only {fmt_percent(util)} of the step; for {fmt_us(idle_us)} per "
            "step the GPU computes nothing (it is idle, or only communicating). The other "
            "findings name causes; what they do not explain is shown as the saving."
        )
    snippet = (
        "# give the GPU more work per launch and per step\n"
        "loader = torch.utils.data.DataLoader(dataset, batch_size=2 * batch_size, ...)\n"
        "model = torch.compile(model)"
    )
    return c.finding(
        "low_utilization",
        "GPU busy less than half of the step",
        idle_us,  # replaced by the unexplained remainder in diagnose()
        message,
        evidence=evidence,
        fix="Remove the stalls found above; then raise the batch size or fuse work with torch.compile.",
        snippet=snippet,
    )


_COLLECTIVE = r"^(?:void )?(?:nccl|rccl|ncclDevKernel|ncclKernel)"


def small_grid(c: Context, top: int = 10) -> Finding | None:
    if not c.has_gpu:
        return None
    k = c.a.kernels_frame(np.flatnonzero(c.gpu_in_steps))
    # collectives use few blocks on purpose (bandwidth-bound, they leave SMs to compute)
    k = k[~k["name"].str.contains(_COLLECTIVE, regex=True)]
    if k.empty:
        return None
    head = k.head(top)
    small = head[(head["blocks_per_sm"] < 1.0) & head["blocks_per_sm"].notna()]
    if small.empty:
        return None
    total = float(k["total_us"].sum())
    share = float(small["total_us"].sum()) / total if total > 0 else 0.0
    if share < 0.10:
        return None
    # Upper bound: a kernel filling a fraction f of the SMs would take f of its time if
    # its blocks were spread over all of them.
    saving = c.per_step(float((small["total_us"] * (1.0 - small["blocks_per_sm"])).sum()))
    worst = small.iloc[0]
    evidence: dict[str, float | int | str] = {
        "kernels": len(small),
        "share_of_kernel_time_percent": round(100 * share, 1),
        "worst_kernel": str(worst["name"])[:120],
        "worst_blocks_per_sm": round(float(worst["blocks_per_sm"]), 3),
    }
    message = (
        f"{len(small)} of the {len(head)} most expensive kernels ({fmt_percent(100 * share)} of GPU time) launch "
        f"fewer blocks than the GPU has SMs (blocks per SM < 1), leaving SMs idle while they run. "
        "Saving is an upper bound (those kernels spread over every SM)."
    )
    snippet = (
        "# more parallel work per kernel: a larger batch, or fuse small ops\n"
        "model = torch.compile(model)\n"
        "# for a custom kernel, launch at least as many blocks as SMs:\n"
        "# torch.cuda.get_device_properties(0).multi_processor_count"
    )
    return c.finding(
        "small_grid",
        "Kernels too small to fill the GPU",
        saving,
        message,
        evidence=evidence,
        fix="Give kernels more parallel work (larger batch, fusion); launch grids of at least one block per SM.",
        snippet=snippet,
        rows=kernels_named(c, set(small["name"]), module=True),
    )


def memory_ceiling(c: Context) -> Finding | None:
    for peak in c.a.memory_peaks:
        if peak.capacity_bytes is None:
            continue
        share = peak.peak_bytes / peak.capacity_bytes
        if share <= 0.90:
            continue
        evidence: dict[str, float | int | str] = {
            "device": peak.device,
            "peak_bytes": int(peak.peak_bytes),
            "capacity_bytes": peak.capacity_bytes,
            "peak_percent": round(100 * share, 1),
            "measure": peak.measure,
        }
        message = (
            f"GPU {peak.device} peaks at {fmt_bytes(peak.peak_bytes)} {peak.measure}, "
            f"{fmt_percent(100 * share)} of its {fmt_bytes(peak.capacity_bytes)}: one larger batch "
            "or a fragmented allocator away from an out-of-memory error. No time saving is estimated."
        )
        snippet = (
            "with torch.autocast('cuda', dtype=torch.bfloat16):  # halves activation memory\n"
            "    loss = loss_fn(model(x), y)\n"
            "# recompute activations instead of storing them:\n"
            "out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)\n"
            "# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces fragmentation"
        )
        f = c.finding(
            "memory_ceiling",
            "Device memory near capacity",
            0.0,
            message,
            evidence=evidence,
            fix="Lower activation memory (autocast, activation checkpointing) or the batch size.",
            snippet=snippet,
        )
        f.severity = "high" if share > 0.95 else "medium"
        return f
    return None


_CONV_OP = re.compile(r"^aten::(cudnn_convolution\w*|convolution\w*|_convolution\w*|conv[123]d)$")


def cudnn_benchmark(c: Context) -> Finding | None:
    # A trace cannot tell whether cuDNN autotuned (it happens before the profiled
    # steps), so this rule needs the live flag and stays silent without it.
    if not c.has_gpu or c.live is None or c.live.cudnn_benchmark is not False:
        return None
    gpu, host = c.trace.gpu, c.trace.host
    host_par, rt_par = c.a.parents
    is_conv = host.name.mask(lambda n: _CONV_OP.match(n) is not None)
    under = is_conv | tree.any_ancestor(host_par, is_conv)
    kernels = (gpu.kind == KERNEL) & c.gpu_in_steps & (c.a.launch_runtime >= 0)
    op = np.full(len(gpu.ts), -1, np.int64)
    op[kernels] = rt_par[c.a.launch_runtime[kernels]]
    conv = kernels & (op >= 0)
    conv[conv] = under[op[conv]]
    dur = gpu.end - gpu.ts
    conv_us, kernel_us = (
        float(dur[conv].sum()),
        float(dur[(gpu.kind == KERNEL) & c.gpu_in_steps].sum()),
    )
    if kernel_us == 0 or conv_us < 0.10 * kernel_us:
        return None
    evidence: dict[str, float | int | str] = {
        "cudnn_benchmark": "False",
        "conv_us_per_step": round(c.per_step(conv_us), 1),
        "share_of_kernel_time_percent": round(100 * conv_us / kernel_us, 1),
    }
    message = (
        f"Convolutions take {fmt_percent(100 * conv_us / kernel_us)} of GPU time "
        f"({fmt_us(c.per_step(conv_us))} per step) and torch.backends.cudnn.benchmark is off, so cuDNN uses "
        "heuristic algorithms instead of the fastest measured one. The gain depends on the shapes; "
        "no saving is estimated."
    )
    return c.finding(
        "cudnn_benchmark",
        "cuDNN autotuning is off",
        0.0,
        message,
        evidence=evidence,
        fix="Enable cudnn.benchmark when input shapes are the same every step.",
        snippet="torch.backends.cudnn.benchmark = True  # before the first forward pass",
        confirmed=True,
        rows=EvidenceRows(gpu=np.flatnonzero(conv), gpu_weight=dur[conv], module=True),
    )
