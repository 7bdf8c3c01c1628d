"""What NVML says about each card now, through ``pynvml`` (nvidia-ml-py) alone.

No torch, no CUDA: a CPU-only torch beside an NVIDIA driver still gets its cards read (and
that mismatch is itself a finding). Each value is asked once; one a card cannot give is None
and its reason is kept in ``unreadable`` in words ("not supported on this card": NVML's
``NVMLError_NotSupported``; "needs root": ``NoPermission``; "not in this driver":
``FunctionNotFound`` or a function nvidia-ml-py lacks), so the report names what it could not
read instead of guessing it.

``nvmlInit``/``nvmlShutdown`` are reference-counted by NVML, so the balanced pair here
leaves a sampler that keeps NVML open (``%gpuwatch``) undisturbed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gpumagic.clock_events import ClockEvents, read_clock_events
from gpumagic.environment.check.measurements import LoadSample

# nvml.h return codes, classified by number (stable across drivers).
_NOT_SUPPORTED, _NO_PERMISSION, _FUNCTION_NOT_FOUND = 3, 4, 13
_COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
_SLICE = re.compile(r"(\d+)g\.(\d+)gb", re.IGNORECASE)


@dataclass
class PcieLink:
    """``gen``/``width``: trained now (the generation drops at idle to save power);
    ``gen_max``/``width_max``: the most this card *in this slot* can train to (NVML: "a
    generation 2 device on a generation 1 bus reports 1"); ``gen_card_max``: the card's own."""

    gen: int | None = None
    width: int | None = None
    gen_max: int | None = None
    width_max: int | None = None
    gen_card_max: int | None = None


@dataclass
class Ecc:
    """ECC mode and error counts (volatile: since the driver loaded; aggregate: the card's
    life), retired pages (before Ampere) and remapped rows (Ampere and newer)."""

    enabled: bool | None = None
    pending: bool | None = None
    volatile_corrected: int | None = None
    volatile_uncorrected: int | None = None
    aggregate_corrected: int | None = None
    aggregate_uncorrected: int | None = None
    retired_pages: int | None = None
    retired_pending: bool | None = None
    rows_remapped: int | None = None  # correctable + uncorrectable remaps
    rows_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None


@dataclass
class MigSlice:
    name: str
    uuid: str | None
    memory_total: int | None
    compute_slices: int | None  # the "Ng" of "Ng.XXgb": N of the board's 7 compute slices


@dataclass
class Mig:
    enabled: bool
    pending: bool | None
    slices: list[MigSlice] = field(default_factory=list)


@dataclass
class CardReading:
    """One card as NVML reads it now. Clocks in MHz, power in W, temperatures in °C, memory
    in bytes. ``visible``: CUDA shows it to this process (``CUDA_VISIBLE_DEVICES``)."""

    nvml_index: int
    name: str
    uuid: str | None
    visible: bool = True
    sm_clock: int | None = None
    sm_clock_max: int | None = None
    memory_clock: int | None = None
    memory_clock_max: int | None = None
    clock_events: ClockEvents | None = None
    power_draw: float | None = None
    power_limit: float | None = None  # enforced now
    power_default: float | None = None
    power_min: float | None = None
    power_max: float | None = None
    temperature: int | None = None
    slowdown_temperature: int | None = None
    shutdown_temperature: int | None = None
    pcie: PcieLink = field(default_factory=PcieLink)
    persistence: bool | None = None
    compute_mode: str | None = None
    mig: Mig | None = None
    ecc: Ecc = field(default_factory=Ecc)
    utilization: int | None = None
    memory_used: int | None = None
    memory_total: int | None = None
    other_processes: list[int] | None = None  # compute processes other than this one
    unreadable: dict[str, str] = field(default_factory=dict)


@dataclass
class Readings:
    """Every card NVML lists, or why none could be read (``reason``)."""

    cards: list[CardReading]
    reason: str | None = None
    driver: str | None = None


def read_cards(nvml: Any = None) -> Readings:
    """Read every card NVML lists. ``nvml``: the ``pynvml`` module (imported here when not
    given; tests pass a stand-in)."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return Readings([], "nvidia-ml-py is not installed (pip install nvidia-ml-py)")
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as exc:  # no driver, no library: the one line the report shows
        return Readings([], _init_reason(exc))
    try:
        driver = _text(_quiet(nvml.nvmlSystemGetDriverVersion))
        count = int(nvml.nvmlDeviceGetCount())
        uuids = []
        cards = []
        for i in range(count):
            card = _read_card(nvml, i)
            cards.append(card)
            uuids.append(card.uuid)
        _mark_visible(cards, uuids)
        return Readings(cards, None if cards else "NVML lists no NVIDIA GPU", driver)
    except Exception as exc:
        return Readings([], f"NVML failed: {type(exc).__name__}: {exc}")
    finally:
        _quiet(nvml.nvmlShutdown)


def _init_reason(exc: BaseException) -> str:
    code = getattr(exc, "value", None)
    if code == 12:  # NVML_ERROR_LIBRARY_NOT_FOUND
        return "no NVIDIA driver (libnvidia-ml.so.1 not found)"
    if code == 9:  # NVML_ERROR_DRIVER_NOT_LOADED
        return "the NVIDIA driver is not loaded"
    return f"NVML cannot start: {type(exc).__name__}: {exc}"


def _mark_visible(cards: list[CardReading], uuids: list[str | None]) -> None:
    """Which cards CUDA shows this process, as CUDA_VISIBLE_DEVICES selects them."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return
    shown = set(visible_order(cards, uuids, env))
    for card in cards:
        card.visible = card.nvml_index in shown


def visible_order(cards: list[CardReading], uuids: list[str | None], env: str | None) -> list[int]:
    """NVML indexes of the cards CUDA shows, in CUDA's order (``CUDA_VISIBLE_DEVICES``'s; a
    MIG slice it names shows its board). Without the variable, NVML's order: CUDA's own may
    differ until CUDA starts (FASTEST_FIRST), when the check maps cards by UUID instead."""
    from gpumagic.monitor.devices import parse_visible_devices

    if env is None:
        return [c.nvml_index for c in cards]
    order, _ = parse_visible_devices(env, uuids)
    slices = {_uuid_key(s.uuid): c.nvml_index for c in cards if c.mig for s in c.mig.slices}
    for token in env.split(","):
        board = slices.get(_uuid_key(token.strip()))
        if board is not None and board not in order:
            order.append(board)
    return [cards[i].nvml_index for i in order if i < len(cards)]


def _uuid_key(uuid: str | None) -> str:
    """A UUID as NVML (``GPU-...``, ``MIG-...``) and torch (bare) both write it."""
    u = (uuid or "").strip().lower()
    return u[4:] if u.startswith(("gpu-", "mig-")) else u


def match_uuid(cards: list[CardReading], uuid: str | None) -> CardReading | None:
    """The card (or the board of the MIG slice) whose UUID torch reports as ``uuid``."""
    want = _uuid_key(uuid)
    if not want:
        return None
    for card in cards:
        if _uuid_key(card.uuid) == want or any(
            _uuid_key(s.uuid) == want for s in (card.mig.slices if card.mig else [])
        ):
            return card
    return None


class LoadProbe:
    """NVML held open on one card while a measurement runs: each call reads the clocks,
    power, temperature, clock-event reasons and PCIe link as they are under that load."""

    def __init__(self, nvml: Any, nvml_index: int) -> None:
        nvml.nvmlInit()
        self.nvml = nvml
        try:
            self.handle = nvml.nvmlDeviceGetHandleByIndex(nvml_index)
        except Exception:
            _quiet(nvml.nvmlShutdown)
            raise

    def __call__(self) -> LoadSample:
        nv, h = self.nvml, self.handle
        power = _quiet(lambda: nv.nvmlDeviceGetPowerUsage(h))
        events = _quiet(lambda: read_clock_events(nv, h))
        return LoadSample(
            sm_clock=_quiet(lambda: nv.nvmlDeviceGetClockInfo(h, getattr(nv, "NVML_CLOCK_SM", 1))),
            power_draw=_watts(power),
            temperature=_quiet(lambda: nv.nvmlDeviceGetTemperature(h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))),
            clock_events=events.names if events is not None else None,
            pcie_gen=_quiet(lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h)),
            pcie_width=_quiet(lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h)),
        )

    def close(self) -> None:
        _quiet(self.nvml.nvmlShutdown)


class _Asker:
    """Asks one card, keeping why a value could not be read."""

    def __init__(self, nvml: Any, handle: Any, card: CardReading) -> None:
        self.nvml, self.handle, self.card = nvml, handle, card

    def __call__(self, what: str, fn_name: str, *args: Any, handle: Any = None) -> Any:
        fn = getattr(self.nvml, fn_name, None)
        if fn is None:
            self.card.unreadable[what] = f"not in this nvidia-ml-py ({fn_name})"
            return None
        try:
            return fn(self.handle if handle is None else handle, *args)
        except Exception as exc:
            self.card.unreadable[what] = _why(exc)
            return None

    def const(self, name: str, default: int) -> Any:
        return getattr(self.nvml, name, default)


def _why(exc: BaseException) -> str:
    code = getattr(exc, "value", None)
    if code == _NOT_SUPPORTED:
        return "not supported on this card"
    if code == _NO_PERMISSION:
        return "needs root"
    if code == _FUNCTION_NOT_FOUND:
        return "not in this driver"
    return f"{type(exc).__name__}: {exc}"


def _read_card(nvml: Any, index: int) -> CardReading:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:  # a lost card, or one this process may not open: list the others
        return CardReading(index, "NVIDIA GPU", None, unreadable={"the card": _why(exc)})
    name = _text(_quiet(lambda: nvml.nvmlDeviceGetName(handle))) or "NVIDIA GPU"
    card = CardReading(index, name, _text(_quiet(lambda: nvml.nvmlDeviceGetUUID(handle))))
    ask = _Asker(nvml, handle, card)
    _read_clocks(ask, card)
    _read_power(ask, card)
    _read_temperature(ask, card)
    _read_pcie(ask, card)
    persistence = ask("persistence mode", "nvmlDeviceGetPersistenceMode")
    card.persistence = None if persistence is None else bool(persistence)
    mode = ask("compute mode", "nvmlDeviceGetComputeMode")
    card.compute_mode = None if mode is None else _COMPUTE_MODES.get(int(mode), str(mode))
    card.mig = _read_mig(ask, nvml, handle)
    _read_ecc(ask, card)
    _read_load(ask, card)
    return card


def _read_clocks(ask: _Asker, card: CardReading) -> None:
    sm, mem = ask.const("NVML_CLOCK_SM", 1), ask.const("NVML_CLOCK_MEM", 2)
    card.sm_clock = ask("SM clock", "nvmlDeviceGetClockInfo", sm)
    card.sm_clock_max = ask("maximum SM clock", "nvmlDeviceGetMaxClockInfo", sm)
    card.memory_clock = ask("memory clock", "nvmlDeviceGetClockInfo", mem)
    card.memory_clock_max = ask("maximum memory clock", "nvmlDeviceGetMaxClockInfo", mem)
    try:
        card.clock_events = read_clock_events(ask.nvml, ask.handle)
    except Exception as exc:
        card.unreadable["clock-event reasons"] = _why(exc)


def _watts(milliwatts: Any) -> float | None:
    return None if milliwatts is None else float(milliwatts) / 1000.0


def _read_power(ask: _Asker, card: CardReading) -> None:
    card.power_draw = _watts(ask("power draw", "nvmlDeviceGetPowerUsage"))
    card.power_limit = _watts(ask("enforced power limit", "nvmlDeviceGetEnforcedPowerLimit"))
    card.power_default = _watts(
        ask("default power limit", "nvmlDeviceGetPowerManagementDefaultLimit")
    )
    limits = ask("power limit range", "nvmlDeviceGetPowerManagementLimitConstraints")
    if limits is not None:
        card.power_min, card.power_max = _watts(limits[0]), _watts(limits[1])


def _read_temperature(ask: _Asker, card: CardReading) -> None:
    card.temperature = ask(
        "temperature", "nvmlDeviceGetTemperature", ask.const("NVML_TEMPERATURE_GPU", 0)
    )
    card.slowdown_temperature = ask(
        "slowdown temperature",
        "nvmlDeviceGetTemperatureThreshold",
        ask.const("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1),
    )
    card.shutdown_temperature = ask(
        "shutdown temperature",
        "nvmlDeviceGetTemperatureThreshold",
        ask.const("NVML_TEMPERATURE_THRESHOLD_SHUTDOWN", 0),
    )


def _read_pcie(ask: _Asker, card: CardReading) -> None:
    card.pcie = PcieLink(
        gen=ask("PCIe generation", "nvmlDeviceGetCurrPcieLinkGeneration"),
        width=ask("PCIe width", "nvmlDeviceGetCurrPcieLinkWidth"),
        gen_max=ask("PCIe generation of the slot", "nvmlDeviceGetMaxPcieLinkGeneration"),
        width_max=ask("PCIe width of the slot", "nvmlDeviceGetMaxPcieLinkWidth"),
        gen_card_max=ask("PCIe generation of the card", "nvmlDeviceGetGpuMaxPcieLinkGeneration"),
    )


def _read_mig(ask: _Asker, nvml: Any, handle: Any) -> Mig | None:
    modes = ask("MIG mode", "nvmlDeviceGetMigMode")
    if modes is None:  # NotSupported: a card without MIG, not worth a line
        ask.card.unreadable.pop("MIG mode", None)
        return None
    enabled = modes[0] == ask.const("NVML_DEVICE_MIG_ENABLE", 1)
    mig = Mig(enabled, modes[1] == ask.const("NVML_DEVICE_MIG_ENABLE", 1))
    if not enabled:
        return mig
    count = ask("MIG slices", "nvmlDeviceGetMaxMigDeviceCount") or 0
    for slot in range(int(count)):
        try:
            sub = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except Exception:  # NotFound: an empty slot, or one this container may not see
            continue
        name = _text(_quiet(partial(nvml.nvmlDeviceGetName, sub))) or "MIG slice"
        memory = _quiet(partial(nvml.nvmlDeviceGetMemoryInfo, sub))
        found = _SLICE.search(name)
        mig.slices.append(
            MigSlice(
                name,
                _text(_quiet(partial(nvml.nvmlDeviceGetUUID, sub))),
                int(memory.total) if memory is not None else None,
                int(found.group(1)) if found else None,
            )
        )
    return mig


def _read_ecc(ask: _Asker, card: CardReading) -> None:
    modes = ask("ECC mode", "nvmlDeviceGetEccMode")
    if modes is None:
        return
    e = card.ecc
    e.enabled, e.pending = bool(modes[0]), bool(modes[1])
    if e.enabled:
        corrected = ask.const("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
        uncorrected = ask.const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        volatile, aggregate = ask.const("NVML_VOLATILE_ECC", 0), ask.const("NVML_AGGREGATE_ECC", 1)
        total = "nvmlDeviceGetTotalEccErrors"
        e.volatile_corrected = ask("volatile corrected ECC errors", total, corrected, volatile)
        e.volatile_uncorrected = ask("volatile uncorrected ECC errors", total, uncorrected, volatile)
        e.aggregate_corrected = ask("aggregate corrected ECC errors", total, corrected, aggregate)
        e.aggregate_uncorrected = ask("aggregate uncorrected ECC errors", total, uncorrected, aggregate)
    rows = ask("remapped rows", "nvmlDeviceGetRemappedRows")
    if rows is not None:
        e.rows_remapped = int(rows[0]) + int(rows[1])
        e.rows_uncorrectable = int(rows[1])
        e.remap_pending, e.remap_failed = bool(rows[2]), bool(rows[3])
        card.unreadable.pop("retired pages", None)
        return
    # Before Ampere: page retirement instead of row remapping.
    card.unreadable.pop("remapped rows", None)
    pages = 0
    for cause in (0, 1):  # multiple single-bit errors, a double-bit error
        found = ask("retired pages", "nvmlDeviceGetRetiredPages", cause)
        if found is None:
            return
        pages += len(found)
    e.retired_pages = pages
    pending = ask("pages pending retirement", "nvmlDeviceGetRetiredPagesPendingStatus")
    e.retired_pending = None if pending is None else bool(pending)


def _read_load(ask: _Asker, card: CardReading) -> None:
    util = ask("utilisation", "nvmlDeviceGetUtilizationRates")
    card.utilization = None if util is None else int(util.gpu)
    memory = ask("memory", "nvmlDeviceGetMemoryInfo")
    if memory is not None:
        card.memory_used, card.memory_total = int(memory.used), int(memory.total)
    procs = ask("compute processes", "nvmlDeviceGetComputeRunningProcesses")
    if procs is not None:
        me = os.getpid()
        card.other_processes = sorted({int(p.pid) for p in procs if int(p.pid) != me})


def _quiet(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:
        return None


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
