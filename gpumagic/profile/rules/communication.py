"""Rules about multi-GPU communication: exposed collectives, DataParallel, gloo on GPUs."""

from __future__ import annotations

import numpy as np

from gpumagic.profile.analysis.where import EvidenceRows
from gpumagic.profile.rules.base import Context, Finding
from gpumagic.units import fmt_bytes, fmt_mean_count, fmt_percent, fmt_us

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
        f"({fmt_mean_count(c.per_step(int(copies.sum())))} copies per step, "
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
