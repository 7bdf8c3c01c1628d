"""Pick the least-loaded GPUs on a shared box (``%gpuselect``, ``gpumagic.select_gpus()``).

The interface follows nvitop's ``select_devices(min_free_memory=..., max_gpu_utilization=...)``,
the one shared-box users already know; unlike it, the choice is applied here: it sets
``CUDA_VISIBLE_DEVICES`` to the chosen NVML indexes and ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so
``cuda:0`` is the first chosen GPU and the numbers match nvidia-smi's.

Both variables are read once, when the CUDA driver initialises in the process. That happens
on the first CUDA runtime call, not only at a first tensor: ``torch.cuda.is_available()``
already does it (``cudaGetDeviceCount`` runs ``cuInit``, as torch's own comment there says;
``device_count()`` asks NVML first in recent torch, but older releases cached its answer). After that
a new value changes nothing for this process, so the choice refuses instead of claiming a
GPU it cannot give. The checks never initialise CUDA themselves and never import torch: the
driver is asked whether ``cuInit`` ran (``cuDeviceGetCount`` answers NOT_INITIALIZED until
it has) only when libcuda is already loaded in the process.

Ranking, least loaded first: GPUs no other process uses; then more free memory (compared to
the GiB, so noise does not decide); then lower utilisation; then the higher index, keeping
GPU 0 (where everyone's default ``cuda`` lands) for last, as nvitop does. Candidates are the
GPUs visible now (``CUDA_VISIBLE_DEVICES`` as set by a scheduler), or, after an earlier
choice in this process, the ones visible before it.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpumagic.monitor.devices import parse_visible_devices
from gpumagic.monitor.nvml import nvml_state
from gpumagic.monitor.processes import GpuProcess, compute_processes, process_rows
from gpumagic.render.html import Rendered
from gpumagic.units import fmt_bytes, fmt_percent, parse_size

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.render.sections import Report

GIB = 1024**3
VISIBLE = "CUDA_VISIBLE_DEVICES"
ORDER = "CUDA_DEVICE_ORDER"
# NVML's utilisation is an average over its last sampling period (1/6 s to 1 s by board):
# a few reads over half a second catch a GPU that is busy in bursts.
SAMPLE_S = 0.5
_READS = 4


class SelectError(ValueError):
    """No choice was made, and why; the environment is unchanged."""


# -- is it too late? -------------------------------------------------------------------------
def _libcuda_loaded() -> bool:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            return any("libcuda.so" in line for line in f)
    except OSError:
        return False


def _driver_initialised() -> bool | None:
    """Whether ``cuInit`` already ran in this process (None: cannot tell on this platform).

    Only when libcuda is already mapped: loading it just to ask would be harmless, but a
    process without it has certainly not initialised CUDA.
    """
    if not sys.platform.startswith("linux"):
        return None
    if not _libcuda_loaded():
        return False
    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LOCAL)
        count = ctypes.c_int(0)
        rc = int(lib.cuDeviceGetCount(ctypes.byref(count)))
    except (OSError, AttributeError):
        return None
    return rc != 3  # CUDA_ERROR_NOT_INITIALIZED: cuInit has not run


def too_late() -> str | None:
    """Why a choice can no longer take effect in this process, or None. Imports nothing."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return "CUDA is already initialised in this process (torch.cuda.is_initialized())"
        except Exception:
            pass
        try:
            cached = torch.cuda.device_count.cache_info().currsize  # an lru_cache in torch
        except Exception:
            cached = 0
        if cached:
            return (
                "torch.cuda.device_count() already ran and keeps the GPU count it saw "
                "(it is cached for the life of the process)"
            )
    if _driver_initialised():
        return (
            "the CUDA driver is already initialised in this process (a torch.cuda.is_available() "
            "call is enough), and it reads CUDA_VISIBLE_DEVICES only then"
        )
    return None


TOO_LATE_FIX = (
    "restart the kernel and select in the first cell, before anything touches CUDA "
    "(torch.cuda.is_available() included)"
)


# -- reading the GPUs ----------------------------------------------------------------------
@dataclass
class Candidate:
    """One GPU as the chooser saw it; memory in bytes, utilisation in %."""

    index: int  # NVML (nvidia-smi) index
    name: str
    uuid: str | None
    total: float = math.nan
    free: float = math.nan
    utilization: float = math.nan
    processes: list[GpuProcess] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # why it cannot be chosen (empty: it can)
    process_note: str | None = None  # the process list could not be read
    chosen: bool = False
    rank: int | None = None  # 1 = least loaded among the eligible

    @property
    def others(self) -> list[GpuProcess]:
        return [p for p in self.processes if not p.this_kernel]

    @property
    def users(self) -> list[str]:
        return sorted({p.user or "?" for p in self.others})

    def load(self) -> str:
        parts = [f"{fmt_bytes(self.free)} of {fmt_bytes(self.total)} free"]
        parts.append(
            f"{fmt_percent(self.utilization)} busy"
            if not math.isnan(self.utilization)
            else "utilisation unknown"
        )
        others = self.others
        if others:
            parts.append(
                f"{len(others)} other process{'es' if len(others) != 1 else ''} "
                f"({', '.join(self.users)}, {fmt_bytes(sum(_finite(p.gpu_memory) for p in others))})"
            )
        else:
            parts.append("no other process")
        return ", ".join(parts)


def _finite(value: float) -> float:
    return 0.0 if math.isnan(value) else value


def _call(module: Any, name: str, *args: Any, **kw: Any) -> Any:
    fn = getattr(module, name, None)
    if fn is None:
        return None
    try:
        return fn(*args, **kw)
    except Exception:
        return None


def _read(module: Any, handle: Any, candidate: Candidate, own_pid: int, sample_s: float) -> None:
    info = None
    v2 = getattr(module, "nvmlMemory_v2", None)
    if v2 is not None:
        info = _call(module, "nvmlDeviceGetMemoryInfo", handle, version=v2)
    if info is None:
        info = _call(module, "nvmlDeviceGetMemoryInfo", handle)
    if info is not None:
        candidate.total, candidate.free = float(info.total), float(info.free)
    reads = _READS if sample_s > 0 else 1
    utils = []
    for i in range(reads):
        util = _call(module, "nvmlDeviceGetUtilizationRates", handle)
        if util is not None:
            utils.append(float(util.gpu))
        if i + 1 < reads:
            time.sleep(sample_s / (reads - 1))
    if utils:
        candidate.utilization = max(utils)  # busy in bursts is busy
    procs, why = compute_processes(module, handle)
    if procs is None:
        candidate.process_note = f"process list unavailable ({why})"
    gpu = f"GPU {candidate.index}"
    candidate.processes += process_rows(procs or [], gpu, gpu, candidate.index, None, own_pid)
    mig = _call(module, "nvmlDeviceGetMigMode", handle)
    if isinstance(mig, (tuple, list)) and mig and mig[0] == 1:
        candidate.skipped.append(
            "MIG mode is on: CUDA sees its instances, not the GPU (choose one by its MIG UUID)"
        )


# -- the choice ------------------------------------------------------------------------------
@dataclass(repr=False)
class GpuChoice(Rendered):
    """What ``select_gpus`` chose and why; ``indices`` are NVML (nvidia-smi) indexes,
    ``cuda:0`` being the first. ``env`` is what was set (empty when ``apply=False``)."""

    indices: list[int]
    uuids: list[str | None]
    count: int
    candidates: list[Candidate]
    criteria: list[str]
    env: dict[str, str]
    previous: dict[str, str | None]
    notes: list[str] = field(default_factory=list)

    def __iter__(self) -> Any:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def table(self) -> pd.DataFrame:
        """One row per GPU seen: memory (bytes), utilisation (%), other processes and users,
        whether it was chosen and why not."""
        import pandas as pd

        rows = [
            {
                "index": c.index,
                "name": c.name,
                "uuid": c.uuid,
                "memory_free": c.free,
                "memory_total": c.total,
                "utilization_gpu": c.utilization,
                "other_processes": len(c.others),
                "other_memory": sum(_finite(p.gpu_memory) for p in c.others),
                "users": ", ".join(c.users),
                "chosen": c.chosen,
                "rank": c.rank,
                "why_not": "; ".join(c.skipped),
            }
            for c in self.candidates
        ]
        frame = pd.DataFrame(rows)
        if len(frame):
            frame["rank"] = frame["rank"].astype("Int64")
        return frame

    def _report(self) -> Report:
        from gpumagic.render.select import choice_report

        return choice_report(self)


def _sort_key(c: Candidate) -> tuple[int, float, float, int]:
    free_gib = math.floor(c.free / GIB) if not math.isnan(c.free) else -1
    util = c.utilization if not math.isnan(c.utilization) else 101.0
    return (1 if c.others else 0, -free_gib, util, -c.index)


_applied_lock = threading.Lock()
# CUDA_VISIBLE_DEVICES as it was before the first choice in this process (a scheduler's
# allocation): a second choice picks among those, not among the one GPU the first left.
_before_first: dict[str, str | None] | None = None


def select_gpus(
    count: int = 1,
    *,
    min_free_memory: int | float | str | None = None,
    max_gpu_utilization: float | None = None,
    no_others: bool = False,
    apply: bool = True,
    sample_s: float = SAMPLE_S,
) -> GpuChoice:
    """Choose the ``count`` least-loaded GPUs and (``apply``) make them this process's GPUs.

    ``min_free_memory``: bytes or ``"8GiB"``; ``max_gpu_utilization``: percent; ``no_others``:
    only GPUs without another process. Raises ValueError, changing nothing, when there is no
    NVIDIA GPU or NVML, when CUDA is already initialised in this process (the choice could
    not take effect: restart and select first), or when fewer than ``count`` GPUs qualify.
    Never initialises CUDA and never imports torch.
    """
    global _before_first
    min_free, max_util = _limits(count, min_free_memory, max_gpu_utilization)
    late = too_late()
    if late is not None:
        raise SelectError(f"cannot choose GPUs now: {late}; {TOO_LATE_FIX}")
    state = nvml_state()
    if state.reason is not None:
        raise SelectError(f"no NVIDIA GPU to choose from: {state.reason}")

    with _applied_lock:
        base = _before_first if _before_first is not None else {VISIBLE: os.environ.get(VISIBLE)}
    order, notes = parse_visible_devices(base[VISIBLE], [g.uuid for g in state.gpus])
    if not order:
        raise SelectError(
            f"no NVIDIA GPU to choose from: {VISIBLE}={base[VISIBLE]!r} hides every GPU "
            f"({len(state.gpus)} on this machine)"
        )
    candidates = _read_candidates(state, order, sample_s)
    criteria = _criteria(min_free, max_util, no_others)
    _skip_unqualified(candidates, min_free, max_util, no_others)
    eligible = sorted((c for c in candidates if not c.skipped), key=_sort_key)
    for rank, c in enumerate(eligible, 1):
        c.rank = rank
    if len(eligible) < count:
        listing = "; ".join(
            f"GPU {c.index}: {'; '.join(c.skipped) if c.skipped else 'eligible'}" for c in candidates
        )
        raise SelectError(
            f"{len(eligible)} of {len(candidates)} GPU(s) qualify"
            + (f" ({', '.join(criteria)})" if criteria else "")
            + f", {count} wanted: {listing}. Nothing was changed."
        )
    chosen = eligible[:count]
    for c in chosen:
        c.chosen = True
    indices = [c.index for c in chosen]
    previous = {VISIBLE: os.environ.get(VISIBLE), ORDER: os.environ.get(ORDER)}
    env: dict[str, str] = {}
    if apply:
        env = {ORDER: "PCI_BUS_ID", VISIBLE: ",".join(map(str, indices))}
        with _applied_lock:
            if _before_first is None:
                _before_first = {VISIBLE: previous[VISIBLE]}
            os.environ.update(env)
        notes += _watcher_note()
    return GpuChoice(
        indices=indices,
        uuids=[c.uuid for c in chosen],
        count=count,
        candidates=candidates,
        criteria=criteria,
        env=env,
        previous=previous,
        notes=notes,
    )



def _limits(
    count: object, min_free_memory: int | float | str | None, max_gpu_utilization: float | None
) -> tuple[int | None, float | None]:
    """The arguments checked: (minimum free bytes, maximum utilisation percent)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a whole number of GPUs >= 1, got {count!r}")
    min_free = parse_size(min_free_memory) if min_free_memory is not None else None
    if max_gpu_utilization is None:
        return min_free, None
    max_util = float(max_gpu_utilization)
    if not 0 <= max_util <= 100:
        raise ValueError(f"max_gpu_utilization must be a percentage 0-100, got {max_gpu_utilization!r}")
    return min_free, max_util


def _read_candidates(state: Any, order: list[int], sample_s: float) -> list[Candidate]:
    own = os.getpid()
    candidates = []
    for nvml_index in order:
        gpu = state.gpus[nvml_index]
        c = Candidate(nvml_index, gpu.name, gpu.uuid)
        if gpu.handle is None:
            c.skipped.append("NVML gave no handle")
        else:
            _read(state.module, gpu.handle, c, own, sample_s)
        candidates.append(c)
    return candidates


def _criteria(min_free: int | None, max_util: float | None, no_others: bool) -> list[str]:
    criteria = []
    if min_free is not None:
        criteria.append(f"at least {fmt_bytes(min_free)} free")
    if max_util is not None:
        criteria.append(f"at most {fmt_percent(max_util)} busy")
    if no_others:
        criteria.append("no other process")
    return criteria


def _skip_unqualified(
    candidates: list[Candidate], min_free: int | None, max_util: float | None, no_others: bool
) -> None:
    """Say on each candidate why it does not qualify (an empty ``skipped``: it does)."""
    for c in candidates:
        if min_free is not None and not (c.free >= min_free):
            c.skipped.append(f"{fmt_bytes(c.free)} free < {fmt_bytes(min_free)}")
        if max_util is not None:
            if math.isnan(c.utilization):
                c.skipped.append("utilisation unknown")
            elif c.utilization > max_util:
                c.skipped.append(f"{fmt_percent(c.utilization)} busy > {fmt_percent(max_util)}")
        if no_others and c.others:
            c.skipped.append(f"used by {', '.join(c.users)}")
        elif no_others and c.process_note:
            c.skipped.append(f"cannot tell who uses it: {c.process_note}")


def _watcher_note() -> list[str]:
    from gpumagic.monitor.watcher import current

    if current() is None:
        return []
    return [
        "a gpuwatch started before this choice still numbers the GPUs as it found them: "
        "restart it to follow the new CUDA_VISIBLE_DEVICES"
    ]
