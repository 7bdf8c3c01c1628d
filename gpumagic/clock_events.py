"""Why a GPU's clocks are below their maximum: NVML's clock-event reasons, read and named.

NVML reports the reasons as a bit mask (``nvmlDeviceGetCurrentClocksEventReasons``; the same
bits under the older name ``nvmlDeviceGetCurrentClocksThrottleReasons``, deprecated since
R535 and the only one older drivers have). The names are nvidia-smi's
``clocks_event_reasons.<name>`` query fields; the meanings follow nvml.h's
``nvmlClocksEventReasons`` group. A bottom module, so that ``%gpucheck`` (environment core)
and ``%gpuwatch`` (monitor core) read and name them the same way.

Idle, sync boost, application and display clocks are the card doing what it was told; the
power cap at the *default* limit under full load is the card working as designed (it runs
as fast as its rated power allows). The others slow a card below what it can do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# nvml.h: NVML_ERROR_FUNCTION_NOT_FOUND, what a driver without a symbol answers.
_FUNCTION_NOT_FOUND = 13


@dataclass(frozen=True)
class Reason:
    bit: int
    name: str  # nvidia-smi's field name
    meaning: str  # what it says about the card, in a sentence's words
    slows: bool  # whether it holds the clocks below what the card can do
    label: str  # a table's few words for it ("power cap")
    held: str  # what it did to a card while it was active, after "GPU 0 was ..." (the table
    # of a watch's cells names which of two reasons with the same words it was)


REASONS: tuple[Reason, ...] = (
    Reason(0x1, "gpu_idle", "nothing runs on the GPU and its clocks drop to idle", False,
           "idle", "idle"),
    Reason(0x2, "applications_clocks_setting", "clocks are held at the applications clocks someone set", True,
           "applications clocks", "held at the applications clocks someone set"),
    Reason(0x4, "sw_power_cap", "the driver lowers clocks to stay within the power limit", True,
           "power cap", "held by its power cap"),
    Reason(0x8, "hw_slowdown", "the hardware halves the clocks or more (heat, a power brake, or a power surge)", True,
           "HW slowdown", "slowed to half its clocks or less by its hardware"),
    Reason(0x10, "sync_boost", "the card holds its clocks to those of its sync-boost group", False,
           "sync boost", "held to the clocks of its sync-boost group"),
    Reason(0x20, "sw_thermal_slowdown", "the driver lowers clocks because the GPU or its memory runs too hot", True,
           "thermal (driver)", "slowed by heat"),
    Reason(0x40, "hw_thermal_slowdown", "the hardware halves the clocks or more because the card is too hot", True,
           "thermal (HW)", "slowed by heat"),
    Reason(0x80, "hw_power_brake_slowdown", "an external power brake (the power supply or the system) halves the clocks or more", True,
           "power brake", "held by an external power brake"),
    Reason(0x100, "display_clock_setting", "clocks follow the display's clock setting", False,
           "display clocks", "held at the display's clock setting"),
    Reason(0x200, "board_limit", "a limit of the board holds the clocks down", True,
           "board limit", "held by a limit of its board"),
    Reason(0x400, "reliability", "the driver holds clocks down to protect the card's reliability", True,
           "reliability", "held down by the driver to protect its reliability"),
)  # fmt: skip
BY_NAME = {r.name: r for r in REASONS}
THERMAL = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown"})
POWER = frozenset({"sw_power_cap", "hw_power_brake_slowdown"})


@dataclass(frozen=True)
class ClockEvents:
    """The reasons active at one reading: the raw mask and nvidia-smi's names for its bits
    (an unknown bit as ``unknown_0x...``)."""

    mask: int
    names: tuple[str, ...]

    @property
    def slowing(self) -> tuple[str, ...]:
        """The active reasons that hold the clocks below what the card can do."""
        return tuple(n for n in self.names if n not in BY_NAME or BY_NAME[n].slows)

    @property
    def thermal(self) -> bool:
        return bool(THERMAL.intersection(self.names))


def name_reasons(mask: int) -> ClockEvents:
    """The named reasons of a clock-event bit mask."""
    names = [r.name for r in REASONS if mask & r.bit]
    known = 0
    for r in REASONS:
        known |= r.bit
    if mask & ~known:
        names.append(f"unknown_0x{mask & ~known:x}")
    return ClockEvents(int(mask), tuple(names))


def read_clock_events(nvml: Any, handle: Any) -> ClockEvents:
    """The clock-event reasons active on ``handle`` now, named. ``nvml`` is the ``pynvml``
    module (or a stand-in answering the same); the renamed function first, the deprecated one
    where the driver or nvidia-ml-py lacks it. Raises what NVML raises otherwise
    (``NVMLError_NotSupported`` on a card that does not report them)."""
    new = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if new is not None:
        try:
            return name_reasons(int(new(handle)))
        except Exception as exc:
            if getattr(exc, "value", None) != _FUNCTION_NOT_FOUND:
                raise
    return name_reasons(int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)))
