"""Rules about multi-GPU communication: exposed collectives, DataParallel, gloo on GPUs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpumagic.profile.analysis.where import EvidenceRows
from gpumagic.profile.rules.base import Advice, Context, Evidence, Facts
from gpumagic.profile.trace.session import DdpState
from gpumagic.units import fmt_bytes, fmt_mean_count, fmt_percent, fmt_us

# --- communication ---------------------------------------------------------------------

_COMMUNICATION_PERCENT = 10.0  # the TensorBoard plugin's threshold, on the exposed share


@dataclass(frozen=True, eq=False, kw_only=True)
class ExposedCommunication(Evidence):
    """The breakdown's Communication category (collective time no kernel, copy or set
    covers), how much of it computation overlaps, and the collective that takes most."""

    percent: float  # of the step
    us: float  # per step
    exposed_us: float  # per step, with no computation beside it
    overlap_percent: float | None  # HTA's overlap (None: not measurable)
    on_cpu: bool  # the collectives run through a CPU backend and no kernel communicates
    top: tuple[str, str, int] | None  # the top collective: name, backend, calls
    top_call_bytes: float | None
    top_busbw_gbps: float | None
    ddp: DdpState | None  # the session's first DDP model, as configured
    find_unused: bool  # some DDP model in the session has find_unused_parameters on

    def quoted(self) -> dict[str, float | int | str]:
        out: dict[str, float | int | str] = {
            "communication_percent": round(self.percent, 2),
            "communication_us_per_step": round(self.us, 1),
            "not_overlapped_us_per_step": round(self.exposed_us, 1),
        }
        if self.overlap_percent is not None:
            out["communication_overlap_percent"] = round(self.overlap_percent, 2)
        if self.top is not None:
            name, backend, calls = self.top
            out["top_collective"] = f"{name} ({backend}, {calls} calls)"
        if self.top_call_bytes is not None:
            out["top_collective_call_bytes"] = round(self.top_call_bytes)
        if self.top_busbw_gbps is not None:
            out["top_collective_busbw_gbps"] = round(self.top_busbw_gbps, 2)
        for key in ("bucket_cap_mb", "gradient_as_bucket_view", "find_unused_parameters"):
            value = getattr(self.ddp, key) if self.ddp is not None else None
            if value is not None:
                out[f"ddp_{key}"] = str(round(value, 1) if isinstance(value, float) else value)
        return out


def detect_communication(c: Context) -> ExposedCommunication | None:
    """Communication takes more than 10% of the step (the TensorBoard plugin's rule, on the
    Communication category: collective time no kernel, copy or set covers). The saving is
    the communication no computation overlaps, per step."""
    pct, comm_us = c.percent["Communication"], c.us["Communication"]
    if pct <= _COMMUNICATION_PERCENT:
        return None
    comms = c.a.comms
    split = comms.step_split(c.steps)
    exposed = float(split[:, 2].mean()) if len(split) else comm_us
    frame = comms.collectives_frame(c.trace.rank or 0)
    top = frame.iloc[0] if not frame.empty else None
    ddp = c.live.ddp if c.live is not None else ()
    unused = any(d.find_unused_parameters for d in ddp)
    return ExposedCommunication(
        saving_us=exposed,
        rows=_communication_rows(c, comms.kernels, comms.host),
        confirmed=unused,
        percent=pct,
        us=comm_us,
        exposed_us=exposed,
        overlap_percent=comms.overlap_percent,
        on_cpu=comms.cpu_backend and not comms.kernels.any(),
        top=(str(top["name"]), str(top["backend"]), int(top["calls"])) if top is not None else None,
        top_call_bytes=_finite(top["bytes_per_call"]) if top is not None else None,
        top_busbw_gbps=_finite(top["busbw_gbps"]) if top is not None else None,
        ddp=ddp[0] if ddp else None,
        find_unused=unused,
    )


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def _communication_rows(c: Context, gpu_mask: np.ndarray, host_mask: np.ndarray) -> EvidenceRows:
    """Collective kernels and host spans inside the steps, weighted by duration: the line
    whose range launched most of them (``loss.backward()`` for DDP's bucketed all-reduce)."""
    gpu, host = c.trace.gpu, c.trace.host
    g = np.flatnonzero(gpu_mask & c.gpu_in_steps)
    h = np.flatnonzero(host_mask & c.host_in_steps(host.ts))
    return EvidenceRows(
        host=h, host_weight=(host.end - host.ts)[h], gpu=g, gpu_weight=(gpu.end - gpu.ts)[g]
    )


def advise_communication(e: ExposedCommunication, facts: Facts) -> Advice:
    hidden = (
        f"; {fmt_percent(e.overlap_percent)} of it overlaps computation"
        if e.overlap_percent is not None
        else ""
    )
    message = (
        f"Collectives take {fmt_percent(e.percent)} of each step ({fmt_us(e.us)}){hidden}, and "
        f"{fmt_us(e.exposed_us)} per step runs with no computation beside it: the ranks wait for "
        "data to move instead of computing"
        + (" (the collectives run on the CPU, through gloo)" if e.on_cpu else "")
        + ". Saving is that non-overlapped time."
    )
    fix = (
        "Overlap communication with backward: DDP all-reduces in buckets as gradients become "
        "ready, so tune bucket_cap_mb, use gradient_as_bucket_view=True, and leave "
        "find_unused_parameters off unless the model needs it"
        + (" (it is on here: it walks the graph every step)" if e.find_unused else "")
        + "; all-reduce less often with gradient accumulation under no_sync(); "
        "send fewer bytes with a compression hook (bf16/fp16, PowerSGD)"
        + ("; on GPUs use the NCCL backend." if e.on_cpu else ".")
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
    return Advice("Communication not hidden behind compute", message, fix, snippet)


# --- dataparallel ----------------------------------------------------------------------


@dataclass(frozen=True, eq=False, kw_only=True)
class DataParallelUse(Evidence):
    """``nn.DataParallel`` in the trace (its forward spans) or in the session's namespace."""

    forward_calls: float  # per step
    forward_us: float | None  # per step (None: no span in the trace)
    wrapped: tuple[str, ...]  # the session's variables holding one

    def quoted(self) -> dict[str, float | int | str]:
        out: dict[str, float | int | str] = {
            "data_parallel_forward_calls_per_step": round(self.forward_calls, 2)
        }
        if self.wrapped:
            out["wrapped_in_namespace"] = ", ".join(self.wrapped)
        if self.forward_us is not None:
            out["data_parallel_forward_us_per_step"] = round(self.forward_us, 1)
        return out

    def severity(self, step_us: float) -> str:
        # no time saving is estimated; one process driving every GPU is worth fixing anyway
        return "medium"


def detect_dataparallel(c: Context) -> DataParallelUse | None:
    """``nn.DataParallel``: one process drives every GPU; DDP is the supported way."""
    host = c.trace.host
    spans = host.name.mask(lambda n: n == "DataParallel.forward") & c.host_in_steps(host.ts)
    live = c.live.data_parallel if c.live is not None else ()
    if not spans.any() and not live:
        return None
    dp_us = float((host.end - host.ts)[spans].sum())
    return DataParallelUse(
        saving_us=0.0,
        rows=EvidenceRows(host=np.flatnonzero(spans)),  # the line calling the wrapped model
        confirmed=bool(live),
        forward_calls=c.per_step(int(spans.sum())),
        forward_us=c.per_step(dp_us) if spans.any() else None,
        wrapped=tuple(live),
    )


def advise_dataparallel(e: DataParallelUse, facts: Facts) -> Advice:
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
    return Advice(
        "nn.DataParallel instead of DistributedDataParallel",
        message,
        "Use DistributedDataParallel, one process per GPU (torchrun), instead of nn.DataParallel.",
        snippet,
    )


# --- gloo_on_gpu -----------------------------------------------------------------------


@dataclass(frozen=True, eq=False, kw_only=True)
class GlooOnGpu(Evidence):
    """Collectives through a CPU backend on a GPU job: the copies they stage through host
    memory, per step."""

    copies: float
    nbytes: float
    copy_us: float
    host_spans: float  # collective spans on the host
    backend: str | None  # the session's process-group backend, as torch names it

    def quoted(self) -> dict[str, float | int | str]:
        out: dict[str, float | int | str] = {
            "copies_in_collectives_per_step": round(self.copies, 2),
            "copy_bytes_per_step": round(self.nbytes),
            "copy_us_per_step": round(self.copy_us, 1),
            "collective_host_spans_per_step": round(self.host_spans, 2),
        }
        if self.backend is not None:
            out["process_group_backend"] = self.backend
        return out

    def severity(self, step_us: float) -> str:
        # the copies are the least of it: the CPU does the reduction
        found = super().severity(step_us)
        return "medium" if found == "low" else found


def detect_gloo_on_gpu(c: Context) -> GlooOnGpu | None:
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
    return GlooOnGpu(
        saving_us=c.per_step(copy_us),
        rows=_communication_rows(c, copies, comms.host),
        confirmed=live_gloo,
        copies=c.per_step(int(copies.sum())),
        nbytes=c.per_step(nbytes),
        copy_us=c.per_step(copy_us),
        host_spans=c.per_step(int(host_comm.sum())),
        backend=backend,
    )


def advise_gloo_on_gpu(e: GlooOnGpu, facts: Facts) -> Advice:
    message = (
        "Collectives run through gloo on a GPU job: gloo copies each CUDA tensor to host memory, "
        "reduces it on the CPU and copies it back "
        f"({fmt_mean_count(e.copies)} copies per step, "
        f"{fmt_bytes(e.nbytes)}, {fmt_us(e.copy_us)} on the GPU). NCCL "
        "moves the data GPU to GPU. Saving counts only those copies; NCCL's faster transfer "
        "comes on top."
    )
    snippet = (
        "dist.init_process_group('nccl')  # GPU tensors; or both: backend='cpu:gloo,cuda:nccl'\n"
        "torch.cuda.set_device(local_rank)"
    )
    return Advice(
        "gloo collectives on CUDA tensors",
        message,
        "Use the NCCL backend for collectives on CUDA tensors.",
        snippet,
    )
