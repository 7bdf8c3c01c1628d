"""Rules about kernels and device memory: low utilisation, small grids, memory near
capacity, cuDNN autotuning."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gpumagic.profile.analysis import tree
from gpumagic.profile.analysis.where import EvidenceRows
from gpumagic.profile.rules.base import Advice, Context, Evidence, Facts, kernels_named
from gpumagic.profile.trace.model import KERNEL
from gpumagic.units import fmt_bytes, fmt_percent, fmt_us

# --- low_utilization -------------------------------------------------------------------


@dataclass(frozen=True, eq=False, kw_only=True)
class LowUtilization(Evidence):
    """Compute kernels run less than half of the step. The saving is the idle time; diagnose()
    replaces it with what the other findings leave unexplained."""

    utilization_percent: float
    idle_us: float  # per step
    idle_by_category: tuple[tuple[str, float], ...]  # (idle category, µs per step)
    communicates: bool  # communication kernels run too (utilisation counts compute only)

    def quoted(self) -> dict[str, float | int | str]:
        out: dict[str, float | int | str] = {
            "gpu_utilization_percent": round(self.utilization_percent, 1),
            "gpu_idle_us_per_step": round(self.idle_us, 1),
        }
        for cat, us in self.idle_by_category:
            out[f"idle_{cat}_us_per_step"] = round(us, 1)
        return out


def detect_low_utilization(c: Context) -> LowUtilization | None:
    util = c.a.gpu_utilization_percent
    if util is None or util >= 50.0:
        return None
    idle_us = c.step_us * (100.0 - util) / 100.0
    cats = c.a.device_gaps.total_by_category()
    return LowUtilization(
        saving_us=idle_us,
        utilization_percent=util,
        idle_us=idle_us,
        idle_by_category=tuple((cat, c.per_step(us)) for cat, us in cats.items()),
        communicates=bool(c.a.comms.kernels.any()),
    )


def advise_low_utilization(e: LowUtilization, facts: Facts) -> Advice:
    message = (
        f"Kernels run only {fmt_percent(e.utilization_percent)} of the step; the GPU is idle "
        f"{fmt_us(e.idle_us)} per step. "
        "The other findings name causes; what they do not explain is shown as the saving."
    )
    if e.communicates:  # utilisation counts compute kernels only (issue 11)
        message = (
            f"Compute kernels run only {fmt_percent(e.utilization_percent)} of the step; for "
            f"{fmt_us(e.idle_us)} per step the GPU computes nothing (it is idle, or only "
            "communicating). The other findings name causes; what they do not explain is "
            "shown as the saving."
        )
    snippet = (
        "# give the GPU more work per launch and per step\n"
        "loader = torch.utils.data.DataLoader(dataset, batch_size=2 * batch_size, ...)\n"
        "model = torch.compile(model)"
    )
    return Advice(
        "GPU busy less than half of the step",
        message,
        "Fix the causes the other findings name first (their savings come out of this idle "
        "time); what is left needs more work per launch: a larger batch, or torch.compile.",
        snippet,
    )


# --- small_grid ------------------------------------------------------------------------

_COLLECTIVE = r"^(?:void )?(?:nccl|rccl|ncclDevKernel|ncclKernel)"


@dataclass(frozen=True, eq=False, kw_only=True)
class SmallGrids(Evidence):
    """Among the most expensive kernels, those launching fewer blocks than the GPU has SMs."""

    kernels: int  # how many of the ranked ones
    ranked: int  # how many were looked at
    share_percent: float  # their share of kernel time
    worst_kernel: str  # the most expensive of them
    worst_blocks_per_sm: float

    def quoted(self) -> dict[str, float | int | str]:
        return {
            "kernels": self.kernels,
            "kernels_ranked": self.ranked,
            "share_of_kernel_time_percent": round(self.share_percent, 1),
            "worst_kernel": self.worst_kernel[:120],
            "worst_blocks_per_sm": round(self.worst_blocks_per_sm, 3),
        }


def detect_small_grid(c: Context, top: int = 10) -> SmallGrids | None:
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
    worst = small.iloc[0]
    return SmallGrids(
        # Upper bound: a kernel filling a fraction f of the SMs would take f of its time if
        # its blocks were spread over all of them.
        saving_us=c.per_step(float((small["total_us"] * (1.0 - small["blocks_per_sm"])).sum())),
        rows=kernels_named(c, set(small["name"]), module=True),
        kernels=len(small),
        ranked=len(head),
        share_percent=100 * share,
        worst_kernel=str(worst["name"]),
        worst_blocks_per_sm=float(worst["blocks_per_sm"]),
    )


def advise_small_grid(e: SmallGrids, facts: Facts) -> Advice:
    message = (
        f"{e.kernels} of the {e.ranked} most expensive kernels ({fmt_percent(e.share_percent)} of GPU "
        f"time) launch fewer blocks than the GPU has SMs (blocks per SM < 1), leaving SMs idle "
        "while they run. Saving is an upper bound (those kernels spread over every SM)."
    )
    snippet = (
        "# more parallel work per kernel: a larger batch, or fuse small ops\n"
        "model = torch.compile(model)\n"
        "# for a custom kernel, launch at least as many blocks as SMs:\n"
        "# torch.cuda.get_device_properties(0).multi_processor_count"
    )
    return Advice(
        "Kernels too small to fill the GPU",
        message,
        "Give kernels more parallel work (larger batch, fusion); launch grids of at least one block per SM.",
        snippet,
    )


# --- memory_ceiling --------------------------------------------------------------------


@dataclass(frozen=True, eq=False, kw_only=True)
class MemoryCeiling(Evidence):
    """A GPU whose memory peaked above 90% of its capacity."""

    device: int
    peak_bytes: float
    capacity_bytes: int
    measure: str  # what the peak counts: "reserved", "allocated", ...

    @property
    def share(self) -> float:
        return self.peak_bytes / self.capacity_bytes

    def quoted(self) -> dict[str, float | int | str]:
        return {
            "device": self.device,
            "peak_bytes": int(self.peak_bytes),
            "capacity_bytes": self.capacity_bytes,
            "peak_percent": round(100 * self.share, 1),
            "measure": self.measure,
        }

    def severity(self, step_us: float) -> str:
        # no time is saved: how close the peak is to capacity is the harm
        return "high" if self.share > 0.95 else "medium"


def detect_memory_ceiling(c: Context) -> MemoryCeiling | None:
    for peak in c.a.memory_peaks:
        if peak.capacity_bytes is None or peak.peak_bytes / peak.capacity_bytes <= 0.90:
            continue
        return MemoryCeiling(
            saving_us=0.0,
            device=peak.device,
            peak_bytes=peak.peak_bytes,
            capacity_bytes=peak.capacity_bytes,
            measure=peak.measure,
        )
    return None


def advise_memory_ceiling(e: MemoryCeiling, facts: Facts) -> Advice:
    message = (
        f"GPU {e.device} peaks at {fmt_bytes(e.peak_bytes)} {e.measure}, "
        f"{fmt_percent(100 * e.share)} of its {fmt_bytes(e.capacity_bytes)}: one larger batch "
        "or a fragmented allocator away from an out-of-memory error. No time saving is estimated."
    )
    # bf16 needs Ampere's tensor cores; older GPUs halve memory with fp16 (and a GradScaler)
    dtype = "bfloat16" if facts.bf16 else "float16"
    snippet = (
        f"with torch.autocast('cuda', dtype=torch.{dtype}):  # halves activation memory\n"
        "    loss = loss_fn(model(x), y)\n"
        "# recompute activations instead of storing them:\n"
        "out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)\n"
        "# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces fragmentation"
    )
    return Advice(
        "Device memory near capacity",
        message,
        "Lower activation memory (autocast, activation checkpointing) or the batch size.",
        snippet,
    )


# --- cudnn_benchmark -------------------------------------------------------------------

_CONV_OP = re.compile(r"^aten::(cudnn_convolution\w*|convolution\w*|_convolution\w*|conv[123]d)$")


@dataclass(frozen=True, eq=False, kw_only=True)
class CudnnAutotuneOff(Evidence):
    """Convolutions take a tenth of GPU time or more while the session has
    ``torch.backends.cudnn.benchmark`` off."""

    conv_us: float  # per step
    share_percent: float  # of kernel time

    def quoted(self) -> dict[str, float | int | str]:
        return {
            "cudnn_benchmark": "False",
            "conv_us_per_step": round(self.conv_us, 1),
            "share_of_kernel_time_percent": round(self.share_percent, 1),
        }


def detect_cudnn_benchmark(c: Context) -> CudnnAutotuneOff | None:
    # A trace cannot tell whether cuDNN autotuned (it happens before the profiled
    # steps), so this rule needs the live flag and stays silent without it.
    if not c.has_gpu or c.live is None or c.live.cudnn_benchmark is not False:
        return None
    gpu, host = c.trace.gpu, c.trace.host
    is_conv = host.name.mask(lambda n: _CONV_OP.match(n) is not None)
    conv = c.kernels_from(is_conv | tree.any_ancestor(c.a.parents[0], is_conv))
    dur = gpu.end - gpu.ts
    conv_us, kernel_us = (
        float(dur[conv].sum()),
        float(dur[(gpu.kind == KERNEL) & c.gpu_in_steps].sum()),
    )
    if kernel_us == 0 or conv_us < 0.10 * kernel_us:
        return None
    return CudnnAutotuneOff(
        saving_us=0.0,
        rows=EvidenceRows(gpu=np.flatnonzero(conv), gpu_weight=dur[conv], module=True),
        confirmed=True,
        conv_us=c.per_step(conv_us),
        share_percent=100 * conv_us / kernel_us,
    )


def advise_cudnn_benchmark(e: CudnnAutotuneOff, facts: Facts) -> Advice:
    message = (
        f"Convolutions take {fmt_percent(e.share_percent)} of GPU time "
        f"({fmt_us(e.conv_us)} per step) and torch.backends.cudnn.benchmark is off, so cuDNN uses "
        "heuristic algorithms instead of the fastest measured one. The gain depends on the shapes; "
        "no saving is estimated."
    )
    return Advice(
        "cuDNN autotuning is off",
        message,
        "Enable cudnn.benchmark when input shapes are the same every step.",
        "torch.backends.cudnn.benchmark = True  # before the first forward pass",
    )
