"""One check from start to end: read the environment and the cards, measure what can be
measured, judge it all, say what could not be checked and why.

The readings need NVML alone; the GPU measurements need a CUDA torch and start CUDA in this
process (a context on each measured card, its memory given back after: tensors freed and
``empty_cache``). The host's figures need torch on the CPU.
"""

from __future__ import annotations

import time
from typing import Any

from gpumagic.cards import find_specs
from gpumagic.environment.check.facts import CardCheck, HostFacts
from gpumagic.environment.check.judge import judge
from gpumagic.environment.check.measurements import measure_gpu, measure_host
from gpumagic.environment.check.readings import (
    LoadProbe,
    Readings,
    match_uuid,
    read_cards,
    visible_order,
)
from gpumagic.environment.check.result import GpuCheck
from gpumagic.environment.report import EnvReport

READINGS = "the cards' clocks, power, PCIe link, temperature, ECC and MIG"
GPU_FIGURES = "the GPU measurements (matmul, memory and PCIe bandwidth, launch latency)"


def run_check(
    measure: bool = True,
    devices: list[int] | None = None,
    seconds: float = 0.3,
    nvml: Any = None,
    env: EnvReport | None = None,
) -> GpuCheck:
    """Check this machine. ``measure``: run the measurements (else readings only);
    ``devices``: the CUDA indexes to check (default every visible card); ``seconds``: the
    time each figure is measured over; ``nvml``: the ``pynvml`` module (a stand-in in
    tests); ``env``: the environment report when already read (``%gpuenv``'s)."""
    if env is None:
        from gpumagic.environment.collect import collect

        env = collect()
    started, t0 = time.time(), time.perf_counter()
    nvml = _nvml(nvml)
    readings = read_cards(nvml) if nvml is not None else Readings([], "nvidia-ml-py is not installed")
    cards = _visible_cards(readings)
    shown = {c.reading.nvml_index for c in cards}
    hidden = [CardCheck(r) for r in readings.cards if r.nvml_index not in shown]
    if devices is not None:
        known = {c.cuda_index: c for c in cards}
        missing = [i for i in devices if i not in known]
        if missing:
            listed = ", ".join(f"{c.cuda_index} ({c.reading.name})" for c in cards) or "none"
            raise ValueError(f"no visible GPU {', '.join(map(str, missing))}; visible: {listed}")
        cards = [known[i] for i in dict.fromkeys(devices)]
    host = _host_facts(env, readings)
    unchecked = _unchecked(env, readings, cards, measure)
    unchecked += [
        f"Not checked: {c.label} ({c.reading.name}): CUDA_VISIBLE_DEVICES hides it from this process."
        for c in hidden
    ]
    torch = _torch()
    if measure and torch is not None and env.cuda_available:
        _measure_cards(torch, nvml, cards, readings, seconds, devices)
    if measure and torch is not None:
        host.measurements = measure_host(torch, seconds)
    unchecked += [
        f"Not compared: {c.label} ({c.reading.name}) with a specification: {c.no_specs}."
        for c in cards
        if c.specs is None
    ]
    return GpuCheck(
        cards, host, judge(cards, host, hidden), unchecked, measure, started, time.perf_counter() - t0
    )


def _nvml(nvml: Any) -> Any:
    if nvml is not None:
        return nvml
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def _torch() -> Any:
    try:
        import torch
    except Exception:  # not installed, or a broken install: the report says which
        return None
    return torch


def _visible_cards(readings: Readings) -> list[CardCheck]:
    import os

    uuids = [c.uuid for c in readings.cards]
    by_index = {c.nvml_index: c for c in readings.cards}
    order = visible_order(readings.cards, uuids, os.environ.get("CUDA_VISIBLE_DEVICES"))
    cards = []
    for cuda_index, nvml_index in enumerate(order):
        reading = by_index[nvml_index]
        row, specs, why = find_specs(reading.name)
        cards.append(CardCheck(reading, cuda_index, row.name if row else None, specs, why))
    return cards


def _host_facts(env: EnvReport, readings: Readings) -> HostFacts:
    return HostFacts(
        torch_version=env.torch_version,
        torch_build=env.torch_build,
        cuda_available=env.cuda_available,
        driver_present=env.driver.present,
        driver_version=env.driver.version or readings.driver,
        torch_threads=env.torch_threads,
        usable_cpus=env.cpu.usable,
        affinity=env.cpu.affinity,
        flags=dict(env.flags),
        env_findings=list(env.findings),
        nvml_reason=readings.reason,
    )


def _unchecked(env: EnvReport, readings: Readings, cards: list[CardCheck], measure: bool) -> list[str]:
    """What could not be checked, and why, one line each."""
    lines = []
    if readings.reason is not None:
        lines.append(f"Not read: {READINGS}: {readings.reason}.")
    elif not cards:
        lines.append(f"Not read: {READINGS}: no card is visible to this process (CUDA_VISIBLE_DEVICES).")
    if not measure:
        lines.append("Not measured: the GPU and host figures (readings only).")
    elif env.torch_version is None:
        lines.append("Not measured: the GPU and host figures: torch is not installed.")
    elif not env.cuda_available:
        why = (
            f"torch {env.torch_version} is a CPU-only build"
            if env.torch_build == "CPU-only"
            else env.gpu_summary.rstrip(".")
        )
        lines.append(f"Not measured: {GPU_FIGURES}: {why}.")
    return lines


def _measure_cards(torch: Any, nvml: Any, cards: list[CardCheck], readings: Readings,
                   seconds: float, devices: list[int] | None) -> None:  # fmt: skip
    """Measure each CUDA device (``devices`` of them), matched to its card by UUID."""
    count = int(torch.cuda.device_count())
    wanted = devices if devices is not None else list(range(count))
    for index in wanted:
        if index >= count:
            continue
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        reading = match_uuid(readings.cards, str(uuid) if uuid is not None else None)
        card = next((c for c in cards if reading is not None and c.reading is reading), None)
        if card is None:  # NVML cannot see it (a container without it): judge by name alone
            card = next((c for c in cards if c.cuda_index == index), None)
        if card is None:
            continue
        card.cuda_index = index
        probe = _probe(nvml, card.reading.nvml_index)
        try:
            card.measurements, card.load, card.link_load = measure_gpu(
                torch, index, card.specs, seconds, probe
            )
        finally:
            if probe is not None:
                probe.close()


def _probe(nvml: Any, nvml_index: int) -> LoadProbe | None:
    if nvml is None:
        return None
    try:
        return LoadProbe(nvml, nvml_index)
    except Exception:  # NVML refuses now: measure without the readings under load
        return None
