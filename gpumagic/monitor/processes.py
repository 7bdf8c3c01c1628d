"""Who is on the GPU: each watched GPU's compute processes, as nvidia-smi's bottom table and
nvitop's process panel list them (pid, user, GPU memory, command line), this kernel marked.

NVML gives the pid and the GPU memory; the user and the command line come from the process
table (psutil). NVML reports PIDs in the host's PID namespace (NVIDIA/nvidia-docker#179):
inside a container most of them name no process here, so their user and command are
unknown, and this kernel cannot be recognised among them. Their memory is still NVML's
number and is shown. Read on demand (``%gpuwatch status``, the stop summary), not at every
sample: one psutil lookup per process is cheap once, not every second.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpumagic.monitor.devices import WatchedDevice

if TYPE_CHECKING:
    import pandas as pd

# NVML return codes whose answer cannot change (nvml.h): asking the older struct may help.
_NOT_SUPPORTED = 3
_FUNCTION_NOT_FOUND = 13

NOT_IN_NAMESPACE = "not in this PID namespace"

CONTAINER_NOTE = (
    "NVML lists host PIDs: {n} of them name no process in this PID namespace (a container?), "
    "so their user and command are unknown and this kernel cannot be told apart among them; "
    "their GPU memory is NVML's"
)


@dataclass(frozen=True)
class GpuProcess:
    """One compute process on one GPU. ``gpu_memory`` in bytes (NaN: NVML cannot attribute
    memory per process, as under Windows WDDM); ``user``/``command`` None when unknown."""

    device: str  # WatchedDevice.key: "cuda:0"
    label: str  # WatchedDevice.label: "GPU 0", "cuda:0 (GPU 2)"
    index: int | None  # NVML (nvidia-smi) index
    cuda_index: int | None
    pid: int
    user: str | None
    gpu_memory: float
    command: str | None
    this_kernel: bool
    note: str = ""


@dataclass
class ProcessTable:
    """The processes of the watched GPUs at ``time``, and why anything is missing."""

    rows: list[GpuProcess] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    time: float = math.nan
    read: bool = False  # False: no GPU watched, or not read yet

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        columns = [
            "device",
            "index",
            "cuda_index",
            "pid",
            "user",
            "gpu_memory",
            "command",
            "this_kernel",
            "note",
        ]
        data = [{c: getattr(r, c) for c in columns} for r in self.rows]
        frame = pd.DataFrame(data, columns=columns)
        for column in ("index", "cuda_index", "pid"):
            frame[column] = frame[column].astype("Int64")
        frame["gpu_memory"] = frame["gpu_memory"].astype(float)
        frame["this_kernel"] = frame["this_kernel"].astype(bool)
        return frame


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def compute_processes(module: Any, handle: Any) -> tuple[list[Any] | None, str | None]:
    """NVML's compute processes of one GPU, or None and why.

    nvidia-ml-py asks for the v3 struct by default; drivers older than R510 lack it (an
    ``NVMLLibraryMismatchError`` without a code, or FUNCTION_NOT_FOUND), so fall back to v2,
    as the sampler does for its own process memory.
    """
    last: str | None = None
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"):
        fn = getattr(module, name, None)
        if fn is None:
            last = f"{name} missing from this nvidia-ml-py"
            continue
        try:
            return list(fn(handle)), None
        except Exception as exc:
            last = f"{name}: {exc or type(exc).__name__}"
            if _code(exc) not in (None, _NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
                break  # a real error (lost GPU, no permission): the older call says the same
    return None, last


def describe_pid(pid: int) -> tuple[str | None, str | None, str]:
    """(user, command line, note) of a pid in this PID namespace, through psutil."""
    try:
        import psutil
    except ImportError:
        return None, None, "psutil is not installed"
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None, None, NOT_IN_NAMESPACE
    except psutil.Error as exc:
        return None, None, type(exc).__name__
    user: str | None
    command: str | None
    note = ""
    try:
        user = proc.username()
    except (psutil.Error, KeyError):  # KeyError: a uid with no passwd entry (containers)
        try:
            user = f"uid {proc.uids().real}"
        except psutil.Error:
            user = None
    except Exception:
        user = None
    try:
        argv = proc.cmdline()
        command = shlex.join(argv) if argv else f"[{proc.name()}]"
    except psutil.AccessDenied:
        command, note = None, "command hidden (access denied)"
    except psutil.NoSuchProcess:
        return user, None, "exited"
    except psutil.Error:
        command = None
    return user, command, note


def process_rows(
    procs: Sequence[Any],
    device: str,
    label: str,
    index: int | None,
    cuda_index: int | None,
    own_pid: int,
    described: dict[int, tuple[str | None, str | None, str]] | None = None,
) -> list[GpuProcess]:
    """One row per NVML process entry of one GPU, each pid described once (``described``
    carries what earlier GPUs learnt: a process on several GPUs is looked up once)."""
    seen = {} if described is None else described
    rows: list[GpuProcess] = []
    for proc in procs:
        pid = getattr(proc, "pid", None)
        if not isinstance(pid, int):
            continue
        if pid not in seen:
            seen[pid] = describe_pid(pid)
        user, command, note = seen[pid]
        mem = getattr(proc, "usedGpuMemory", None)
        rows.append(
            GpuProcess(
                device=device,
                label=label,
                index=index,
                cuda_index=cuda_index,
                pid=pid,
                user=user,
                gpu_memory=math.nan if mem is None else float(mem),
                command=command,
                this_kernel=pid == own_pid,
                note=note,
            )
        )
    return rows


def read_processes(
    module: Any, gpus: Sequence[tuple[WatchedDevice, Any]], own_pid: int, now: float
) -> ProcessTable:
    """The compute processes of ``gpus`` (``(device, NVML handle)`` pairs), never raising."""
    table = ProcessTable(time=now, read=True)
    described: dict[int, tuple[str | None, str | None, str]] = {}
    for device, handle in gpus:
        procs, why = compute_processes(module, handle)
        if procs is None:
            table.notes.append(f"{device.label}: process list unavailable ({why})")
            continue
        table.rows += process_rows(
            procs, device.key, device.label, device.nvml_index, device.cuda_index, own_pid, described
        )
    foreign = {r.pid for r in table.rows if r.note == NOT_IN_NAMESPACE}
    if foreign:
        table.notes.append(CONTAINER_NOTE.format(n=len(foreign)))
    if any(math.isnan(r.gpu_memory) for r in table.rows):
        table.notes.append(
            "NVML gives no per-process GPU memory here (Windows WDDM): shown as missing"
        )
    return table
