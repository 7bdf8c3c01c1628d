"""The rules of ``%gpucheck``: each reading or measurement judged against the card's defaults
and specification, and what it costs, named with its cause, its evidence and its fix.

Each rule here is a function of one card's :class:`~gpumagic.environment.check.facts.CardCheck`
returning findings (the host's rules are in :mod:`gpumagic.environment.check.judge`, which
runs them all); :func:`rank` orders the result: errors (the GPU cannot do its work as intended) before warnings (it runs slower than
it should) before notes, and within a level by ``cost``, the share of speed the finding may
take (a power limit of half the default: up to half the clocks). A cost is an upper bound
read from the evidence, never a prediction of a model's step time.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from gpumagic.card_specs import pcie_bandwidth
from gpumagic.clock_events import BY_NAME, THERMAL
from gpumagic.environment.check.facts import CardCheck
from gpumagic.units import fmt_bytes, fmt_celsius, fmt_flops, fmt_gbps, fmt_mhz, fmt_watts

LEVELS = {"error": 0, "warning": 1, "info": 2}
# Below these shares of its specification a figure is worth a finding of its own, when no
# reading explains it (cuBLAS reaches 70-90% of a datasheet's dense peak on large matmuls; a
# copy 80-90% of the memory's and the link's).
BELOW_SPEC = {"fp32": 0.5, "tf32": 0.5, "bf16": 0.5, "fp16": 0.5, "memory": 0.6, "h2d_pinned": 0.5}
# The temperature margin to the slowdown threshold that is worth a note.
HOT_MARGIN_C = 5
# Utilisation at rest (nothing of this kernel's running) that means someone else computes.
BUSY_PERCENT = 20


@dataclass(frozen=True)
class CheckFinding:
    """One problem: ``title`` in a line; ``cause`` what it does to the work; ``evidence``
    the readings and figures that show it; ``fix`` what to do; ``cost`` the share of speed
    it may take (0-1, None when it costs none or cannot be put as one number) and
    ``cost_of`` what that share is of (the clocks, host-device copies, CPU ops)."""

    code: str
    level: str
    device: str
    title: str
    cause: str
    evidence: str
    fix: str
    cost: float | None = None
    cost_of: str = "the card's speed"


def rank(found: list[CheckFinding]) -> list[CheckFinding]:
    return sorted(found, key=lambda f: (LEVELS.get(f.level, 3), -(f.cost or 0.0)))


def _clock(card: CardCheck) -> tuple[int | None, int | None, str]:
    """The SM clock to judge (under load when it was measured, else now), the maximum, and
    how to say it: a card at rest runs at idle clocks, which say nothing, so the clock is
    quoted only under load or while a reason slows it."""
    r = card.reading
    loaded = bool(card.load and card.load.sm_clock)
    now = card.load.sm_clock if card.load and card.load.sm_clock else r.sm_clock
    slowed = bool(r.clock_events and r.clock_events.slowing)
    if now is None or not r.sm_clock_max or not (loaded or slowed):
        return now, r.sm_clock_max, ""
    when = "under load" if loaded else "at the reading"
    return now, r.sm_clock_max, f"SM clock {fmt_mhz(now)} of {fmt_mhz(r.sm_clock_max)} {when}"


def _events(card: CardCheck) -> set[str]:
    names = set(card.reading.clock_events.names) if card.reading.clock_events else set()
    if card.load and card.load.clock_events:
        names |= set(card.load.clock_events)
    return names


def _share_lost(now: int | None, top: int | None) -> float | None:
    return max(0.0, 1 - now / top) if now and top else None


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


# --- the card -------------------------------------------------------------------------------------


def power_capped(card: CardCheck) -> list[CheckFinding]:
    r = card.reading
    if r.power_limit is None or r.power_default is None or r.power_limit >= 0.95 * r.power_default:
        return []
    clock = _clock(card)[2]
    held = " (sw_power_cap active)" if "sw_power_cap" in _events(card) else ""
    span = (
        f" (allowed {fmt_watts(r.power_min)}–{fmt_watts(r.power_max)})"
        if r.power_min is not None and r.power_max is not None
        else ""
    )
    draw = card.load.power_draw if card.load and card.load.power_draw else r.power_draw
    return [
        CheckFinding(
            "power-capped", "warning", card.label,
            f"power limit {fmt_watts(r.power_limit)} of a default {fmt_watts(r.power_default)}",
            "the driver holds the clocks down to stay under the lower limit whenever the card "
            "works hard, so every kernel runs slower than the card can",
            _join(
                f"enforced limit {fmt_watts(r.power_limit)}, default {fmt_watts(r.power_default)}{span}",
                f"drawing {fmt_watts(draw)}" if draw is not None else "",
                clock + held,
            ),
            f"`sudo nvidia-smi -i {r.nvml_index} -pl {r.power_default:.0f}` as root (it lasts "
            "until a reboot or a driver reload), or ask your admin why it was lowered",
            1 - r.power_limit / r.power_default, "the clocks under load",
        )
    ]  # fmt: skip


def thermal(card: CardCheck) -> list[CheckFinding]:
    r = card.reading
    events = _events(card)
    hot = events & (THERMAL | {"hw_slowdown"})
    temp = card.load.temperature if card.load and card.load.temperature else r.temperature
    near = (
        temp is not None
        and r.slowdown_temperature is not None
        and temp >= r.slowdown_temperature - HOT_MARGIN_C
    )
    if not hot and not near:
        return []
    now, top, clock = _clock(card)
    level = "warning" if hot else "info"
    named = ", ".join(sorted(hot)) or "none yet"
    return [
        CheckFinding(
            "thermal", level, card.label,
            f"{fmt_celsius(temp)}, slowdown at {fmt_celsius(r.slowdown_temperature)}"
            + (f": clocks held down ({named})" if hot else ": close to slowing down"),
            "the card lowers its clocks to cool down (hardware slowdowns halve them or more), so "
            "its speed depends on how hot it runs rather than on the work",
            _join(
                f"temperature {fmt_celsius(temp)}, slowdown threshold "
                f"{fmt_celsius(r.slowdown_temperature)}", clock, f"clock-event reasons: {named}",
            ),
            "cool the card: check that its fans spin and its intake is clear (dust, a closed "
            "case, cards packed side by side), or lower the power limit a little "
            f"(`sudo nvidia-smi -i {r.nvml_index} -pl WATTS`), which costs less speed than "
            "throttling; in a data centre, report the node",
            _share_lost(now, top) if hot else None, "the clocks",
        )
    ]  # fmt: skip


def power_brake(card: CardCheck) -> list[CheckFinding]:
    if "hw_power_brake_slowdown" not in _events(card):
        return []
    now, top, clock = _clock(card)
    return [
        CheckFinding(
            "power-brake", "error", card.label, "the power supply holds the card's brake",
            BY_NAME["hw_power_brake_slowdown"].meaning + ": the card runs at half speed or less",
            _join("clock-event reason hw_power_brake_slowdown active", clock),
            "check the power supply and the card's power cables (every connector seated, no "
            "adapter splitting one cable); in a server, report the node",
            _share_lost(now, top) or 0.5, "the clocks",
        )
    ]  # fmt: skip


def clocks_held(card: CardCheck) -> list[CheckFinding]:
    if "applications_clocks_setting" not in _events(card):
        return []
    now, top, clock = _clock(card)
    r = card.reading
    return [
        CheckFinding(
            "clocks-held", "warning", card.label, "clocks are held at a set value",
            BY_NAME["applications_clocks_setting"].meaning + ", below what the card could run",
            _join("clock-event reason applications_clocks_setting active", clock),
            f"`sudo nvidia-smi -i {r.nvml_index} -rac` and `-rgc` reset the applications and "
            "locked clocks, or ask whoever set them",
            _share_lost(now, top), "the clocks",
        )
    ]  # fmt: skip


def pcie_link(card: CardCheck) -> list[CheckFinding]:
    p = card.reading.pcie
    want_gen = p.gen_card_max or (int(card.specs.pcie_gen.value) if card.specs and card.specs.pcie_gen else None)
    want_width = int(card.specs.pcie_width.value) if card.specs and card.specs.pcie_width else None
    problems = []
    if p.gen_max and want_gen and p.gen_max < want_gen:
        problems.append(f"the slot allows Gen {p.gen_max}, the card does Gen {want_gen}")
    if p.width_max and want_width and p.width_max < want_width:
        problems.append(f"the slot gives x{p.width_max} of the card's x{want_width}")
    width = card.link_load.pcie_width if card.link_load and card.link_load.pcie_width else p.width
    if width and p.width_max and width < p.width_max:
        problems.append(f"the link trained at x{width} where x{p.width_max} is possible")
    loaded_gen = card.link_load.pcie_gen if card.link_load else None
    if loaded_gen and p.gen_max and loaded_gen < p.gen_max:
        problems.append(f"under a copy the link stayed at Gen {loaded_gen} of Gen {p.gen_max}")
    if not problems:
        return []
    gen_now = loaded_gen or p.gen_max or 0
    width_now = width or p.width_max or 0
    full = pcie_bandwidth(want_gen or gen_now, want_width or p.width_max or width_now)
    have = pcie_bandwidth(min(gen_now, p.gen_max or gen_now), width_now)
    pinned = card.measured("h2d_pinned")
    return [
        CheckFinding(
            "pcie-link", "warning", card.label,
            f"PCIe link Gen {gen_now} x{width_now} ({fmt_gbps(have / 1e9)}) where the card does "
            f"Gen {want_gen or '?'} x{want_width or '?'} ({fmt_gbps(full / 1e9)})",
            "every copy between host and GPU (each batch, each .to(device), each .item()) runs "
            "at the narrower link's speed",
            _join(*problems, f"pinned host-to-device copy measured {fmt_gbps(pinned.value / 1e9)}" if pinned else ""),
            "seat the card in a x16 slot wired to the CPU (the board manual's lane table: a "
            "second x16 slot often runs x8 or x4 through the chipset); a riser cable or an "
            "M.2 adapter gives x4; set the slot to its full generation (or Auto) in the BIOS",
            1 - have / full if full else None, "host-device copies",
        )
    ]  # fmt: skip


def persistence(card: CardCheck) -> list[CheckFinding]:
    if card.reading.persistence is not False or not sys.platform.startswith("linux"):
        return []
    return [
        CheckFinding(
            "persistence-off", "info", card.label, "persistence mode is off",
            "when no process holds the card, the driver tears its state down, and the next "
            "process that starts CUDA waits for it to be set up again (a second or more on "
            "large cards), every time",
            "nvmlDeviceGetPersistenceMode: disabled",
            f"`sudo nvidia-smi -i {card.reading.nvml_index} -pm 1`, or run NVIDIA's "
            "nvidia-persistenced service (what data-centre images do)",
        )
    ]  # fmt: skip


def mig_slice(card: CardCheck) -> list[CheckFinding]:
    mig = card.reading.mig
    if mig is None or not mig.enabled:
        return []
    slices = mig.slices
    first = slices[0] if slices else None
    share = first.compute_slices / 7 if first and first.compute_slices else None
    listed = ", ".join(f"{s.name} ({fmt_bytes(s.memory_total)})" for s in slices) or "none visible here"
    return [
        CheckFinding(
            "mig-slice", "warning", card.label,
            f"MIG mode: {first.name if first else 'a slice'} of the {card.reading.name}",
            "the card is cut into MIG slices and a process gets one of them: a fraction of "
            "its SMs, memory and bandwidth, not the card its datasheet describes",
            _join(f"slices: {listed}", f"the first holds {first.compute_slices} of 7 compute slices" if first and first.compute_slices else ""),
            "compare the slice with its share of the card, not with the whole card; for the "
            f"whole card, ask your admin to turn MIG off (`nvidia-smi -i {card.reading.nvml_index} "
            "-mig 0`, then a GPU reset) or for a larger slice",
            1 - share if share is not None else None, "the whole card",
        )
    ]  # fmt: skip


def ecc(card: CardCheck) -> list[CheckFinding]:
    e, i = card.reading.ecc, card.reading.nvml_index
    found = []
    bad = [
        f"{n} {what}"
        for n, what in (
            (e.volatile_uncorrected, "uncorrectable errors since the driver loaded"),
            (e.aggregate_uncorrected, "uncorrectable errors in the card's life"),
        )
        if n
    ]
    if e.remap_failed:
        bad.append("a row remap failed: the memory has no spare rows left")
    if bad:
        found.append(CheckFinding(
            "ecc-errors", "error", card.label, "uncorrectable memory errors",
            "an uncorrectable error kills the process that touched the memory (CUDA error: "
            "uncorrectable ECC error encountered), and a card that keeps making them is failing",
            _join(*bad, f"{e.rows_remapped} rows remapped" if e.rows_remapped else ""),
            f"reset the card (`sudo nvidia-smi -r -i {i}`, with no process on it); if the errors "
            "come back or a remap failed, the card needs replacing: tell your provider or admin",
        ))  # fmt: skip
    pending = e.remap_pending or e.retired_pending
    if pending:
        what = "rows waiting to be remapped" if e.remap_pending else "pages waiting to be retired"
        found.append(CheckFinding(
            "ecc-pending", "warning", card.label, f"memory {what}",
            "bad memory was found and will be fenced off at the next reset; until then the "
            "bad rows stay in use",
            _join(what, f"{e.rows_remapped} rows remapped so far" if e.rows_remapped else "",
                  f"{e.retired_pages} pages retired so far" if e.retired_pages else ""),
            f"reset the card when it is idle (`sudo nvidia-smi -r -i {i}`) or reboot",
        ))  # fmt: skip
    if e.enabled is not None and e.pending is not None and e.pending != e.enabled:
        found.append(CheckFinding(
            "ecc-mode-pending", "info", card.label,
            f"ECC turns {'on' if e.pending else 'off'} at the next reset",
            "a changed ECC mode applies only after a reset or reboot",
            f"ECC now {'on' if e.enabled else 'off'}, pending {'on' if e.pending else 'off'}",
            "reset the card or reboot to apply it, or set it back",
        ))  # fmt: skip
    return found


def compute_mode(card: CardCheck) -> list[CheckFinding]:
    r = card.reading
    if r.compute_mode == "Prohibited":
        return [CheckFinding(
            "compute-prohibited", "error", card.label, "compute mode Prohibited",
            "no process may start CUDA work on this card",
            "nvmlDeviceGetComputeMode: Prohibited",
            f"`sudo nvidia-smi -i {r.nvml_index} -c DEFAULT`, or ask your admin", 1.0, "the GPU's work",
        )]  # fmt: skip
    if r.compute_mode == "Exclusive_Process" and r.other_processes:
        return [CheckFinding(
            "compute-exclusive", "warning", card.label, "compute mode Exclusive_Process, with a process on the card",
            "one process at a time may use the card: while another holds it, this one cannot "
            "start CUDA there (in a container the process NVML lists may be this kernel)",
            f"compute mode Exclusive_Process; compute processes NVML lists: {', '.join(map(str, r.other_processes))}",
            "stop the other process, choose another card (%gpuselect), or ask for DEFAULT mode", 1.0, "the GPU's work",
        )]  # fmt: skip
    return []


def busy(card: CardCheck) -> list[CheckFinding]:
    """Someone computes on the card at rest (before the measurements). Utilisation decides,
    not the process list: NVML lists host PIDs, so inside a container this kernel's own
    context is one of the "other" processes (NVIDIA/nvidia-docker#179)."""
    r = card.reading
    if (r.utilization or 0) < BUSY_PERCENT:
        return []
    others = r.other_processes or []
    return [
        CheckFinding(
            "gpu-busy", "warning", card.label,
            f"another process uses this card ({r.utilization}% busy before the measurements)",
            "work on a shared card runs in turns with the other processes', and the figures "
            "measured here are shared with them too",
            _join(f"utilisation {r.utilization}% while this kernel ran nothing on it",
                  f"compute processes NVML lists: {', '.join(map(str, others))}" if others else "",
                  f"memory used {fmt_bytes(r.memory_used)} of {fmt_bytes(r.memory_total)}"),
            "wait for the other work to end, or choose an idle card (%gpuselect, before CUDA starts)",
            (r.utilization or 0) / 100, "the card's time",
        )
    ]  # fmt: skip


def below_spec(card: CardCheck) -> list[CheckFinding]:
    """A figure well under the specification that no reading explains."""
    explained = {f.code for rule in (power_capped, thermal, power_brake, clocks_held, mig_slice, busy) for f in rule(card)}
    link = bool(pcie_link(card))
    found = []
    for m in card.measurements:
        floor = BELOW_SPEC.get(m.key)
        ratio = m.ratio
        if floor is None or ratio is None or ratio >= floor:
            continue
        if (explained and m.key != "h2d_pinned") or (link and m.key == "h2d_pinned"):
            continue
        show = fmt_flops if m.unit == "FLOP/s" else (lambda v: fmt_gbps(v / 1e9))
        found.append(CheckFinding(
            f"slow-{m.key}", "warning", card.label,
            f"{m.name} at {ratio:.0%} of the card's specification",
            "the card does less than its datasheet says with no clock, power, heat or link "
            "reading to explain it",
            f"measured {show(m.value)} ({m.size}), specification {show(m.spec)} ({m.spec_source})",
            "run %gpucheck again on an idle card; if it stays low, compare with `nvidia-smi -q "
            "-d PERFORMANCE,CLOCK` under load and ask your provider",
            1 - ratio, m.name,
        ))  # fmt: skip
    return found


def pinned_copies(card: CardCheck) -> list[CheckFinding]:
    pinned, pageable = card.measured("h2d_pinned"), card.measured("h2d_pageable")
    if pinned is None or pageable is None or pinned.value < 1.5 * pageable.value:
        return []
    return [
        CheckFinding(
            "pageable-copies", "info", card.label,
            f"pinned copies run {pinned.value / pageable.value:.1f}× faster than pageable ones",
            "a copy from ordinary (pageable) memory goes through a staging buffer and blocks the "
            "host; from pinned memory it runs at the link's speed and can overlap compute",
            f"host to device: pinned {fmt_gbps(pinned.value / 1e9)}, pageable {fmt_gbps(pageable.value / 1e9)}",
            "DataLoader(..., pin_memory=True) and x.to(device, non_blocking=True)",
        )
    ]  # fmt: skip


def tf32_off(card: CardCheck, flags: dict[str, bool | str | None]) -> list[CheckFinding]:
    fp32, tf32 = card.measured("fp32"), card.measured("tf32")
    precision = flags.get("torch.get_float32_matmul_precision()")
    if fp32 is None or tf32 is None or precision != "highest" or tf32.value < 2 * fp32.value:
        return []
    return [
        CheckFinding(
            "tf32-off", "info", card.label,
            f"float32 matmuls without TF32: {fmt_flops(fp32.value)} instead of {fmt_flops(tf32.value)}",
            "torch.get_float32_matmul_precision() is 'highest', so float32 matmuls leave the "
            "tensor cores idle",
            f"measured FP32 {fmt_flops(fp32.value)}, TF32 {fmt_flops(tf32.value)} ({tf32.value / fp32.value:.1f}×)",
            "torch.set_float32_matmul_precision('high') where TF32's 10-bit mantissa is enough "
            "(it usually is for training), or train in bf16 with torch.autocast",
        )
    ]  # fmt: skip


CARD_RULES: tuple[Callable[[CardCheck], list[CheckFinding]], ...] = (
    power_capped, thermal, power_brake, clocks_held, pcie_link, persistence, mig_slice, ecc,
    compute_mode, busy, below_spec, pinned_copies,
)  # fmt: skip
