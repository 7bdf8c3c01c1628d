"""Rules about feeding the GPU: DataLoader stalls, copies from pageable memory."""

from __future__ import annotations

import re

import numpy as np

from gpumagic.profile.analysis.where import EvidenceRows
from gpumagic.profile.rules.base import Context, Finding
from gpumagic.profile.trace.model import MEMCPY
from gpumagic.units import fmt_bytes, fmt_mean_count, fmt_percent, fmt_us


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
        f"{fmt_mean_count(c.per_step(int(m.sum())))} host-to-device copies per step from pageable memory "
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
