"""Rules about feeding the GPU: DataLoader stalls, copies from pageable memory."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gpumagic.profile.analysis.where import EvidenceRows
from gpumagic.profile.rules.base import Advice, Context, Evidence, Facts
from gpumagic.profile.trace.model import MEMCPY
from gpumagic.units import fmt_bytes, fmt_mean_count, fmt_percent, fmt_us

# --- dataloader ------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, kw_only=True)
class DataLoaderStall(Evidence):
    """The breakdown's DataLoader time, and which loader the trace and the session show."""

    percent: float  # of the step
    us_per_step: float
    iterator: str | None  # the iterator class the trace names (None: no such span)
    num_workers: int | None  # the session's smallest, None without a live state
    in_process: bool  # the loader runs in the training process (num_workers=0)
    has_gpu: bool

    def quoted(self) -> dict[str, float | int | str]:
        out: dict[str, float | int | str] = {
            "dataloader_percent": round(self.percent, 2),
            "dataloader_us_per_step": round(self.us_per_step, 1),
        }
        if self.iterator is not None:
            out["iterator"] = self.iterator
        if self.num_workers is not None:
            out["num_workers"] = self.num_workers
        return out


def detect_dataloader(c: Context) -> DataLoaderStall | None:
    pct = c.percent["DataLoader"]
    if pct <= 5.0:
        return None
    names = [n for n in c.trace.host.name.values if n.startswith("enumerate(DataLoader)#")]
    single = any("_SingleProcessDataLoaderIter" in n for n in names)
    workers = c.live.num_workers if c.live is not None else None
    host = c.trace.host
    loads = np.flatnonzero(c.a.is_dataloader & c.host_in_steps(host.ts))
    return DataLoaderStall(
        saving_us=c.us["DataLoader"],
        rows=EvidenceRows(host=loads, host_weight=(host.end - host.ts)[loads]),
        confirmed=workers == 0,  # the session's loader is the single-process one the trace shows
        percent=pct,
        us_per_step=c.us["DataLoader"],
        iterator=names[0].split("#", 1)[1].split(".")[0] if names else None,
        num_workers=workers,
        in_process=single or workers == 0,
        has_gpu=c.has_gpu,
    )


def _loader_snippet(has_gpu: bool, first: str, workers_line: str) -> str:
    lines = [
        "loader = torch.utils.data.DataLoader(",
        f"    {first}",
        f"    {workers_line}",
        *(["    pin_memory=True,          # page-locked batches copy asynchronously"] if has_gpu else []),
        "    persistent_workers=True,  # keep workers between epochs",
        ")",
    ]
    return "\n".join(lines)


def advise_dataloader(e: DataLoaderStall, facts: Facts) -> Advice:
    workers = facts.loader_workers
    cpus = f"{facts.cpus} CPUs" if facts.cpus is not None else "the CPUs"
    # as %gpuenv suggests it: one CPU stays with the training process
    why_n = f"# {cpus} here, one left for training" if facts.cpus else "# measure: start near the CPUs / 2"
    if e.in_process:
        why = (
            "the loader runs in the training process (num_workers=0: _SingleProcessDataLoaderIter)"
        )
        fix = f"Load batches in worker processes ({workers} for this machine's {cpus})" + (
            ", and pin them for fast copies." if e.has_gpu else "."
        )
        snippet = _loader_snippet(
            e.has_gpu,
            "dataset, batch_size=batch_size, shuffle=True,",
            f"num_workers={workers},  {why_n}",
        )
        if workers == 0:
            fix = (
                "Only one CPU is available here: a worker would take it from training. Make "
                "each sample cheaper (precompute, cache) or move augmentation to the GPU."
            )
            snippet = "# one usable CPU: keep num_workers=0; precompute or cache what __getitem__ does"
    else:
        why = "the worker processes do not keep up"
        more = e.num_workers is None or e.num_workers < workers
        fix = (
            f"Add workers (up to {workers} for this machine's {cpus}) or prefetch deeper; "
            "move heavy augmentation to the GPU."
            if more
            else f"The workers already use the {cpus}: make each sample cheaper, or move heavy "
            "augmentation to the GPU."
        )
        snippet = _loader_snippet(
            e.has_gpu,
            "dataset, batch_size=batch_size,",
            f"num_workers={workers}, prefetch_factor=4,  {why_n}",
        )
    # the breakdown counts DataLoader time only where no kernel runs; on a CPU-only run
    # there is no GPU to speak of, only the training loop waiting for its batch
    idle = "nothing running on the GPU" if e.has_gpu else "the training loop waiting for its batch"
    message = (
        f"The DataLoader takes {fmt_percent(e.percent)} of each step ({fmt_us(e.us_per_step)}) "
        f"with {idle}: {why}."
    )
    return Advice("Data loading stalls the step", message, fix, snippet)


# --- pageable_memcpy -------------------------------------------------------------------

_PAGEABLE_HTOD = re.compile(r"^Memcpy HtoD \(Pageable -> Device\)")


@dataclass(frozen=True, eq=False, kw_only=True)
class PageableCopies(Evidence):
    """Host-to-device copies from pageable memory inside the steps, per step."""

    copies: float
    nbytes: float
    copy_us: float  # on the GPU
    host_blocked_us: float  # CPU time in the copy calls
    loader_pins: bool | None  # the session's DataLoaders all pin memory (None: unknown)

    def quoted(self) -> dict[str, float | int | str]:
        out: dict[str, float | int | str] = {
            "copies_per_step": round(self.copies, 2),
            "bytes_per_step": round(self.nbytes),
            "copy_us_per_step": round(self.copy_us, 1),
            "host_blocked_us_per_step": round(self.host_blocked_us, 1),
        }
        if self.loader_pins is not None:
            out["loader_pin_memory"] = str(self.loader_pins)
        return out


def detect_pageable_memcpy(c: Context) -> PageableCopies | None:
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
    return PageableCopies(
        saving_us=c.per_step(copy_us),
        rows=EvidenceRows(gpu=np.flatnonzero(m), gpu_weight=(gpu.end - gpu.ts)[m]),
        confirmed=pinned is False,
        copies=c.per_step(int(m.sum())),
        nbytes=c.per_step(nbytes),
        copy_us=c.per_step(copy_us),
        host_blocked_us=c.per_step(host_us),
        loader_pins=pinned,
    )


def advise_pageable_memcpy(e: PageableCopies, facts: Facts) -> Advice:
    source = (
        "the DataLoader pins memory, so these tensors come from elsewhere (created on the CPU each step?)"
        if e.loader_pins
        else "pageable (not pinned) memory must be staged by the driver, which blocks the CPU"
    )
    message = (
        f"{fmt_mean_count(e.copies)} host-to-device copies per step from pageable memory "
        f"({fmt_bytes(e.nbytes)}, {fmt_us(e.copy_us)} on the GPU, "
        f"{fmt_us(e.host_blocked_us)} of CPU time blocked in the copy calls): {source}."
    )
    snippet = (
        "loader = torch.utils.data.DataLoader(dataset, ..., pin_memory=True)\n"
        "for x, y in loader:\n"
        "    x = x.to('cuda', non_blocking=True)  # async copy from pinned memory\n"
        "    y = y.to('cuda', non_blocking=True)"
    )
    return Advice(
        "Copies from pageable memory",
        message,
        "Pin host memory (pin_memory=True) and copy with non_blocking=True so copies overlap compute.",
        snippet,
    )
