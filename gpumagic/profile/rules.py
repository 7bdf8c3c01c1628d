"""The diagnosis: rules that read an analysis and say what to change, with evidence.

Each rule looks for one known cause of slow steps, quotes the numbers that show it,
estimates what fixing it would save per step (from measured time, never a guess about
hardware), and gives the fix as code. Rules take an optional :class:`LiveState` from the
running session to confirm a hint (the trace says ``_SingleProcessDataLoaderIter``; the
namespace says ``loader.num_workers == 0``) or to rule it out; without one they decide
from the trace alone. Rules about GPU behaviour stay silent on a trace without GPU
events.

Savings overlap (a DataLoader stall is also GPU idle time), so they are estimates for
ranking, not a sum to expect.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from gpumagic.profile import intervals, tree
from gpumagic.profile.analysis import Analysis, is_host_sync
from gpumagic.profile.breakdown import CATEGORIES
from gpumagic.profile.events import KERNEL, MEMCPY
from gpumagic.profile.live import LiveState
from gpumagic.profile.where import EvidenceRows, locate
from gpumagic.units import fmt_bytes, fmt_percent, fmt_us

SEVERITIES = ("high", "medium", "low")


@dataclass
class Finding:
    """One diagnosed problem."""

    rule: str
    title: str
    severity: str  # "high", "medium" or "low"
    saving_us: float  # estimated time saved per step by the fix
    message: str
    evidence: dict[str, float | int | str] = field(default_factory=dict)
    fix: str = ""
    snippet: str = ""
    confirmed: bool = False  # the live session confirmed what the trace suggested
    # where in the user's code the evidence comes from (a %%gpuprofile cell's trace): the
    # statement holding most of it, and for GPU evidence that sits in a model, the module
    line: int | None = None
    source: str = ""
    module: str = ""
    # the trace events behind the evidence, which locate the line and module
    rows: EvidenceRows | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, object]:
        return {
            "rule": self.rule,
            "title": self.title,
            "severity": self.severity,
            "saving_us": self.saving_us,
            "message": self.message,
            "evidence": dict(self.evidence),
            "fix": self.fix,
            "snippet": self.snippet,
            "confirmed": self.confirmed,
            "line": self.line,
            "source": self.source,
            "module": self.module,
        }


def _severity(saving_us: float, step_us: float) -> str:
    share = saving_us / step_us if step_us > 0 else 0.0
    if share >= 0.10:
        return "high"
    if share >= 0.02:
        return "medium"
    return "low"


class Context:
    """What the rules share: the analysis, the live state, per-step helpers."""

    def __init__(self, analysis: Analysis, live: LiveState | None) -> None:
        self.a = analysis
        self.trace = analysis.trace
        self.live = live
        self.steps = analysis.steps
        self.n_steps = max(len(self.steps), 1)
        self.step_us = analysis.breakdown.mean_step_us
        self.percent = dict(zip(CATEGORIES, analysis.breakdown.percent.tolist()))
        self.us = dict(zip(CATEGORIES, analysis.breakdown.mean_us.tolist()))
        self.has_gpu = analysis.trace.has_gpu
        self.rocm = any(v.startswith("hip") for v in analysis.trace.runtime.name.values)

    def host_in_steps(self, ts: np.ndarray) -> np.ndarray:
        st = self.steps
        if st.source == "trace":
            return np.ones(len(ts), bool)
        return (ts >= st.host_start[0]) & (ts <= st.host_end[-1])

    @cached_property
    def gpu_in_steps(self) -> np.ndarray:
        mask = np.zeros(len(self.trace.gpu.ts), bool)
        mask[self.a.idle_rows("steps")[0]] = True
        return mask

    def per_step(self, total: float) -> float:
        return total / self.n_steps

    def finding(self, rule: str, title: str, saving: float, message: str, **kw: object) -> Finding:
        return Finding(
            rule=rule,
            title=title,
            severity=_severity(saving, self.step_us),
            saving_us=float(max(saving, 0.0)),
            message=message,
            **kw,  # type: ignore[arg-type]
        )


# --- rules --------------------------------------------------------------------------------


def dataloader(c: Context) -> Finding | None:
    pct = c.percent["DataLoader"]
    if pct <= 5.0:
        return None
    names = [n for n in c.trace.host.name.values if n.startswith("enumerate(DataLoader)#")]
    single = any("_SingleProcessDataLoaderIter" in n for n in names)
    workers = c.live.num_workers if c.live is not None else None
    evidence: dict[str, float | int | str] = {
        "dataloader_percent": round(pct, 2),
        "dataloader_us_per_step": round(c.us["DataLoader"], 1),
    }
    if names:
        evidence["iterator"] = names[0].split("#", 1)[1].split(".")[0]
    if workers is not None:
        evidence["num_workers"] = workers
    if single or workers == 0:
        why = (
            "the loader runs in the training process (num_workers=0: _SingleProcessDataLoaderIter)"
        )
        fix = "Load batches in worker processes, and pin them for fast copies."
        snippet = (
            "loader = torch.utils.data.DataLoader(\n"
            "    dataset, batch_size=batch_size, shuffle=True,\n"
            "    num_workers=4,            # start near os.cpu_count() // 2, measure\n"
            "    pin_memory=True,          # page-locked batches copy asynchronously\n"
            "    persistent_workers=True,  # keep workers between epochs\n"
            ")"
        )
    else:
        why = "the worker processes do not keep up"
        fix = "Add workers or prefetch deeper; move heavy augmentation to the GPU."
        snippet = (
            "loader = torch.utils.data.DataLoader(\n"
            "    dataset, batch_size=batch_size,\n"
            "    num_workers=8, prefetch_factor=4,  # more workers, deeper queue\n"
            "    pin_memory=True, persistent_workers=True,\n"
            ")"
        )
    # the breakdown counts DataLoader time only where no kernel runs; on a CPU-only run
    # there is no GPU to speak of, only the training loop waiting for its batch
    idle = "nothing running on the GPU" if c.has_gpu else "the training loop waiting for its batch"
    message = (
        f"The DataLoader takes {fmt_percent(pct)} of each step ({fmt_us(c.us['DataLoader'])}) with "
        f"{idle}: {why}."
    )
    host = c.trace.host
    loads = np.flatnonzero(c.a.is_dataloader & c.host_in_steps(host.ts))
    return c.finding(
        "dataloader",
        "Data loading stalls the step",
        c.us["DataLoader"],
        message,
        evidence=evidence,
        fix=fix,
        snippet=snippet,
        confirmed=workers == 0,  # the session's loader is the single-process one the trace shows
        rows=EvidenceRows(host=loads, host_weight=(host.end - host.ts)[loads]),
    )


_PAGEABLE_HTOD = re.compile(r"^Memcpy HtoD \(Pageable -> Device\)")


def pageable_memcpy(c: Context) -> Finding | None:
    if not c.has_gpu:
        return None
    gpu = c.trace.gpu
    m = (
        (gpu.kind == MEMCPY)
        & gpu.name.mask(lambda n: _PAGEABLE_HTOD.match(n) is not None)
        & c.gpu_in_steps
    )
    if not m.any():
        return None
    copy_us = float((gpu.end - gpu.ts)[m].sum())
    nbytes = float(gpu.nbytes[m][gpu.nbytes[m] > 0].sum())
    rt = c.a.launch_runtime[m]
    rt = rt[rt >= 0]
    host_us = float((c.trace.runtime.end - c.trace.runtime.ts)[rt].sum())
    pinned = c.live.pin_memory if c.live is not None else None
    evidence: dict[str, float | int | str] = {
        "copies_per_step": round(c.per_step(int(m.sum())), 2),
        "bytes_per_step": round(c.per_step(nbytes)),
        "copy_us_per_step": round(c.per_step(copy_us), 1),
        "host_blocked_us_per_step": round(c.per_step(host_us), 1),
    }
    if pinned is not None:
        evidence["loader_pin_memory"] = str(pinned)
    source = (
        "the DataLoader pins memory, so these tensors come from elsewhere (created on the CPU each step?)"
        if pinned
        else "pageable (not pinned) memory must be staged by the driver, which blocks the CPU"
    )
    message = (
        f"{fmt_count_per_step(c.per_step(int(m.sum())))} host-to-device copies per step from pageable memory "
        f"({fmt_bytes(c.per_step(nbytes))}, {fmt_us(c.per_step(copy_us))} on the GPU, "
        f"{fmt_us(c.per_step(host_us))} of CPU time blocked in the copy calls): {source}."
    )
    snippet = (
        "loader = torch.utils.data.DataLoader(dataset, ..., pin_memory=True)\n"
        "for x, y in loader:\n"
        "    x = x.to('cuda', non_blocking=True)  # async copy from pinned memory\n"
        "    y = y.to('cuda', non_blocking=True)"
    )
    return c.finding(
        "pageable_memcpy",
        "Copies from pageable memory",
        c.per_step(copy_us),
        message,
        evidence=evidence,
        fix="Pin host memory (pin_memory=True) and copy with non_blocking=True so copies overlap compute.",
        snippet=snippet,
        confirmed=pinned is False,
        rows=EvidenceRows(gpu=np.flatnonzero(m), gpu_weight=(gpu.end - gpu.ts)[m]),
    )


def fmt_count_per_step(n: float) -> str:
    return f"{n:.0f}" if n >= 10 or float(n).is_integer() else f"{n:.1f}"


def sync(c: Context) -> Finding | None:
    if not c.has_gpu:
        return None
    rt = c.trace.runtime
    host_sync = rt.name.mask(is_host_sync) & c.host_in_steps(rt.ts)
    host = c.trace.host
    item = host.name.mask(lambda n: n == "aten::_local_scalar_dense") & c.host_in_steps(host.ts)
    syncs = c.trace.syncs
    lo, hi = c.steps.host_start[0], c.steps.host_end[-1]
    dev_sync = (
        (syncs.ts >= lo) & (syncs.ts <= hi)
        if c.steps.source != "trace"
        else np.ones(len(syncs.ts), bool)
    )
    n_sync = int(host_sync.sum())
    if n_sync == 0 and not item.any() and not dev_sync.any():
        return None
    # What a sync costs is the GPU bubble after it: the device drained its queue to let
    # the CPU continue, and stays idle until the CPU launches the next kernel.
    ends = np.sort(np.concatenate([rt.end[host_sync], host.end[item]]))
    gaps = c.a.device_gaps
    bubble = 0.0
    if len(ends) and len(gaps):
        # the first sync to return inside each gap that GPU work ended (a trailing gap
        # with nothing after it in the window is not the sync's doing)
        k = np.searchsorted(ends, gaps.start, side="left")
        t = ends[np.minimum(k, len(ends) - 1)]
        hit = gaps.closed & (k < len(ends)) & (t < gaps.end)
        t, g_end = t[hit], gaps.end[hit]
        loader = c.a.is_dataloader
        dl_s, dl_e = c.trace.host.ts[loader], c.trace.host.end[loader]
        in_loader = intervals.cumulative(dl_s, dl_e, g_end) - intervals.cumulative(dl_s, dl_e, t)
        bubble = float((g_end - t - in_loader).sum())
    names: dict[str, int] = {}
    for i in np.flatnonzero(host_sync).tolist():
        nm = rt.name.at(i)
        names[nm] = names.get(nm, 0) + 1
    evidence: dict[str, float | int | str] = {
        "host_syncs_per_step": round(c.per_step(n_sync), 2),
        "item_calls_per_step": round(c.per_step(int(item.sum())), 2),
        "device_sync_events_per_step": round(c.per_step(int(dev_sync.sum())), 2),
        "gpu_idle_after_syncs_us_per_step": round(c.per_step(bubble), 1),
    }
    if names:
        evidence["calls"] = ", ".join(
            f"{k} x{v}" for k, v in sorted(names.items(), key=lambda kv: -kv[1])
        )
    count = max(n_sync, int(item.sum()), int(dev_sync.sum()))
    # one .item() per step for logging is normal; flag syncs that are frequent or costly
    if c.per_step(count) < 5 and c.per_step(bubble) < 0.005 * c.step_us:
        return None
    message = (
        f"{fmt_count_per_step(c.per_step(count))} device synchronisations per step "
        f"(.item(), .cpu(), printing a tensor, explicit synchronize): each one drains the GPU queue, "
        f"leaving the GPU idle for {fmt_us(c.per_step(bubble))} per step while the CPU catches up."
    )
    snippet = (
        "running_loss += loss.detach()          # stays on the GPU, no sync\n"
        "if step % log_every == 0:\n"
        "    print(running_loss.item() / log_every)  # one sync per log_every steps\n"
        "    running_loss.zero_()\n"
        "\n"
        "torch.cuda.set_sync_debug_mode('warn')  # reports every hidden sync while debugging"
    )
    return c.finding(
        "sync",
        "Host-device synchronisations in the loop",
        c.per_step(bubble),
        message,
        evidence=evidence,
        fix="Keep metrics on the GPU and read them every N steps; remove .item()/.cpu()/print from the loop.",
        snippet=snippet,
        # the host time blocked in each synchronising call: where the line waits
        rows=EvidenceRows(
            host=np.flatnonzero(item),
            host_weight=(host.end - host.ts)[item],
            runtime=np.flatnonzero(host_sync),
            runtime_weight=(rt.end - rt.ts)[host_sync],
        ),
    )


# A GPU gap this short, with the CPU late to launch, is launch overhead; longer ones are
# CPU work (data loading, Python) that the other rules explain.
_LAUNCH_GAP_US = 1000.0


def launch_bound(c: Context) -> Finding | None:
    if not c.has_gpu:
        return None
    gpu, rt = c.trace.gpu, c.trace.runtime
    m = (gpu.kind == KERNEL) & c.gpu_in_steps & (c.a.launch_runtime >= 0)
    if m.sum() < 10:
        return None
    k_dur = (gpu.end - gpu.ts)[m]
    r = c.a.launch_runtime[m]
    l_dur = (rt.end - rt.ts)[r]
    is_short = k_dur < l_dur
    short = float(is_short.mean())
    gaps = c.a.device_gaps
    small = gaps.closed & (gaps.us <= _LAUNCH_GAP_US)
    small_waits = gaps.total_by_category(small)["host_wait"]
    wait_per_step = c.per_step(small_waits)
    if short <= 0.5 or wait_per_step < 0.05 * c.step_us:
        return None
    evidence: dict[str, float | int | str] = {
        "kernels_shorter_than_launch_percent": round(100 * short, 1),
        "median_kernel_us": round(float(np.median(k_dur)), 2),
        "median_launch_us": round(float(np.median(l_dur)), 2),
        "kernels_per_step": round(c.per_step(int(m.sum())), 1),
        "gpu_waiting_for_launches_us_per_step": round(wait_per_step, 1),
    }
    message = (
        f"{fmt_percent(100 * short)} of kernels finish faster than the CPU can launch them "
        f"(median kernel {fmt_us(float(np.median(k_dur)))}, median launch {fmt_us(float(np.median(l_dur)))}); "
        f"the GPU waits {fmt_us(wait_per_step)} per step for the next launch."
    )
    snippet = (
        "model = torch.compile(model, mode='reduce-overhead')  # fuses kernels, replays CUDA graphs\n"
        "# or capture a static step yourself: torch.cuda.graphs / torch.cuda.make_graphed_callables\n"
        "# or give each kernel more work: a larger batch size"
    )
    return c.finding(
        "launch_bound",
        "Launch-bound: kernels are shorter than their launches",
        wait_per_step,
        message,
        evidence=evidence,
        fix="Launch fewer, bigger kernels: torch.compile (fusion, CUDA graphs) or a larger batch.",
        snippet=snippet,
        rows=EvidenceRows(gpu=np.flatnonzero(m)[is_short]),  # the line launching most of them
    )


_MATMUL_OP = re.compile(
    r"^aten::(mm|bmm|addmm_?|addbmm|baddbmm|matmul|linear|addmv|mv|_convolution|convolution"
    r"|conv[123]d|conv_tbc|conv_transpose[123]d|cudnn_convolution\w*|convolution_backward\w*)$"
    r"|^(Mm|Bmm|Addmm|Addbmm|Baddbmm|Addmv|Mv|Convolution|CudnnConvolution\w*)Backward\d*$"
)
# Tensor-core GEMM/conv kernels name an MMA instruction shape (volta_h884gemm,
# ampere_fp16_s16816gemm, cutlass_80_tensorop_s1688gemm), a tensor-core input type
# (sm80_xmma_gemm_f32f32_tf32f32_..._tensor16x8x8, sm90_xmma_..._bf16bf16_..., e4m3/e5m2 FP8)
# or a tensor-core family (tensorop, hmma/imma/wmma, Hopper's nvjet_*). A bare "xmma" is
# only NVIDIA's template library: full-FP32 cuBLAS GEMMs on Ampere/Hopper run as
# sm80_xmma_gemm_f32f32_f32f32_f32_..._ffma_... (plain FMA on the CUDA cores), so "ffma",
# "simt" and "sgemm" are evidence against, and win (audit B2).
_TENSOR_CORE_EVIDENCE = re.compile(
    r"[hsci](884|1688|16816|8816)|hmma|imma|wmma|tensorop|tensor\d+x\d+|tf32|bf16|fp16|f16|e4m3|e5m2"
    r"|nvjet|_tc_",
    re.IGNORECASE,
)
_NO_TENSOR_CORE_EVIDENCE = re.compile(r"ffma|simt|sgemm", re.IGNORECASE)


def is_tensor_core_kernel(name: str) -> bool:
    """The kernel's name says it runs on tensor cores (and nothing in it says it does not)."""
    return (
        _TENSOR_CORE_EVIDENCE.search(name) is not None
        and _NO_TENSOR_CORE_EVIDENCE.search(name) is None
    )


_LOW_PRECISION_TYPES = ("c10::Half", "c10::BFloat16", "c10::Float8", "Half", "BFloat16")
_CAST_OP = re.compile(r"^aten::(to|_to_copy)$")
_AUTOCAST_NAME = re.compile(r"autocast", re.IGNORECASE)


def autocast_matmuls(a: Analysis) -> np.ndarray:
    """Host events that ran under autocast: forward matmul/conv ops autocast wrapped, and
    what nests in them or in an annotation or op named after autocast.

    Read from the trace, never from the cell's text (a comment, ``autocast('cpu')`` around
    CUDA work or ``enabled=False`` say nothing; audit M10). Autocast's wrapper shows as the
    op calling itself after casting its inputs: ``aten::linear`` > ``aten::to`` (x3) >
    ``aten::linear`` > ``aten::addmm``; without autocast a forward op never re-enters
    itself. With recorded shapes a cast to a 16-bit type directly inside the op says the
    same. Only the device type autocast was entered for is wrapped, so ``autocast('cpu')``
    leaves CUDA matmuls bare. Backward ops are never wrapped (their own casts, e.g. in
    ``aten::convolution_backward``, are not autocast's).
    """
    host = a.trace.host
    host_par, _ = a.parents
    is_mm = host.name.mask(
        lambda n: _MATMUL_OP.match(n) is not None and "backward" not in n.lower()
    )
    child = np.flatnonzero(host_par >= 0)
    parent = host_par[child]
    codes = host.name.codes
    under_mm = is_mm[parent]
    reenters = under_mm & (codes[child] == codes[parent])
    wrapped = np.zeros(len(host.ts), bool)
    wrapped[parent[reenters]] = True
    casts = child[under_mm & host.name.mask(lambda n: _CAST_OP.match(n) is not None)[child]]
    if len(casts):
        wrapped[host_par[casts[_casts_to_half(a, casts)]]] = True
    marks = wrapped | host.name.mask(lambda n: _AUTOCAST_NAME.search(n) is not None)
    return marks | tree.any_ancestor(host_par, marks)


def _casts_to_half(a: Analysis, casts: np.ndarray) -> np.ndarray:
    """Per cast op (``aten::to``/``_to_copy``), whether it wrote a 16-bit float type: the
    destination is the first input of the ``aten::copy_`` inside it (recorded shapes only)."""
    host = a.trace.host
    host_par, _ = a.parents
    copies = np.flatnonzero(host.name.mask(lambda n: n == "aten::copy_"))
    out = np.zeros(len(casts), bool)
    if not len(copies):
        return out
    # the cast that holds each copy_ (directly, or through aten::_to_copy)
    holder = host_par[copies]
    holder = np.where(
        (holder >= 0) & ~np.isin(holder, casts), host_par[np.maximum(holder, 0)], holder
    )
    inside = np.isin(holder, casts)
    copies, holder = copies[inside], holder[inside]
    if not len(copies):
        return out
    _dims, types = host.inputs(copies)
    half = np.array([any(t in s.split(",")[0] for t in _LOW_PRECISION_TYPES) for s in types], bool)
    out[np.isin(casts, holder[half])] = True
    return out


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
    is_mm = host.name.mask(lambda n: _MATMUL_OP.match(n) is not None)
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
    low = sum(any(t in s for t in _LOW_PRECISION_TYPES) for s in types)
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
        rows=_kernels_named(c, set(small["name"]), module=True),
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
        f"Gradients are zeroed in place, {fmt_count_per_step(c.per_step(n))} zero_ calls per step "
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


# --- multi-GPU (issue 11) -----------------------------------------------------------------

_COMMUNICATION_PERCENT = 10.0  # the TensorBoard plugin's threshold, on the exposed share


def communication(c: Context) -> Finding | None:
    """Communication takes more than 10% of the step (the TensorBoard plugin's rule, on the
    Communication category: collective time no kernel, copy or set covers). The saving is
    the communication no computation overlaps, per step."""
    pct, comm_us = c.percent["Communication"], c.us["Communication"]
    if pct <= _COMMUNICATION_PERCENT:
        return None
    comms = c.a.comms
    overlap = comms.overlap_percent
    split = comms.step_split(c.steps)
    exposed = float(split[:, 2].mean()) if len(split) else comm_us
    evidence: dict[str, float | int | str] = {
        "communication_percent": round(pct, 2),
        "communication_us_per_step": round(comm_us, 1),
        "not_overlapped_us_per_step": round(exposed, 1),
    }
    if overlap is not None:
        evidence["communication_overlap_percent"] = round(overlap, 2)
    frame = comms.collectives_frame(c.trace.rank or 0)
    if not frame.empty:
        top = frame.iloc[0]
        evidence["top_collective"] = f"{top['name']} ({top['backend']}, {int(top['calls'])} calls)"
        if np.isfinite(top["bytes_per_call"]):
            evidence["top_collective_call_bytes"] = round(float(top["bytes_per_call"]))
        if np.isfinite(top["busbw_gbps"]):
            evidence["top_collective_busbw_gbps"] = round(float(top["busbw_gbps"]), 2)
    ddp = c.live.ddp if c.live is not None else ()
    for d in ddp[:1]:
        for key in ("bucket_cap_mb", "gradient_as_bucket_view", "find_unused_parameters"):
            value = getattr(d, key)
            if value is not None:
                evidence[f"ddp_{key}"] = str(round(value, 1) if isinstance(value, float) else value)
    hidden = f"; {fmt_percent(overlap)} of it overlaps computation" if overlap is not None else ""
    where = comms.cpu_backend and not comms.kernels.any()
    message = (
        f"Collectives take {fmt_percent(pct)} of each step ({fmt_us(comm_us)}){hidden}, and "
        f"{fmt_us(exposed)} per step runs with no computation beside it: the ranks wait for "
        "data to move instead of computing"
        + (" (the collectives run on the CPU, through gloo)" if where else "")
        + ". Saving is that non-overlapped time."
    )
    unused = any(d.find_unused_parameters for d in ddp)
    fix = (
        "Overlap communication with backward: DDP all-reduces in buckets as gradients become "
        "ready, so tune bucket_cap_mb, use gradient_as_bucket_view=True, and leave "
        "find_unused_parameters off unless the model needs it"
        + (" (it is on here: it walks the graph every step)" if unused else "")
        + "; all-reduce less often with gradient accumulation under no_sync(); "
        "send fewer bytes with a compression hook (bf16/fp16, PowerSGD)"
        + ("; on GPUs use the NCCL backend." if where else ".")
    )
    snippet = (
        "model = DDP(model, device_ids=[local_rank],\n"
        "            bucket_cap_mb=50,                # fewer, larger all-reduces (default 25)\n"
        "            gradient_as_bucket_view=True,    # no copy into the buckets\n"
        "            find_unused_parameters=False)    # True only if some parameters get no grad\n"
        "\n"
        "# accumulate k micro-batches, all-reduce once\n"
        "with model.no_sync():\n"
        "    for x, y in micro_batches[:-1]:\n"
        "        loss_fn(model(x), y).backward()\n"
        "loss_fn(model(micro_batches[-1][0]), micro_batches[-1][1]).backward()\n"
        "\n"
        "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
        "model.register_comm_hook(None, default_hooks.bf16_compress_hook)  # half the bytes"
    )
    return c.finding(
        "communication",
        "Communication not hidden behind compute",
        exposed,
        message,
        evidence=evidence,
        fix=fix,
        snippet=snippet,
        confirmed=unused,
        rows=_communication_rows(c, comms.kernels, comms.host),
    )


def _communication_rows(c: Context, gpu_mask: np.ndarray, host_mask: np.ndarray) -> EvidenceRows:
    """Collective kernels and host spans inside the steps, weighted by duration: the line
    whose range launched most of them (``loss.backward()`` for DDP's bucketed all-reduce)."""
    gpu, host = c.trace.gpu, c.trace.host
    g = np.flatnonzero(gpu_mask & c.gpu_in_steps)
    h = np.flatnonzero(host_mask & c.host_in_steps(host.ts))
    return EvidenceRows(
        host=h, host_weight=(host.end - host.ts)[h], gpu=g, gpu_weight=(gpu.end - gpu.ts)[g]
    )


def dataparallel(c: Context) -> Finding | None:
    """``nn.DataParallel``: one process drives every GPU; DDP is the supported way."""
    host = c.trace.host
    spans = host.name.mask(lambda n: n == "DataParallel.forward") & c.host_in_steps(host.ts)
    live = c.live.data_parallel if c.live is not None else ()
    if not spans.any() and not live:
        return None
    evidence: dict[str, float | int | str] = {
        "data_parallel_forward_calls_per_step": round(c.per_step(int(spans.sum())), 2)
    }
    if live:
        evidence["wrapped_in_namespace"] = ", ".join(live)
    dp_us = float((c.trace.host.end - c.trace.host.ts)[spans].sum())
    if spans.any():
        evidence["data_parallel_forward_us_per_step"] = round(c.per_step(dp_us), 1)
    message = (
        "The model runs under nn.DataParallel: one Python process scatters every batch, "
        "replicates the model to each GPU in every forward pass, and gathers the outputs on "
        "the first GPU, so the GIL and GPU 0 limit the speed. DistributedDataParallel runs one "
        "process per GPU and overlaps the gradient all-reduce with backward. No time saving is "
        "estimated."
    )
    snippet = (
        "# train.py, launched with: torchrun --nproc_per_node=NUM_GPUS train.py\n"
        "import os, torch, torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "dist.init_process_group('nccl')\n"
        "local_rank = int(os.environ['LOCAL_RANK'])\n"
        "torch.cuda.set_device(local_rank)\n"
        "model = DDP(model.to(local_rank), device_ids=[local_rank])\n"
        "sampler = torch.utils.data.DistributedSampler(dataset)  # each rank its own slice"
    )
    f = c.finding(
        "dataparallel",
        "nn.DataParallel instead of DistributedDataParallel",
        0.0,
        message,
        evidence=evidence,
        fix="Use DistributedDataParallel, one process per GPU (torchrun), instead of nn.DataParallel.",
        snippet=snippet,
        confirmed=bool(live),
        rows=EvidenceRows(host=np.flatnonzero(spans)),  # the line calling the wrapped model
    )
    f.severity = "medium"
    return f


def gloo_on_gpu(c: Context) -> Finding | None:
    """Collectives on CUDA tensors through gloo: staged through host memory, on the CPU."""
    comms = c.a.comms
    if not c.has_gpu or not comms.cpu_backend:
        return None
    gpu = c.trace.gpu
    copies = comms.copies_in_collectives & c.gpu_in_steps
    backend = c.live.distributed_backend if c.live is not None else None
    live_gloo = backend is not None and "gloo" in backend and "nccl" not in backend
    if not copies.any() and not (live_gloo and c.trace.backend == "gloo"):
        return None
    copy_us = float((gpu.end - gpu.ts)[copies].sum())
    nbytes = float(gpu.nbytes[copies][gpu.nbytes[copies] > 0].sum())
    host_comm = comms.host & c.host_in_steps(c.trace.host.ts)
    evidence: dict[str, float | int | str] = {
        "copies_in_collectives_per_step": round(c.per_step(int(copies.sum())), 2),
        "copy_bytes_per_step": round(c.per_step(nbytes)),
        "copy_us_per_step": round(c.per_step(copy_us), 1),
        "collective_host_spans_per_step": round(c.per_step(int(host_comm.sum())), 2),
    }
    if backend is not None:
        evidence["process_group_backend"] = backend
    message = (
        "Collectives run through gloo on a GPU job: gloo copies each CUDA tensor to host memory, "
        "reduces it on the CPU and copies it back "
        f"({fmt_count_per_step(c.per_step(int(copies.sum())))} copies per step, "
        f"{fmt_bytes(c.per_step(nbytes))}, {fmt_us(c.per_step(copy_us))} on the GPU). NCCL "
        "moves the data GPU to GPU. Saving counts only those copies; NCCL's faster transfer "
        "comes on top."
    )
    snippet = (
        "dist.init_process_group('nccl')  # GPU tensors; or both: backend='cpu:gloo,cuda:nccl'\n"
        "torch.cuda.set_device(local_rank)"
    )
    f = c.finding(
        "gloo_on_gpu",
        "gloo collectives on CUDA tensors",
        c.per_step(copy_us),
        message,
        evidence=evidence,
        fix="Use the NCCL backend for collectives on CUDA tensors.",
        snippet=snippet,
        confirmed=live_gloo,
        rows=_communication_rows(c, copies, comms.host),
    )
    if f.severity == "low":
        f.severity = "medium"  # the copies are the least of it: the CPU does the reduction
    return f


RULES: dict[str, Callable[[Context], Finding | None]] = {
    "dataloader": dataloader,
    "pageable_memcpy": pageable_memcpy,
    "sync": sync,
    "launch_bound": launch_bound,
    "tensor_cores": tensor_cores,
    "low_utilization": low_utilization,
    "small_grid": small_grid,
    "memory_ceiling": memory_ceiling,
    "optimizer": optimizer,
    "zero_grad": zero_grad,
    "cudnn_benchmark": cudnn_benchmark,
    "communication": communication,
    "dataparallel": dataparallel,
    "gloo_on_gpu": gloo_on_gpu,
}


def _kernels_named(c: Context, names: set[str], module: bool = False) -> EvidenceRows:
    gpu = c.trace.gpu
    m = (gpu.kind == KERNEL) & c.gpu_in_steps & gpu.name.mask(lambda n: n in names)
    return EvidenceRows(gpu=np.flatnonzero(m), gpu_weight=(gpu.end - gpu.ts)[m], module=module)


def point_at_code(findings: list[Finding], analysis: Analysis) -> None:
    """Give each finding the line (and module) its evidence comes from, where the trace
    has the cell's statement ranges (see :mod:`gpumagic.profile.where`)."""
    if not len(analysis.trace.code.statements) and not len(analysis.trace.code.modules):
        return
    for f in findings:
        if f.rows is None:
            continue
        place = locate(analysis, f.rows)
        f.line, f.source, f.module = place.line, place.source, place.module


def diagnose(analysis: Analysis, live: LiveState | None = None) -> list[Finding]:
    """Run every rule; findings ranked by estimated saving (then severity)."""
    if len(analysis.steps) == 0:
        return []
    ctx = Context(analysis, live)
    found = [f for rule in RULES.values() if (f := rule(ctx)) is not None]
    low = next((f for f in found if f.rule == "low_utilization"), None)
    if low is not None:
        explained = sum(f.saving_us for f in found if f is not low)
        low.saving_us = max(low.saving_us - explained, 0.0)
        low.evidence["unexplained_idle_us_per_step"] = round(low.saving_us, 1)
        low.severity = _severity(low.saving_us, ctx.step_us)
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    found.sort(key=lambda f: (-f.saving_us, rank.get(f.severity, 3), f.rule))
    point_at_code(found, analysis)
    return found


def findings_json(findings: list[Finding]) -> str:
    return json.dumps([f.as_dict() for f in findings], indent=2)
