"""A stand-in for the pynvml functions the watcher calls, for error-handling tests only.

It raises pynvml's own exception classes with NVML's return codes, so the code under test
classifies them exactly as it would real driver errors. Values are whatever a test sets.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pynvml

MIB = 1024 * 1024


def gpu(
    name: str = "Fake GPU", uuid: str = "GPU-00000000-0000-0000-0000-000000000000", **values: Any
) -> dict[str, Any]:
    state: dict[str, Any] = {
        "name": name,
        "uuid": uuid,
        "util": 50,
        "mem_util": 20,
        "mem_used": 1000 * MIB,  # as nvidia-smi and the v2 struct count it
        "mem_reserved": 0,  # the driver's reserved memory: v1's "used" includes it
        "mem_total": 16000 * MIB,
        "temp": 60,
        "power_mw": 150_000,
        "limit_mw": 300_000,
        "sm": 1500,
        "mem_clock": 5000,
        "throttle": 0,
        "procs": [],
        "unsupported": set(),  # names of nvml functions that raise NOT_SUPPORTED
        "missing": set(),  # names that raise FUNCTION_NOT_FOUND (older driver)
        "transient": set(),  # names that raise UNKNOWN on their next call only
        "lost": False,
        # MIG: None (a board without MIG: nvmlDeviceGetMigMode is NOT_SUPPORTED), or the
        # mode and the instances by slot (None for an empty slot), each made by mig()
        "mig_mode": None,
        "mig_slots": [],
    }
    state.update(values)
    return state


def mig(name: str, uuid: str, **values: Any) -> dict[str, Any]:
    """A MIG instance, for ``gpu(mig_mode=1, mig_slots=[mig(...), None, ...])``."""
    return gpu(name, uuid, **values)


class FakeNvml:
    """Board handles are their NVML index; a MIG handle is ``(board, slot)``, as distinct
    from a board's as pynvml's ``c_nvmlDevice_t`` pointers are."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[dict[str, Any]], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.calls: Counter[str] = Counter()
        self.init_error = init_error
        self.handles_asked: list[tuple[str, Any]] = []  # (function, handle) for every call
        self.initialised = 0  # nvmlInit minus nvmlShutdown (NVML's reference count)

    def _state(self, handle: Any) -> dict[str, Any]:
        if isinstance(handle, tuple):
            board, slot = handle
            instance = self.gpus[board]["mig_slots"][slot]
            assert instance is not None, "a handle NVML never gave out"
            return instance
        return self.gpus[handle]

    def _gpu(self, fn: str, handle: Any) -> dict[str, Any]:
        self.calls[fn] += 1
        self.handles_asked.append((fn, handle))
        g = self._state(handle)
        if g["lost"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in g["unsupported"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if fn in g["missing"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if fn in g["transient"]:
            g["transient"].discard(fn)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return g

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.65.06"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 13000

    def nvmlDeviceGetCudaComputeCapability(self, h: Any) -> tuple[int, int]:
        return self._state(h).get("capability", (9, 0))

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        return index

    def nvmlDeviceGetName(self, h: Any) -> str:
        return self._state(h)["name"]

    def nvmlDeviceGetUUID(self, h: Any) -> bytes:
        return self._state(h)["uuid"].encode()  # older nvidia-ml-py returns bytes

    # -- MIG (signatures and error codes as in nvidia-ml-py's pynvml.py) --------------------
    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        g = self._gpu("nvmlDeviceGetMigMode", h)
        if g["mig_mode"] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [g["mig_mode"], g["mig_mode"]]  # [current, pending]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        g = self._gpu("nvmlDeviceGetMaxMigDeviceCount", h)
        if g["mig_mode"] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return len(g["mig_slots"])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, index: int) -> tuple[int, int]:
        g = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if index >= len(g["mig_slots"]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if g["mig_slots"][index] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)  # an empty slot
        return (h, index)

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        g = self._gpu("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=g["util"], memory=g["mem_util"])

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: int | None = None) -> Any:
        g = self._gpu("nvmlDeviceGetMemoryInfo", h)
        free = g["mem_total"] - g["mem_used"] - g["mem_reserved"]
        if not version:  # v1: "used" is everything not free, the driver's reservation too
            return SimpleNamespace(total=g["mem_total"], used=g["mem_total"] - free, free=free)
        return SimpleNamespace(
            total=g["mem_total"], reserved=g["mem_reserved"], used=g["mem_used"], free=free
        )

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return self._gpu("nvmlDeviceGetTemperature", h)["temp"]

    def nvmlDeviceGetTemperatureV(self, h: Any, sensor: int) -> int:
        return self._gpu("nvmlDeviceGetTemperatureV", h)["temp"]

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", h)["power_mw"]

    def nvmlDeviceGetPowerManagementLimit(self, h: Any) -> int:
        return self._gpu("nvmlDeviceGetPowerManagementLimit", h)["limit_mw"]

    def nvmlDeviceGetClockInfo(self, h: Any, kind: int) -> int:
        g = self._gpu("nvmlDeviceGetClockInfo", h)
        return g["sm"] if kind == self.NVML_CLOCK_SM else g["mem_clock"]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", h)["throttle"]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", h)["throttle"]

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        g = self._gpu("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in g["procs"]]

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h: Any) -> list[Any]:
        g = self._gpu("nvmlDeviceGetComputeRunningProcesses_v2", h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in g["procs"]]

    def nvmlDeviceGetPcieThroughput(self, h: Any, counter: int) -> int:  # must never be called
        self.calls["nvmlDeviceGetPcieThroughput"] += 1
        return 0
