"""A stand-in for ``pynvml`` (nvidia-ml-py) that answers as the real module does, from a
recorded card state: the same function names and signatures, the real module's constants,
and its error classes raised with NVML's return codes (``pynvml.NVMLError(code)`` builds the
generated subclass, ``NVMLError_NotSupported`` for a card that lacks a reading). Tests only.

A state is a dict (``tests/check/card_states.py``): every reading as the real call returns
it (milliwatts, MHz, °C, bytes, NVML's enum values), ``unsupported``: the functions this card
answers ``NotSupported``, ``no_permission``: the ones it refuses without root. A function
the state does not hold is not supported, as a card that lacks it would say.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pynvml

# The real module's constants and error classes, so code under test reads the same values.
_PASSED_THROUGH = ("NVML", "NVMLError", "nvmlMemory_v2", "nvmlClocks")


class NvmlDouble:
    """Handles are the card's NVML index; a MIG slice's handle is ``(board, slot)``."""

    def __init__(self, cards: list[dict[str, Any]], driver: str = "570.124.06") -> None:
        self.cards = cards
        self.driver = driver
        self.calls: Counter[str] = Counter()
        self.open = 0  # nvmlInit minus nvmlShutdown: NVML's reference count

    def __getattr__(self, name: str) -> Any:
        if name.startswith(_PASSED_THROUGH):
            return getattr(pynvml, name)
        raise AttributeError(name)  # a function this nvidia-ml-py would lack

    # -- plumbing ------------------------------------------------------------------------------
    def _card(self, fn: str, handle: Any) -> dict[str, Any]:
        self.calls[fn] += 1
        assert self.open > 0, f"{fn} called without nvmlInit"
        if isinstance(handle, tuple):
            board, slot = handle
            state = self.cards[board]["mig_slices"][slot]
        else:
            state = self.cards[handle]
        if fn in state.get("unsupported", ()):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if fn in state.get("no_permission", ()):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        return state

    def _value(self, fn: str, handle: Any, key: str) -> Any:
        state = self._card(fn, handle)
        if key not in state:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return state[key]

    # -- the library -------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.open += 1

    def nvmlShutdown(self) -> None:
        assert self.open > 0, "nvmlShutdown without nvmlInit"
        self.open -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 12080

    def nvmlDeviceGetCount(self) -> int:
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index >= len(self.cards):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return index

    def nvmlDeviceGetName(self, h: Any) -> str:
        return self._card("nvmlDeviceGetName", h)["name"]

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return self._card("nvmlDeviceGetUUID", h)["uuid"]

    def nvmlDeviceGetCudaComputeCapability(self, h: Any) -> tuple[int, int]:
        return self._value("nvmlDeviceGetCudaComputeCapability", h, "capability")

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: int | None = None) -> Any:
        state = self._card("nvmlDeviceGetMemoryInfo", h)
        total, used = state["memory_total"], state.get("memory_used", 0)
        return SimpleNamespace(total=total, used=used, free=total - used, reserved=0)

    # clocks
    def nvmlDeviceGetClockInfo(self, h: Any, kind: int) -> int:
        key = "sm_clock" if kind == pynvml.NVML_CLOCK_SM else "memory_clock"
        return self._value("nvmlDeviceGetClockInfo", h, key)

    def nvmlDeviceGetMaxClockInfo(self, h: Any, kind: int) -> int:
        key = "sm_clock_max" if kind == pynvml.NVML_CLOCK_SM else "memory_clock_max"
        return self._value("nvmlDeviceGetMaxClockInfo", h, key)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self._value("nvmlDeviceGetCurrentClocksEventReasons", h, "clock_events")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Any) -> int:
        return self._value("nvmlDeviceGetCurrentClocksThrottleReasons", h, "clock_events")

    # power
    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return self._value("nvmlDeviceGetPowerUsage", h, "power_draw_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Any) -> int:
        return self._value("nvmlDeviceGetEnforcedPowerLimit", h, "power_limit_mw")

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: Any) -> int:
        return self._value("nvmlDeviceGetPowerManagementDefaultLimit", h, "power_default_mw")

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: Any) -> list[int]:
        return list(self._value("nvmlDeviceGetPowerManagementLimitConstraints", h, "power_range_mw"))

    # temperature
    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return self._value("nvmlDeviceGetTemperature", h, "temperature")

    def nvmlDeviceGetTemperatureThreshold(self, h: Any, threshold: int) -> int:
        key = {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "slowdown_temperature",
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "shutdown_temperature",
        }[threshold]
        return self._value("nvmlDeviceGetTemperatureThreshold", h, key)

    # PCIe
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Any) -> int:
        return self._value("nvmlDeviceGetCurrPcieLinkGeneration", h, "pcie_gen")

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Any) -> int:
        return self._value("nvmlDeviceGetCurrPcieLinkWidth", h, "pcie_width")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: Any) -> int:
        return self._value("nvmlDeviceGetMaxPcieLinkGeneration", h, "pcie_gen_max")

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: Any) -> int:
        return self._value("nvmlDeviceGetMaxPcieLinkWidth", h, "pcie_width_max")

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, h: Any) -> int:
        return self._value("nvmlDeviceGetGpuMaxPcieLinkGeneration", h, "pcie_gen_card_max")

    # modes
    def nvmlDeviceGetPersistenceMode(self, h: Any) -> int:
        return self._value("nvmlDeviceGetPersistenceMode", h, "persistence")

    def nvmlDeviceGetComputeMode(self, h: Any) -> int:
        return self._value("nvmlDeviceGetComputeMode", h, "compute_mode")

    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        return list(self._value("nvmlDeviceGetMigMode", h, "mig_mode"))  # [current, pending]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        self._value("nvmlDeviceGetMaxMigDeviceCount", h, "mig_mode")
        return len(self.cards[h]["mig_slices"])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, index: int) -> tuple[int, int]:
        self._card("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if self.cards[h]["mig_slices"][index] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)  # an empty slot
        return (h, index)

    # ECC and the memory's health
    def nvmlDeviceGetEccMode(self, h: Any) -> list[int]:
        return list(self._value("nvmlDeviceGetEccMode", h, "ecc_mode"))  # [current, pending]

    def nvmlDeviceGetTotalEccErrors(self, h: Any, error_type: int, counter: int) -> int:
        kind = "corrected" if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else "uncorrected"
        when = "volatile" if counter == pynvml.NVML_VOLATILE_ECC else "aggregate"
        return self._value("nvmlDeviceGetTotalEccErrors", h, "ecc_errors")[f"{when}_{kind}"]

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
        return tuple(self._value("nvmlDeviceGetRemappedRows", h, "remapped_rows"))  # type: ignore[return-value]

    def nvmlDeviceGetRetiredPages(self, h: Any, cause: int) -> list[int]:
        return list(self._value("nvmlDeviceGetRetiredPages", h, "retired_pages")[cause])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Any) -> int:
        return self._value("nvmlDeviceGetRetiredPagesPendingStatus", h, "retired_pending")

    # load
    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        state = self._card("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=state.get("utilization", 0), memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        state = self._card("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in state.get("processes", [])]
