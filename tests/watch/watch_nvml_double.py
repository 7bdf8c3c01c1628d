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
        "mem_used": 1000 * MIB,
        "mem_total": 16000 * MIB,
        "temp": 60,
        "power_mw": 150_000,
        "limit_mw": 300_000,
        "sm": 1500,
        "mem_clock": 5000,
        "throttle": 0,
        "procs": [],
        "energy_mj": 0,  # nvmlDeviceGetTotalEnergyConsumption: a counter a test advances
        "mig": 0,  # nvmlDeviceGetMigMode's current mode
        "unsupported": set(),  # names of nvml functions that raise NOT_SUPPORTED
        "missing": set(),  # names that raise FUNCTION_NOT_FOUND (older driver)
        "transient": set(),  # names that raise UNKNOWN on their next call only
        "lost": False,
    }
    state.update(values)
    return state


class FakeNvml:
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[dict[str, Any]], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.calls: Counter[str] = Counter()
        self.init_error = init_error

    def _gpu(self, fn: str, handle: int) -> dict[str, Any]:
        self.calls[fn] += 1
        g = self.gpus[handle]
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

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        return index

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.gpus[h]["name"]

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return self.gpus[h]["uuid"].encode()  # older nvidia-ml-py returns bytes

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        g = self._gpu("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=g["util"], memory=g["mem_util"])

    def nvmlDeviceGetMemoryInfo(self, h: int, version: int | None = None) -> Any:
        g = self._gpu("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(
            total=g["mem_total"], used=g["mem_used"], free=g["mem_total"] - g["mem_used"]
        )

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self._gpu("nvmlDeviceGetTemperature", h)["temp"]

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", h)["power_mw"]

    def nvmlDeviceGetPowerManagementLimit(self, h: int) -> int:
        return self._gpu("nvmlDeviceGetPowerManagementLimit", h)["limit_mw"]

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        g = self._gpu("nvmlDeviceGetClockInfo", h)
        return g["sm"] if kind == self.NVML_CLOCK_SM else g["mem_clock"]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", h)["throttle"]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", h)["throttle"]

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        g = self._gpu("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in g["procs"]]

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h: int) -> list[Any]:
        g = self._gpu("nvmlDeviceGetComputeRunningProcesses_v2", h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in g["procs"]]

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return int(self._gpu("nvmlDeviceGetTotalEnergyConsumption", h)["energy_mj"])

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        g = self._gpu("nvmlDeviceGetMigMode", h)
        return (g["mig"], g["mig"])

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:  # must never be called
        self.calls["nvmlDeviceGetPcieThroughput"] += 1
        return 0
