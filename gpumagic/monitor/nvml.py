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

from gpumagic.device_kinds import CUDA
from gpumagic.monitor import metrics as M
from gpumagic.monitor.devices import (
    WatchedDevice,
    map_from_torch,
    torch_visible_uuids,
    visible_devices,
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
    """A board NVML lists, or (``mig_index`` set) one MIG instance on board ``nvml_index``."""

    nvml_index: int
    handle: Any
    name: str
    uuid: str | None
    # MIG mode on: the board's instances (each watched instead of the whole board); None
    # when MIG is off or unsupported.
    migs: list[PhysicalGpu] | None = None
    mig_index: int | None = None
    parent: Any = None  # a MIG instance's board handle (temperature, power, clocks)


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
        gpu = PhysicalGpu(index, handle, name, uuid)
        gpu.migs = _mig_instances(module, gpu)
        state.gpus.append(gpu)
    if not state.gpus:
        state.reason = "NVML found no NVIDIA GPU"
    return state


def _mig_instances(module: Any, gpu: PhysicalGpu) -> list[PhysicalGpu] | None:
    """The MIG instances of a board in MIG mode; None when MIG is off.

    In MIG mode the board's own memory counts every tenant's instances and its utilisation
    is NOT_SUPPORTED, so the instances are what is watched: each MIG device handle
    answers for its own memory and processes.
    """
    get_mode = getattr(module, "nvmlDeviceGetMigMode", None)
    if get_mode is None:
        return None
    try:
        current, _pending = get_mode(gpu.handle)
    except Exception:  # NOT_SUPPORTED: a board without MIG
        return None
    if current != getattr(module, "NVML_DEVICE_MIG_ENABLE", 1):
        return None
    try:
        slots = int(module.nvmlDeviceGetMaxMigDeviceCount(gpu.handle))
    except Exception:
        return []
    instances: list[PhysicalGpu] = []
    for slot in range(slots):
        try:
            handle = module.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
        except Exception:  # NOT_FOUND: an empty slot (or one this container may not see)
            continue
        try:
            name = _text(module.nvmlDeviceGetName(handle))
        except Exception:
            name = f"{gpu.name} MIG"
        try:
            uuid: str | None = _text(module.nvmlDeviceGetUUID(handle))
        except Exception:
            uuid = None
        instances.append(
            PhysicalGpu(gpu.nvml_index, handle, name, uuid, mig_index=slot, parent=gpu.handle)
        )
    return instances


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

    gpus: list[tuple[WatchedDevice, PhysicalGpu]]
    available: list[WatchedDevice]  # every visible GPU (for error messages)
    reason: str | None
    notes: list[str]
    module: Any


def gpus_to_watch(wanted: list[int] | None) -> GpuSelection:
    """The GPUs a watcher samples: the visible ones (CUDA order), filtered to the CUDA
    indexes in ``wanted``. (Not :func:`gpumagic.monitor.choose.select_gpus`, which picks the
    least-loaded GPUs of a shared box for the user.)

    A board in MIG mode is watched as its MIG instances. Raises ValueError for an index
    that is not visible, listing the ones that are.
    """
    state = nvml_state()
    notes: list[str] = []
    visible: list[tuple[WatchedDevice, PhysicalGpu]] = []
    reason = state.reason
    if reason is None:
        units, empty_reason = _visible_units(state, notes)
        for cuda_index, gpu in enumerate(units):
            device = WatchedDevice(
                CUDA, gpu.name, gpu.nvml_index, cuda_index, gpu.uuid, gpu.mig_index
            )
            if gpu.handle is None:
                notes.append(f"{device.label}: NVML gave no handle; not watched")
                continue
            visible.append((device, gpu))
        migs = [d for d, _ in visible if d.mig_index is not None]
        if migs:
            notes.append(
                f"{', '.join(d.label for d in migs)}: MIG instance"
                f"{'s' if len(migs) > 1 else ''}; memory is the instance's own, utilisation "
                "is not available per MIG instance (NVML), temperature, power and clocks are "
                "the whole board's"
            )
        if len(migs) > 1:
            notes.append(
                "CUDA enumerates one MIG instance per process (NVIDIA's MIG guide): torch "
                f"sees {migs[0].label} only; the others are shown for their memory"
            )
        if not visible:
            reason = empty_reason
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


def _visible_units(state: _NvmlState, notes: list[str]) -> tuple[list[PhysicalGpu], str]:
    """What CUDA exposes, in CUDA order (boards, or MIG instances in place of a board in MIG
    mode), and the reason to show if that is nothing."""
    boards = [g for g in state.gpus if g.migs is None]
    instances = [m for g in state.gpus for m in (g.migs or [])]
    torch_uuids = torch_visible_uuids()
    if torch_uuids is not None:
        candidates = boards + instances
        order = map_from_torch(torch_uuids, [c.uuid for c in candidates])
        if order is not None:
            return [candidates[i] for i in order], "torch sees no GPU NVML lists"
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = visible_devices(env, [g.uuid for g in state.gpus], [m.uuid for m in instances])
    notes.extend(seen.notes)
    if seen.migs:
        return [instances[i] for i in seen.migs], ""
    units: list[PhysicalGpu] = []
    for index in seen.gpus:
        gpu = state.gpus[index]
        if gpu.migs is None:
            units.append(gpu)
        elif gpu.migs:
            units.extend(gpu.migs)
        else:
            notes.append(f"GPU {index} is in MIG mode with no MIG instance NVML shows here")
    names = {g.name for g in units if g.mig_index is None}
    if len(names) > 1 and os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") != "PCI_BUS_ID":
        notes.append(
            "GPUs of different models and CUDA_DEVICE_ORDER is not PCI_BUS_ID: "
            "cuda:N may not be the GPU shown as cuda:N here until torch initialises CUDA"
        )
    if env is None:
        return units, "NVML found no usable NVIDIA GPU"
    if seen.repeated:
        return units, f"no GPU visible: CUDA_VISIBLE_DEVICES={env!r} repeats an entry, so CUDA exposes none"
    if not env.strip() or env.strip().startswith("-"):
        return units, f"no GPU visible: CUDA_VISIBLE_DEVICES={env!r} hides every GPU"
    return units, f"no GPU visible: CUDA_VISIBLE_DEVICES={env!r} names no device NVML lists here"


class _GpuLost(Exception):
    pass


# Calls with an equivalent tried after them: their failure alone is not worth a note.
_HAS_FALLBACK = ("memory.v2", "clocks_event_reasons", "process.memory.v3")
# Calls with a successor asked only once the call itself is gone from the driver or from
# nvidia-ml-py (FUNCTION_NOT_FOUND, a missing attribute); a NOT_SUPPORTED stays a note.
_SUCCESSOR = {"temperature": "temperature.v"}


class GpuReader:
    """Reads every metric of one GPU into a row of the sample block; never raises."""

    def __init__(self, module: Any, device: WatchedDevice, gpu: PhysicalGpu, pid: int) -> None:
        self._nv = module
        # A MIG instance: memory and processes from its own handle, the board's sensors
        # (temperature, power, clocks) from the board's; utilisation exists for neither.
        self._handle = gpu.parent if gpu.parent is not None else gpu.handle
        self._own = gpu.handle
        self.device = device
        self._pid = pid
        self.unsupported: dict[str, str] = {}  # call name -> reason; never asked again
        self.gone: set[str] = set()  # of those, the calls this driver or nvidia-ml-py lacks
        self.lost: str | None = None
        self.errors = 0  # transient errors so far (values missing for that sample only)
        self.last_error: str | None = None
        self.process_found = False  # whether NVML listed this pid at the last sample
        self.process_listed_any = False  # whether NVML listed any compute process
        self.process_checked = False  # whether the process list was read at the last sample
        if gpu.mig_index is not None:
            self.unsupported["utilization"] = "not available per MIG instance (NVML)"

    def _call(
        self, name: str, fn_name: str, *args: Any, handle: Any = None, **kwargs: Any
    ) -> Any:
        """Call ``nvml.<fn_name>`` on the board (or ``handle``); None when it failed (and
        remember permanent failures)."""
        if name in self.unsupported:
            return None
        fn = getattr(self._nv, fn_name, None)
        if fn is None:
            self.unsupported[name] = f"{fn_name} missing from this nvidia-ml-py"
            self.gone.add(name)
            return None
        try:
            return fn(self._handle if handle is None else handle, *args, **kwargs)
        except Exception as exc:
            code = _error_code(exc)
            # No NVML code: a Python-level failure (a double or an old nvidia-ml-py with another
            # signature, pynvml's NVMLLibraryMismatchError); the same call fails the same way.
            if code is None or code in _PERMANENT:
                self.unsupported[name] = str(exc) or type(exc).__name__
                if code is None or code == ERROR_FUNCTION_NOT_FOUND:
                    self.gone.add(name)
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
        self._read_temperature(row)
        # On Ampere (except GA100) and newer, NVML's power is an average over the last
        # second, not an instant: shorter intervals show the same value again.
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
            info = self._call(
                "memory.v2", "nvmlDeviceGetMemoryInfo", handle=self._own, version=version
            )
        if info is None and (version is None or "memory.v2" in self.unsupported):
            # Only when v2 is unsupported for good: a transient v2 failure must not mix the
            # two meanings of "used" in one column.
            info = self._call("memory", "nvmlDeviceGetMemoryInfo", handle=self._own)
        if info is not None:
            row[M.MEM_USED] = info.used
            row[M.MEM_TOTAL] = info.total

    def _read_temperature(self, row: np.ndarray) -> None:
        # nvmlDeviceGetTemperature is deprecated ("will be removed in CUDA 14.0"); its
        # successor nvmlDeviceGetTemperatureV exists only in newer drivers, so it is asked
        # once the old symbol is gone (FUNCTION_NOT_FOUND) or missing from nvidia-ml-py.
        sensor = getattr(self._nv, "NVML_TEMPERATURE_GPU", 0)
        temp = None
        if "temperature" not in self.unsupported:
            temp = self._call("temperature", "nvmlDeviceGetTemperature", sensor)
        if temp is None and "temperature" in self.gone:
            temp = self._call(_SUCCESSOR["temperature"], "nvmlDeviceGetTemperatureV", sensor)
        if temp is not None:
            row[M.TEMPERATURE] = temp

    def _read_throttle(self, row: np.ndarray) -> None:
        # Renamed "clocks event reasons" in newer drivers; the old name is deprecated but is
        # the only one older drivers have. Not gpumagic.clock_events.read_clock_events (which
        # names the mask the same way): a sampler asks every second, so a call the driver
        # lacks is remembered here and not asked again, where that one-off read retries it.
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
            procs = self._call(
                "process.memory.v3", "nvmlDeviceGetComputeRunningProcesses", handle=self._own
            )
        if procs is None and "process.memory.v3" in self.unsupported:
            # Drivers older than R510 lack the v3 struct nvidia-ml-py asks for by default.
            procs = self._call(
                "process.memory", "nvmlDeviceGetComputeRunningProcesses_v2", handle=self._own
            )
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
            if name not in _HAS_FALLBACK and not (name in _SUCCESSOR and name in self.gone)
        ]
        if self.lost:
            out.append(self.lost)
        if self.errors:
            out.append(
                f"{self.device.label}: {self.errors} failed NVML call(s), values missing "
                f"for those samples; last: {self.last_error}"
            )
        return out


def cuda_devices_in_use() -> set[int]:
    """CUDA indexes on which this process has a CUDA context (never initialises one).

    ``torch.cuda.is_initialized()`` alone is not "using the GPU": ``_lazy_init`` (run by
    ``torch.cuda.current_device()``, ``get_device_properties()``, ...) creates no context
    (pytorch#99533), so NVML does not list the process and its GPU memory is really 0.
    A context exists once torch allocated memory or launched work on the
    device; ``torch._C._cuda_hasPrimaryContext`` asks the driver directly where this build
    has it, and memory the caching allocator reserves is the sign everywhere else.
    """
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return set()
        count = int(torch.cuda.device_count())
        has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
        if has_context is not None:
            return {i for i in range(count) if has_context(i)}
        nested = torch.cuda.memory_stats_as_nested_dict
        return {
            i
            for i in range(count)
            if nested(i).get("reserved_bytes", {}).get("all", {}).get("current", 0) > 0
        }
    except Exception:
        return set()


def cuda_in_use() -> bool:
    """Whether this process holds a CUDA context on any GPU (never initialises CUDA)."""
    return bool(cuda_devices_in_use())
