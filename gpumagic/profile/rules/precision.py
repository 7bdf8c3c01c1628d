"""Rules about numeric precision: matmuls and convolutions off the tensor cores."""

from __future__ import annotations

import numpy as np

from gpumagic.profile.analysis import tree
from gpumagic.profile.analysis.precision import (
    LOW_PRECISION_TYPES,
    MATMUL_OP,
    autocast_matmuls,
    is_tensor_core_kernel,
)
from gpumagic.profile.analysis.where import EvidenceRows
from gpumagic.profile.rules.base import Context, Finding
from gpumagic.profile.trace.model import KERNEL
from gpumagic.units import fmt_percent, fmt_us


def tensor_cores(c: Context) -> Finding | None:
    if not c.has_gpu or c.rocm:
        return None
    gpu, host = c.trace.gpu, c.trace.host
    kernels = (gpu.kind == KERNEL) & c.gpu_in_steps
    if not kernels.any():
        return None
    dev = int(
        np.bincount(gpu.device[kernels] - gpu.device[kernels].min()).argmax()
        + gpu.device[kernels].min()
    )
    device = c.trace.device(dev)
    cc = device.compute_capability if device is not None else None
    if cc is None or cc < (7, 0):
        return None
    if c.live is not None and c.live.autocast_enabled:
        return None
    host_par, rt_par = c.a.parents
    is_mm = host.name.mask(lambda n: MATMUL_OP.match(n) is not None)
    under_mm = is_mm | tree.any_ancestor(host_par, is_mm)
    linked = kernels & (c.a.launch_runtime >= 0)
    op = np.full(len(gpu.ts), -1, np.int64)
    op[linked] = rt_par[c.a.launch_runtime[linked]]
    eligible = linked & (op >= 0)
    eligible[eligible] = under_mm[op[eligible]]
    if not eligible.any():
        return None
    dur = gpu.end - gpu.ts
    tc = gpu.name.mask(is_tensor_core_kernel)
    # kernels of matmuls that ran under autocast miss tensor cores for another reason
    # (shapes, an fp32 op list), which is not this rule's
    autocast = np.zeros(len(gpu.ts), bool)
    autocast[eligible] = autocast_matmuls(c.a)[op[eligible]]
    fp32_mm = eligible & ~tc & ~autocast
    mm_us, no_tc_us = float(dur[eligible].sum()), float(dur[fp32_mm].sum())
    kernel_us = float(dur[kernels].sum())
    if no_tc_us < 0.10 * kernel_us or no_tc_us < 0.5 * mm_us:
        return None
    # dtypes, when shapes were recorded: half/bf16 inputs mean AMP is already on and the
    # kernels miss tensor cores for another reason (shapes), which is not this rule
    top_mm = np.flatnonzero(is_mm & c.host_in_steps(host.ts) & ~tree.any_ancestor(host_par, is_mm))
    _dims, types = host.inputs(top_mm[:: max(len(top_mm) // 200, 1)])  # a sample says the dtype
    low = sum(any(t in s for t in LOW_PRECISION_TYPES) for s in types)
    fp32 = sum('"float"' in s or '"Float"' in s for s in types)
    if low > fp32:
        return None
    evidence: dict[str, float | int | str] = {
        "gpu": device.name if device is not None else "",
        "compute_capability": f"{cc[0]}.{cc[1]}",
        "matmul_conv_us_per_step": round(c.per_step(mm_us), 1),
        "without_tensor_cores_us_per_step": round(c.per_step(no_tc_us), 1),
        "share_of_kernel_time_percent": round(100 * no_tc_us / kernel_us, 1),
    }
    if types and any(types):
        evidence["fp32_inputs_in_sample"] = f"{fp32} of {len(types)} matmul/conv calls"
    if (eligible & autocast).any():
        evidence["under_autocast_us_per_step"] = round(
            c.per_step(float(dur[eligible & autocast].sum())), 1
        )
    confirmed = False
    tf32 = new_api = None
    if c.live is not None:
        for key in (
            "autocast_enabled",
            "matmul_fp32_precision",
            "conv_fp32_precision",
            "matmul_allow_tf32",
            "cudnn_allow_tf32",
            "float32_matmul_precision",
        ):
            value = getattr(c.live, key)
            if value is not None:
                evidence[key] = str(value)
        confirmed = c.live.autocast_enabled is False
        tf32, new_api = c.live.tf32_matmul, c.live.new_precision_api
    ampere = cc >= (8, 0)
    autocast_lines = (
        "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = loss_fn(model(x), y)"
    )
    if ampere and tf32:
        # the session already allows TF32 for matmuls: what is left is mixed precision
        snippet = "# TF32 is already allowed for matmuls in this session\n" + autocast_lines
        fix = "Train in bf16 with autocast: TF32 is allowed, yet these matmuls/convolutions run in fp32."
    elif ampere:
        # PyTorch refuses to mix its legacy TF32 flags with fp32_precision: advise the API in use
        tf32_lines = (
            "torch.backends.cuda.matmul.fp32_precision = 'tf32'  # TF32 tensor cores for fp32 matmuls\n"
            "torch.backends.cudnn.conv.fp32_precision = 'tf32'    # and convolutions\n"
            if new_api
            else "torch.set_float32_matmul_precision('high')  # TF32 tensor cores for fp32 matmuls\n"
            "torch.backends.cudnn.allow_tf32 = True        # and convolutions (the default)\n"
        )
        snippet = tf32_lines + "# or mixed precision, faster still:\n" + autocast_lines
        fix = "Allow TF32 or train in bf16 with autocast so matmuls and convolutions use tensor cores."
    else:
        snippet = (
            "scaler = torch.amp.GradScaler('cuda')\n"
            "with torch.autocast('cuda', dtype=torch.float16):\n"
            "    loss = loss_fn(model(x), y)\n"
            "scaler.scale(loss).backward()\n"
            "scaler.step(optimizer)\n"
            "scaler.update()"
        )
        fix = "Train with automatic mixed precision (fp16 autocast + GradScaler) so matmuls use tensor cores."
    # Assumption, stated in the message: fp32 -> tensor-core kernels at least halve
    # matmul/conv time (NVIDIA's peak ratio is 8x or more on every tensor-core GPU).
    saving = 0.5 * c.per_step(no_tc_us)
    message = (
        f"{fmt_us(c.per_step(no_tc_us))} per step ({fmt_percent(100 * no_tc_us / kernel_us)} of GPU time) is "
        f"fp32 matmul/convolution on kernels that do not use the tensor cores of this "
        f"compute-capability {cc[0]}.{cc[1]} GPU. Saving assumes tensor-core kernels at least halve that time."
    )
    return c.finding(
        "tensor_cores",
        "Tensor cores unused (fp32 matmul/conv)",
        saving,
        message,
        evidence=evidence,
        fix=fix,
        snippet=snippet,
        confirmed=confirmed,
        rows=EvidenceRows(gpu=np.flatnonzero(fp32_mm), gpu_weight=dur[fp32_mm], module=True),
    )
