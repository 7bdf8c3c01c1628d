"""Rules about the host holding the GPU back: synchronisations, launch-bound steps."""

from __future__ import annotations

import numpy as np

from gpumagic.profile.analysis import intervals
from gpumagic.profile.analysis.trace_analysis import is_host_sync
from gpumagic.profile.analysis.where import EvidenceRows
from gpumagic.profile.rules.base import Context, Finding
from gpumagic.profile.trace.model import KERNEL
from gpumagic.units import fmt_mean_count, fmt_percent, fmt_us


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
        f"{fmt_mean_count(c.per_step(count))} device synchronisations per step "
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
