"""GPU sampling through NVML (the ``nvidia-ml-py`` package, module ``pynvml``).

``pynvml`` is imported and ``nvmlInit`` called once per process, on first use, and the
device handles are cached with it: re-initialising per watcher would leak NVML's
reference count and repeat the handle lookups. ``nvmlShutdown`` is never called because
other code in the kernel (PyTorch, other monitors) may share the library.

Errors never leave this module as exceptions during sampling: a metric the GPU does not
support (``NVML_ERROR_NOT_SUPPORTED``, common on consumer boards for power or memory
utilisation) is remembered and not asked again; a lost GPU stops being asked at all; any
other error makes the value missing for that sample only. PCIe throughput is not sampled:
``nvmlDeviceGetPcieThroughput`` blocks ~20 ms per call by design (it measures over a window).
"""

from __future__ import annotations

import importlib
import math
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpumagic.monitor import metrics as M
from gpumagic.monitor.devices import (
    Device,
    map_from_torch,
    parse_visible_devices,
    torch_visible_uuids,
)

# NVML return codes (nvml.h; stable across driver versions). Classified by code rather than
# by pynvml's generated exception classes so the rules read plainly.
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_DRIVER_NOT_LOADED = 9
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_RESET_REQUIRED = 16
# Asking again cannot succeed: the answer is a property of the board, driver or permissions.
_PERMANENT = {ERROR_NOT_SUPPORTED, ERROR_NO_PERMISSION, ERROR_FUNCTION_NOT_FOUND}
_LOST = {ERROR_GPU_IS_LOST, ERROR_RESET_REQUIRED}


class NvmlUnavailable(Exception):
    """NVML cannot be used in this process; ``str()`` is the one-line reason shown to the user."""


@dataclass
class PhysicalGpu:
    nvml_index: int
    handle: Any
    name: str
    uuid: str | None


@dataclass
class _NvmlState:
    module: Any
    reason: str | None  # None: initialised and usable
    gpus: list[PhysicalGpu] = field(default_factory=list)


_lock = threading.Lock()
_states: list[_NvmlState] = []  # one per pynvml module object seen (tests swap in a double)


def _error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def describe_init_error(exc: BaseException) -> str:
    """The one-line reason shown in place of the GPU panel."""
    code = _error_code(exc)
    if code == ERROR_LIBRARY_NOT_FOUND:
        if sys.platform == "darwin":
            return "NVML unavailable: macOS has no NVIDIA driver"
        library = "nvml.dll" if sys.platform.startswith("win") else "libnvidia-ml.so.1"
        return f"NVML unavailable: {library} not found (no NVIDIA driver)"
    if code == ERROR_DRIVER_NOT_LOADED:
        return "NVML unavailable: the NVIDIA driver is not loaded"
    if code == ERROR_NO_PERMISSION:
        return "NVML unavailable: no permission to query the NVIDIA driver"
    return f"NVML unavailable: {type(exc).__name__}: {exc}"


def _init(module: Any) -> _NvmlState:
    try:
        module.nvmlInit()
    except Exception as exc:  # NVMLError, or OSError from ctypes on odd systems
        return _NvmlState(module, describe_init_error(exc))
    state = _NvmlState(module, None)
    try:
        count = int(module.nvmlDeviceGetCount())
    except Exception as exc:
        state.reason = f"NVML unavailable: cannot count GPUs ({exc})"
        return state
    for index in range(count):
        try:
            handle = module.nvmlDeviceGetHandleByIndex(index)
        except Exception:
            # Keep the slot so NVML indexes stay aligned; a GPU without a handle is not watched.
            state.gpus.append(PhysicalGpu(index, None, "unavailable", None))
            continue
        try:
            name = _text(module.nvmlDeviceGetName(handle))
        except Exception:
            name = "NVIDIA GPU"
        try:
            uuid: str | None = _text(module.nvmlDeviceGetUUID(handle))
        except Exception:
            uuid = None
        state.gpus.append(PhysicalGpu(index, handle, name, uuid))
    if not state.gpus:
        state.reason = "NVML found no NVIDIA GPU"
    return state


def nvml_state() -> _NvmlState:
    """Import ``pynvml`` and initialise it once for this process (per module object)."""
    try:
        module = importlib.import_module("pynvml")
    except ImportError:
        return _NvmlState(
            None, "NVML unavailable: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
        )
    with _lock:
        for state in _states:
            if state.module is module:
                return state
        state = _init(module)
        _states.append(state)
        return state


@dataclass
class GpuSelection:
    """The GPUs a watcher samples, or the reason it samples none."""

    gpus: list[tuple[Device, PhysicalGpu]]
    available: list[Device]  # every visible GPU (for error messages)
    reason: str | None
    notes: list[str]
    module: Any


def select_gpus(wanted: list[int] | None) -> GpuSelection:
    """Visible GPUs (CUDA order), filtered to the CUDA indexes in ``wanted``.

    Raises ValueError for an index that is not visible, listing the ones that are.
    """
    state = nvml_state()
    notes: list[str] = []
    visible: list[tuple[Device, PhysicalGpu]] = []
    reason = state.reason
    if reason is None:
        uuids = [g.uuid for g in state.gpus]
        order: list[int] | None = None
        torch_uuids = torch_visible_uuids()
        if torch_uuids is not None:
            order = map_from_torch(torch_uuids, uuids)
        if order is None:
            env = os.environ.get("CUDA_VISIBLE_DEVICES")
            order, env_notes = parse_visible_devices(env, uuids)
            notes.extend(env_notes)
            names = {state.gpus[i].name for i in order}
            if (
                len(names) > 1
                and os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") != "PCI_BUS_ID"
            ):
                notes.append(
                    "GPUs of different models and CUDA_DEVICE_ORDER is not PCI_BUS_ID: "
                    "cuda:N may not be the GPU shown as cuda:N here until torch initialises CUDA"
                )
        for cuda_index, nvml_index in enumerate(order):
            gpu = state.gpus[nvml_index]
            device = Device("gpu", gpu.name, nvml_index, cuda_index, gpu.uuid)
            if gpu.handle is None:
                notes.append(f"{device.label}: NVML gave no handle; not watched")
                continue
            visible.append((device, gpu))
        if not visible:
            env = os.environ.get("CUDA_VISIBLE_DEVICES")
            reason = (
                f"no GPU visible: CUDA_VISIBLE_DEVICES={env!r} hides every GPU"
                if env is not None
                else "NVML found no usable NVIDIA GPU"
            )
    available = [d for d, _ in visible]
    if wanted is not None:
        by_cuda = {d.cuda_index: (d, g) for d, g in visible}
        missing = [i for i in wanted if i not in by_cuda]
        if missing:
            listing = (
                ", ".join(f"{d.cuda_index} ({d.name})" for d in available) or f"none ({reason})"
            )
            raise ValueError(
                f"unknown GPU index {', '.join(map(str, missing))}: available CUDA indexes are {listing}"
            )
        visible = [by_cuda[i] for i in dict.fromkeys(wanted)]
    return GpuSelection(visible, available, reason, notes, state.module)


class _GpuLost(Exception):
    pass


# Calls with an older equivalent: their failure alone is not worth a note.
_HAS_FALLBACK = ("memory.v2", "clocks_event_reasons", "process.memory.v3")


class GpuReader:
    """Reads every metric of one GPU into a row of the sample block; never raises."""

    def __init__(self, module: Any, device: Device, gpu: PhysicalGpu, pid: int) -> None:
        self._nv = module
        self._handle = gpu.handle
        self.device = device
        self._pid = pid
        self.unsupported: dict[str, str] = {}  # call name -> reason; never asked again
        self.lost: str | None = None
        self.errors = 0  # transient errors so far (values missing for that sample only)
        self.last_error: str | None = None
        self.process_found = False  # whether NVML listed this pid at the last sample
        self.process_listed_any = False  # whether NVML listed any compute process
        self.process_checked = False  # whether the process list was read at the last sample

    def _call(self, name: str, fn_name: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``nvml.<fn_name>``; None when it failed (and remember permanent failures)."""
        if name in self.unsupported:
            return None
        fn = getattr(self._nv, fn_name, None)
        if fn is None:
            self.unsupported[name] = f"{fn_name} missing from this nvidia-ml-py"
            return None
        try:
            return fn(self._handle, *args, **kwargs)
        except Exception as exc:
            code = _error_code(exc)
            # No NVML code: a Python-level failure (a double or an old nvidia-ml-py with another
            # signature, pynvml's NVMLLibraryMismatchError); the same call fails the same way.
            if code is None or code in _PERMANENT:
                self.unsupported[name] = str(exc) or type(exc).__name__
            elif code in _LOST:
                self.lost = f"{self.device.label} lost: {exc}"
                raise _GpuLost from exc
            else:
                self.errors += 1
                self.last_error = f"{fn_name}: {type(exc).__name__}: {exc}"
            return None

    def read(self, row: np.ndarray) -> None:
        self.process_checked = False
        if self.lost is not None:
            return
        try:
            self._read(row)
        except _GpuLost:
            # Values already read this sample stay; the GPU is not asked again (a lost GPU
            # needs a reset and every call would fail, some only after a driver timeout).
            pass

    def _read(self, row: np.ndarray) -> None:
        util = self._call("utilization", "nvmlDeviceGetUtilizationRates")
        if util is not None:
            row[M.UTIL_GPU] = util.gpu
            row[M.UTIL_MEM] = util.memory
        self._read_memory(row)
        temp = self._call(
            "temperature", "nvmlDeviceGetTemperature", getattr(self._nv, "NVML_TEMPERATURE_GPU", 0)
        )
        if temp is not None:
            row[M.TEMPERATURE] = temp
        power = self._call("power.draw", "nvmlDeviceGetPowerUsage")
        if power is not None:
            row[M.POWER_DRAW] = power / 1000.0  # NVML reports milliwatts
        limit = self._call("power.limit", "nvmlDeviceGetPowerManagementLimit")
        if limit is not None:
            row[M.POWER_LIMIT] = limit / 1000.0
        sm = self._call(
            "clocks.sm", "nvmlDeviceGetClockInfo", getattr(self._nv, "NVML_CLOCK_SM", 1)
        )
        if sm is not None:
            row[M.CLOCK_SM] = sm
        mem = self._call(
            "clocks.mem", "nvmlDeviceGetClockInfo", getattr(self._nv, "NVML_CLOCK_MEM", 2)
        )
        if mem is not None:
            row[M.CLOCK_MEM] = mem
        self._read_throttle(row)
        self._read_process(row)

    def _read_memory(self, row: np.ndarray) -> None:
        # nvidia-smi (R510+) reports memory.used without the driver's reserved memory, which
        # only the v2 struct separates; older drivers lack it, so fall back to v1 for good.
        info = None
        version = getattr(self._nv, "nvmlMemory_v2", None)
        if version is not None:
            info = self._call("memory.v2", "nvmlDeviceGetMemoryInfo", version=version)
        if info is None and (version is None or "memory.v2" in self.unsupported):
            # Only when v2 is unsupported for good: a transient v2 failure must not mix the
            # two meanings of "used" in one column.
            info = self._call("memory", "nvmlDeviceGetMemoryInfo")
        if info is not None:
            row[M.MEM_USED] = info.used
            row[M.MEM_TOTAL] = info.total

    def _read_throttle(self, row: np.ndarray) -> None:
        # Renamed "clocks event reasons" in newer drivers; the old name is deprecated but is
        # the only one older drivers have.
        mask = None
        if "clocks_event_reasons" not in self.unsupported:
            mask = self._call("clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons")
        if mask is None and "clocks_event_reasons" in self.unsupported:
            mask = self._call(
                "clocks_throttle_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons"
            )
        if mask is not None:
            row[M.THROTTLE] = float(mask)

    def _read_process(self, row: np.ndarray) -> None:
        procs = None
        if "process.memory.v3" not in self.unsupported:
            procs = self._call("process.memory.v3", "nvmlDeviceGetComputeRunningProcesses")
        if procs is None and "process.memory.v3" in self.unsupported:
            # Drivers older than R510 lack the v3 struct nvidia-ml-py asks for by default.
            procs = self._call("process.memory", "nvmlDeviceGetComputeRunningProcesses_v2")
        if procs is None:
            return
        used = 0.0
        found = False
        for proc in procs:
            if getattr(proc, "pid", None) == self._pid:
                found = True
                mem = getattr(proc, "usedGpuMemory", None)
                # None: NVML cannot attribute memory per process (Windows WDDM).
                used = math.nan if mem is None or math.isnan(used) else used + float(mem)
        self.process_found = found
        self.process_listed_any = bool(procs)
        self.process_checked = True
        row[M.PROC_MEM] = used  # 0 when not listed; the sampler turns it into NaN if it can't tell

    def notes(self) -> list[str]:
        out = [
            f"{self.device.label}: {name} not supported ({why})"
            for name, why in self.unsupported.items()
            if name not in _HAS_FALLBACK
        ]
        if self.lost:
            out.append(self.lost)
        if self.errors:
            out.append(
                f"{self.device.label}: {self.errors} failed NVML call(s), values missing "
                f"for those samples; last: {self.last_error}"
            )
        return out


def cuda_in_use() -> bool:
    """Whether this process has initialised CUDA through PyTorch (never initialises it)."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        return False
