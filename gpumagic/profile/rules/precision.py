"""Rules about numeric precision: matmuls and convolutions off the tensor cores."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpumagic.profile.analysis import tree
from gpumagic.profile.analysis.precision import (
    LOW_PRECISION_TYPES,
    MATMUL_OP,
    autocast_matmuls,
    is_tensor_core_kernel,
)
from gpumagic.profile.analysis.where import EvidenceRows
from gpumagic.profile.rules.base import Advice, Context, Evidence, Facts
from gpumagic.profile.trace.model import KERNEL
from gpumagic.profile.trace.session import LiveState
from gpumagic.units import fmt_percent, fmt_us

# the session settings a tensor_cores finding quotes, as the live state holds them
_LIVE_SETTINGS = (
    "autocast_enabled",
    "matmul_fp32_precision",
    "conv_fp32_precision",
    "matmul_allow_tf32",
    "cudnn_allow_tf32",
    "float32_matmul_precision",
)


@dataclass(frozen=True, eq=False, kw_only=True)
class Fp32Matmuls(Evidence):
    """Matmul/convolution kernels of a tensor-core GPU that run in fp32 on the CUDA cores."""

    gpu: str  # the device's name, as the trace gives it
    compute_capability: tuple[int, int]
    matmul_us: float  # per step, every matmul/conv kernel
    fp32_us: float  # per step, those without tensor cores and not under autocast
    share_percent: float  # fp32_us in all kernel time
    sampled: int  # matmul/conv calls whose input types were read (0: shapes not recorded)
    fp32_inputs: int  # of those, calls with fp32 inputs
    autocast_us: float | None  # per step, matmul/conv kernels under autocast (None: none)
    settings: tuple[tuple[str, str], ...]  # the session's precision settings it reported

    def quoted(self) -> dict[str, float | int | str]:
        cc = self.compute_capability
        out: dict[str, float | int | str] = {
            "gpu": self.gpu,
            "compute_capability": f"{cc[0]}.{cc[1]}",
            "matmul_conv_us_per_step": round(self.matmul_us, 1),
            "without_tensor_cores_us_per_step": round(self.fp32_us, 1),
            "share_of_kernel_time_percent": round(self.share_percent, 1),
        }
        if self.sampled:
            out["fp32_inputs_in_sample"] = f"{self.fp32_inputs} of {self.sampled} matmul/conv calls"
        if self.autocast_us is not None:
            out["under_autocast_us_per_step"] = round(self.autocast_us, 1)
        out.update(self.settings)
        return out


def detect_tensor_cores(c: Context) -> Fp32Matmuls | None:
    if not c.has_gpu or c.rocm:
        return None
    gpu, host = c.trace.gpu, c.trace.host
    kernels = (gpu.kind == KERNEL) & c.gpu_in_steps
    if not kernels.any():
        return None
    device = c.trace.device(_busiest(gpu.device[kernels]))
    cc = device.compute_capability if device is not None else None
    if device is None or cc is None or cc < (7, 0):
        return None
    if c.live is not None and c.live.autocast_enabled:
        return None
    is_mm = host.name.mask(lambda n: MATMUL_OP.match(n) is not None)
    inside_mm = tree.any_ancestor(c.a.parents[0], is_mm)
    eligible = c.kernels_from(is_mm | inside_mm)
    if not eligible.any():
        return None
    dur = gpu.end - gpu.ts
    tc = gpu.name.mask(is_tensor_core_kernel)
    # kernels of matmuls that ran under autocast miss tensor cores for another reason
    # (shapes, an fp32 op list), which is not this rule's
    autocast = np.zeros(len(gpu.ts), bool)
    autocast[eligible] = autocast_matmuls(c.a)[c.a.launch_op[eligible]]
    fp32_mm = eligible & ~tc & ~autocast
    mm_us, no_tc_us = float(dur[eligible].sum()), float(dur[fp32_mm].sum())
    kernel_us = float(dur[kernels].sum())
    if no_tc_us < 0.10 * kernel_us or no_tc_us < 0.5 * mm_us:
        return None
    # dtypes, when shapes were recorded: half/bf16 inputs mean AMP is already on and the
    # kernels miss tensor cores for another reason (shapes), which is not this rule
    top_mm = np.flatnonzero(is_mm & c.host_in_steps(host.ts) & ~inside_mm)
    _dims, types = host.inputs(top_mm[:: max(len(top_mm) // 200, 1)])  # a sample says the dtype
    low = sum(any(t in s for t in LOW_PRECISION_TYPES) for s in types)
    fp32 = sum('"float"' in s or '"Float"' in s for s in types)
    if low > fp32:
        return None
    live = c.live
    under_autocast = eligible & autocast
    return Fp32Matmuls(
        # Assumption, stated in the message: fp32 -> tensor-core kernels at least halve
        # matmul/conv time (NVIDIA's peak ratio is 8x or more on every tensor-core GPU).
        saving_us=0.5 * c.per_step(no_tc_us),
        rows=EvidenceRows(gpu=np.flatnonzero(fp32_mm), gpu_weight=dur[fp32_mm], module=True),
        confirmed=live is not None and live.autocast_enabled is False,
        gpu=device.name,
        compute_capability=cc,
        matmul_us=c.per_step(mm_us),
        fp32_us=c.per_step(no_tc_us),
        share_percent=100 * no_tc_us / kernel_us,
        sampled=len(types) if types and any(types) else 0,
        fp32_inputs=fp32,
        autocast_us=(
            c.per_step(float(dur[under_autocast].sum())) if under_autocast.any() else None
        ),
        settings=_settings(live),
    )


def _settings(live: LiveState | None) -> tuple[tuple[str, str], ...]:
    if live is None:
        return ()
    return tuple((k, str(v)) for k in _LIVE_SETTINGS if (v := getattr(live, k)) is not None)


def _busiest(devices: np.ndarray) -> int:
    """The device most of ``devices`` (one per kernel) name."""
    return int(np.bincount(devices - devices.min()).argmax() + devices.min())


_AUTOCAST_LINES = (
    "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = loss_fn(model(x), y)"
)


def advise_tensor_cores(e: Fp32Matmuls, facts: Facts) -> Advice:
    live = facts.live
    tf32 = live.tf32_matmul if live is not None else None
    new_api = live.new_precision_api if live is not None else None
    ampere = e.compute_capability >= (8, 0)
    if ampere and tf32:
        # the session already allows TF32 for matmuls: what is left is mixed precision
        snippet = "# TF32 is already allowed for matmuls in this session\n" + _AUTOCAST_LINES
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
        snippet = tf32_lines + "# or mixed precision, faster still:\n" + _AUTOCAST_LINES
        fix = "Allow TF32 or train in bf16 with autocast so matmuls and convolutions use tensor cores."
    else:
        snippet = (
            f"scaler = {facts.grad_scaler()}\n"
            "with torch.autocast('cuda', dtype=torch.float16):\n"
            "    loss = loss_fn(model(x), y)\n"
            "scaler.scale(loss).backward()\n"
            "scaler.step(optimizer)\n"
            "scaler.update()"
        )
        fix = "Train with automatic mixed precision (fp16 autocast + GradScaler) so matmuls use tensor cores."
    cc = e.compute_capability
    message = (
        f"{fmt_us(e.fp32_us)} per step ({fmt_percent(e.share_percent)} of GPU time) is "
        f"fp32 matmul/convolution on kernels that do not use the tensor cores of this "
        f"compute-capability {cc[0]}.{cc[1]} GPU. Saving assumes tensor-core kernels at least halve that time."
    )
    return Advice("Tensor cores unused (fp32 matmul/conv)", message, fix, snippet)
