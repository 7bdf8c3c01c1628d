"""Rules about the host holding the GPU back: synchronisations, launch-bound steps."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpumagic.profile.analysis import intervals
from gpumagic.profile.analysis.trace_analysis import is_host_sync
from gpumagic.profile.analysis.where import EvidenceRows
from gpumagic.profile.rules.base import Advice, Context, Evidence, Facts
from gpumagic.profile.trace.model import KERNEL
from gpumagic.units import fmt_mean_count, fmt_percent, fmt_us

# --- sync ------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, kw_only=True)
class HostSyncs(Evidence):
    """Synchronising calls inside the steps and the GPU idle time after them, per step."""

    host_syncs: float  # runtime calls that block the CPU (cudaStreamSynchronize, ...)
    item_calls: float  # aten::_local_scalar_dense (.item(), .cpu() of a scalar, printing)
    device_syncs: float  # synchronisation events the trace records on the device
    count: float  # the largest of the three
    gpu_idle_us: float
    calls: tuple[tuple[str, int], ...]  # (runtime call, how many), most first

    def quoted(self) -> dict[str, float | int | str]:
        out: dict[str, float | int | str] = {
            "synchronisations_per_step": round(self.count, 2),
            "host_syncs_per_step": round(self.host_syncs, 2),
            "item_calls_per_step": round(self.item_calls, 2),
            "device_sync_events_per_step": round(self.device_syncs, 2),
            "gpu_idle_after_syncs_us_per_step": round(self.gpu_idle_us, 1),
        }
        if self.calls:
            out["calls"] = ", ".join(f"{k} x{v}" for k, v in self.calls)
        return out


def detect_sync(c: Context) -> HostSyncs | None:
    if not c.has_gpu:
        return None
    rt, host, syncs = c.trace.runtime, c.trace.host, c.trace.syncs
    host_sync = rt.name.mask(is_host_sync) & c.host_in_steps(rt.ts)
    item = host.name.mask(lambda n: n == "aten::_local_scalar_dense") & c.host_in_steps(host.ts)
    dev_sync = c.host_in_steps(syncs.ts)
    n_sync = int(host_sync.sum())
    if n_sync == 0 and not item.any() and not dev_sync.any():
        return None
    bubble = _gpu_idle_after(c, np.sort(np.concatenate([rt.end[host_sync], host.end[item]])))
    count = max(n_sync, int(item.sum()), int(dev_sync.sum()))
    # one .item() per step for logging is normal; flag syncs that are frequent or costly
    if c.per_step(count) < 5 and c.per_step(bubble) < 0.005 * c.step_us:
        return None
    names: dict[str, int] = {}
    for i in np.flatnonzero(host_sync).tolist():
        nm = rt.name.at(i)
        names[nm] = names.get(nm, 0) + 1
    return HostSyncs(
        saving_us=c.per_step(bubble),
        # the host time blocked in each synchronising call: where the line waits
        rows=EvidenceRows(
            host=np.flatnonzero(item),
            host_weight=(host.end - host.ts)[item],
            runtime=np.flatnonzero(host_sync),
            runtime_weight=(rt.end - rt.ts)[host_sync],
        ),
        host_syncs=c.per_step(n_sync),
        item_calls=c.per_step(int(item.sum())),
        device_syncs=c.per_step(int(dev_sync.sum())),
        count=c.per_step(count),
        gpu_idle_us=c.per_step(bubble),
        calls=tuple(sorted(names.items(), key=lambda kv: -kv[1])),
    )


def _gpu_idle_after(c: Context, ends: np.ndarray) -> float:
    """GPU idle time from each sync's return (``ends``, sorted) to the next GPU work.

    What a sync costs is the GPU bubble after it: the device drained its queue to let the
    CPU continue, and stays idle until the CPU launches the next kernel. Time in the
    DataLoader during that bubble is the loader's, not the sync's.
    """
    gaps = c.a.device_gaps
    if not len(ends) or not len(gaps):
        return 0.0
    # the first sync to return inside each gap that GPU work ended (a trailing gap
    # with nothing after it in the window is not the sync's doing)
    k = np.searchsorted(ends, gaps.start, side="left")
    t = ends[np.minimum(k, len(ends) - 1)]
    hit = gaps.closed & (k < len(ends)) & (t < gaps.end)
    t, g_end = t[hit], gaps.end[hit]
    loader = c.a.is_dataloader
    in_loader = intervals.length_in(c.trace.host.ts[loader], c.trace.host.end[loader], t, g_end)
    return float((g_end - t - in_loader).sum())


def advise_sync(e: HostSyncs, facts: Facts) -> Advice:
    # the three counts see the same waits from three sides (a .item() is a scalar read that
    # makes a synchronising call, which the device may record as an event): say each
    seen = [
        (e.host_syncs, "synchronising runtime calls"),
        (e.item_calls, "scalar reads (.item())"),
        (e.device_syncs, "synchronisation events on the device"),
    ]
    counts = ", ".join(f"{fmt_mean_count(n)} {what}" for n, what in seen if n)
    message = (
        f"Up to {fmt_mean_count(e.count)} synchronisations per step ({counts}; .item(), .cpu(), "
        "printing a tensor and explicit synchronize all wait for the GPU): each one drains the "
        f"GPU queue, leaving the GPU idle for {fmt_us(e.gpu_idle_us)} per step while the CPU "
        "catches up."
    )
    snippet = (
        "running_loss += loss.detach()          # stays on the GPU, no sync\n"
        "if step % log_every == 0:\n"
        "    print(running_loss.item() / log_every)  # one sync per log_every steps\n"
        "    running_loss.zero_()\n"
        "\n"
        "torch.cuda.set_sync_debug_mode('warn')  # reports every hidden sync while debugging"
    )
    return Advice(
        "Host-device synchronisations in the loop",
        message,
        "Keep metrics on the GPU and read them every N steps; remove .item()/.cpu()/print from the loop.",
        snippet,
    )


# --- launch_bound ----------------------------------------------------------------------

# A GPU gap this short, with the CPU late to launch, is launch overhead; longer ones are
# CPU work (data loading, Python) that the other rules explain.
_LAUNCH_GAP_US = 1000.0


@dataclass(frozen=True, eq=False, kw_only=True)
class LaunchBound(Evidence):
    """Kernels shorter than the runtime calls that launch them, and the GPU waiting for them."""

    short_percent: float  # kernels shorter than their launch
    median_kernel_us: float
    median_launch_us: float
    kernels_per_step: float
    waiting_us: float  # per step, in GPU gaps short enough to be launch overhead

    def quoted(self) -> dict[str, float | int | str]:
        return {
            "kernels_shorter_than_launch_percent": round(self.short_percent, 1),
            "median_kernel_us": round(self.median_kernel_us, 2),
            "median_launch_us": round(self.median_launch_us, 2),
            "kernels_per_step": round(self.kernels_per_step, 1),
            "gpu_waiting_for_launches_us_per_step": round(self.waiting_us, 1),
        }


def detect_launch_bound(c: Context) -> LaunchBound | None:
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
    return LaunchBound(
        saving_us=wait_per_step,
        rows=EvidenceRows(gpu=np.flatnonzero(m)[is_short]),  # the line launching most of them
        short_percent=100 * short,
        median_kernel_us=float(np.median(k_dur)),
        median_launch_us=float(np.median(l_dur)),
        kernels_per_step=c.per_step(int(m.sum())),
        waiting_us=wait_per_step,
    )


def advise_launch_bound(e: LaunchBound, facts: Facts) -> Advice:
    message = (
        f"{fmt_percent(e.short_percent)} of kernels finish faster than the CPU can launch them "
        f"(median kernel {fmt_us(e.median_kernel_us)}, median launch {fmt_us(e.median_launch_us)}); "
        f"the GPU waits {fmt_us(e.waiting_us)} per step for the next launch."
    )
    snippet = (
        "model = torch.compile(model, mode='reduce-overhead')  # fuses kernels, replays CUDA graphs\n"
        "# or capture a static step yourself: torch.cuda.graphs / torch.cuda.make_graphed_callables\n"
        "# or give each kernel more work: a larger batch size"
    )
    return Advice(
        "Launch-bound: kernels are shorter than their launches",
        message,
        "Launch fewer, bigger kernels: torch.compile (fusion, CUDA graphs) or a larger batch.",
        snippet,
    )
