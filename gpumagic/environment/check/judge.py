"""The host's rules (the torch build beside the driver, the threads, which card this process
was given, ``%gpuenv``'s traps that cost speed) and :func:`judge`, which runs every rule, the
cards' (:mod:`gpumagic.environment.check.findings`) and these, and ranks what they found."""

from __future__ import annotations

from gpumagic.environment.check.facts import CardCheck, HostFacts
from gpumagic.environment.check.findings import (
    BUSY_PERCENT,
    CARD_RULES,
    CheckFinding,
    rank,
    tf32_off,
)
from gpumagic.units import fmt_flops

TORCH_INSTALL = "https://pytorch.org/get-started/locally/"
# %gpuenv's findings that change speed or whether the GPU works at all, with a title each
# (the rest, reproducibility and allocator settings, stay %gpuenv's).
ENV_TITLES = {
    "driver-too-old": "the NVIDIA driver is too old for this torch",
    "driver-older-than-toolkit": "the NVIDIA driver is older than torch's CUDA",
    "launch-blocking": "CUDA_LAUNCH_BLOCKING makes every launch wait",
    "visible-devices-empty": "CUDA_VISIBLE_DEVICES hides every GPU",
    "visible-devices-hidden": "CUDA_VISIBLE_DEVICES hides every GPU",
    "cpu-quota": "a container CPU quota below the visible cores",
}
ENV_COST = {"driver-too-old": 1.0, "visible-devices-empty": 1.0, "launch-blocking": 0.5}


def judge(cards: list[CardCheck], host: HostFacts, hidden: list[CardCheck] | None = None) -> list[CheckFinding]:
    """Every rule on every card and on the host, ranked (errors first, then by cost).
    ``hidden``: the cards CUDA_VISIBLE_DEVICES keeps from this process (not judged, but an
    idle one beside a busy visible one is worth saying)."""
    found = cpu_only_torch(cards, host)
    for card in cards:
        for rule in CARD_RULES:
            found += rule(card)
        found += tf32_off(card, host.flags)
    found += busy_card_chosen(cards, hidden or [])
    found += threads(host)
    found += from_env(host)
    return rank(found)


def _cards(cards: list[CardCheck]) -> str:
    names = [c.reading.name for c in cards]
    return ", ".join(dict.fromkeys(names)) if names else "no card"


def cpu_only_torch(cards: list[CardCheck], host: HostFacts) -> list[CheckFinding]:
    """A torch that cannot use the cards NVML lists (or, without NVML, the driver found)."""
    if host.torch_version is None or host.cuda_available or not (cards or host.driver_present):
        return []
    driver = f" (driver {host.driver_version})" if host.driver_version else ""
    version = f" {host.driver_version}" if host.driver_version else ""
    seen = f"NVML lists {_cards(cards)}{driver}" if cards else f"the NVIDIA driver{version} is loaded"
    if host.torch_build == "CPU-only":
        return [CheckFinding(
            "cpu-only-torch", "error", "host",
            f"a CPU-only torch beside {_cards(cards) if cards else 'an NVIDIA driver'}",
            "this torch was built without CUDA: every tensor stays on the CPU and the card "
            "does nothing for this kernel",
            f"torch {host.torch_version} ({host.torch_build}); {seen}",
            f"install a CUDA build of torch (the CUDA variant at {TORCH_INSTALL}, installed "
            "with its --index-url), then restart the kernel",
            1.0, "the GPU's work",
        )]  # fmt: skip
    if not cards:
        return []  # a GPU build without a card NVML lists: %gpuenv's findings say why
    return [CheckFinding(
        "cuda-unavailable", "error", "host", f"torch cannot use {_cards(cards)}",
        "torch is a GPU build but torch.cuda.is_available() is False, so nothing runs on the card",
        f"torch {host.torch_version} ({host.torch_build}); {seen}",
        "run %gpuenv for the reason torch gives (a driver too old for its CUDA, "
        "CUDA_VISIBLE_DEVICES); restart the kernel after fixing it",
        1.0, "the GPU's work",
    )]  # fmt: skip


def busy_card_chosen(cards: list[CardCheck], hidden: list[CardCheck]) -> list[CheckFinding]:
    """A card this process may use is busy with other work while one it may not is idle."""
    shown = [c for c in cards if (c.reading.utilization or 0) >= BUSY_PERCENT]
    idle = [c for c in hidden if not c.reading.other_processes and (c.reading.utilization or 0) < 5]
    if not shown or not idle:
        return []
    busy, free = shown[0], idle[0]
    return [CheckFinding(
        "busy-card-chosen", "warning", busy.label,
        f"CUDA_VISIBLE_DEVICES gives this kernel a busy card while GPU {free.reading.nvml_index} is idle",
        "this process shares a card with other work while a card it was not given sits idle",
        f"GPU {busy.reading.nvml_index} ({busy.reading.name}): {busy.reading.utilization}% busy; GPU "
        f"{free.reading.nvml_index} ({free.reading.name}): idle, hidden by CUDA_VISIBLE_DEVICES",
        f"restart the kernel with CUDA_VISIBLE_DEVICES={free.reading.nvml_index}, or run "
        "%gpuselect first in a new kernel (before CUDA starts)",
        (busy.reading.utilization or 0) / 100 or None, "the card's time",
    )]  # fmt: skip


def threads(host: HostFacts) -> list[CheckFinding]:
    t, usable = host.torch_threads, host.usable_cpus
    if t is None:
        return []
    many, one = host.measured("cpu_matmul"), host.measured("cpu_matmul_1")
    scaling = (
        f"FP32 matmul: {fmt_flops(many.value)} with {t} threads, {fmt_flops(one.value)} with one"
        if many and one else ""
    )  # fmt: skip
    if t > usable:
        return [CheckFinding(
            "threads-oversubscribed", "warning", "host",
            f"torch uses {t} threads on {usable} usable CPUs",
            "threads beyond the CPUs this process may use take turns on the same cores, and "
            "every CPU op (and the DataLoader feeding the GPU) slows down",
            "; ".join(p for p in (f"torch.get_num_threads() = {t}; CPUs this process may use "
                      f"(affinity, cgroup quota) = {usable}", scaling) if p),
            f"torch.set_num_threads({usable}), or OMP_NUM_THREADS={usable} before the kernel starts",
            1 - usable / t, "CPU ops",
        )]  # fmt: skip
    if usable >= 4 and t <= usable // 2:
        return [CheckFinding(
            "threads-few", "info", "host", f"torch uses {t} of the {usable} CPUs it may use",
            "CPU ops (data loading in the main process, CPU-side preprocessing) use a fraction of the cores",
            "; ".join(p for p in (f"torch.get_num_threads() = {t}; usable CPUs = {usable}", scaling) if p),
            f"torch.set_num_threads({usable}) if nothing else needs the cores (OMP_NUM_THREADS "
            "set low, or another torch.set_num_threads call, is the usual cause)",
            1 - t / usable, "CPU ops",
        )]  # fmt: skip
    return []


def from_env(host: HostFacts) -> list[CheckFinding]:
    """%gpuenv's findings that change speed, as findings of the check."""
    return [
        CheckFinding(
            f.code, f.level, "host", ENV_TITLES[f.code], f.message,
            "read as %gpuenv reads it", f.fix, ENV_COST.get(f.code),
        )
        for f in host.env_findings
        if f.code in ENV_TITLES
    ]
