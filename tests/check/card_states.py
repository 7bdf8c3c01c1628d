"""Recorded card states for the NVML double: a healthy card and each fault ``%gpucheck``
must name. Values are what nvidia-ml-py's calls return (mW, MHz, °C, bytes, NVML's enums), in
the ranges ``nvidia-smi -q`` prints for these cards (e.g. the power block of a 350 W GA102
card in NVIDIA/nvidia-docker#1547: limit and default 350 W, range 100-350 W, slowdown 95 °C).
A reading a state leaves out is one the card answers NotSupported (a GeForce card has no ECC
and no MIG). Tests only.
"""

from __future__ import annotations

from typing import Any

MIB = 2**20
IDLE, SW_POWER_CAP, HW_SLOWDOWN = 0x1, 0x4, 0x8
SW_THERMAL, HW_THERMAL = 0x20, 0x40


def card(**values: Any) -> dict[str, Any]:
    """A desktop RTX 4090 at rest, healthy, with what a change of it overrides."""
    state: dict[str, Any] = {
        "name": "NVIDIA GeForce RTX 4090",
        "uuid": "GPU-40904090-0000-0000-0000-000000000001",
        "capability": (8, 9),
        "sm_clock": 210,
        "sm_clock_max": 3120,
        "memory_clock": 405,
        "memory_clock_max": 10501,
        "clock_events": IDLE,
        "power_draw_mw": 19_000,
        "power_limit_mw": 450_000,
        "power_default_mw": 450_000,
        "power_range_mw": (150_000, 600_000),
        "temperature": 36,
        "slowdown_temperature": 87,
        "shutdown_temperature": 92,
        "pcie_gen": 1,  # at rest the link trains down to save power
        "pcie_width": 16,
        "pcie_gen_max": 4,
        "pcie_width_max": 16,
        "pcie_gen_card_max": 4,
        "persistence": 1,
        "compute_mode": 0,
        "utilization": 0,
        "processes": [],
        "memory_total": 24564 * MIB,
        "memory_used": 1 * MIB,
    }
    state.update(values)
    return state


def data_centre(name: str, uuid: str, **values: Any) -> dict[str, Any]:
    """A data-centre board: ECC on with no errors, rows remappable, MIG off."""
    base: dict[str, Any] = {
        "capability": (8, 0), "ecc_mode": (1, 1),
        "ecc_errors": {"volatile_corrected": 0, "volatile_uncorrected": 0,
                       "aggregate_corrected": 0, "aggregate_uncorrected": 0},
        "remapped_rows": (0, 0, 0, 0), "mig_mode": (0, 0), "mig_slices": [],
    }  # fmt: skip
    return card(name=name, uuid=uuid, **{**base, **values})


def mig_slice(name: str, uuid: str, memory_mib: int) -> dict[str, Any]:
    return {"name": name, "uuid": uuid, "memory_total": memory_mib * MIB}


HEALTHY_4090 = card()

POWER_CAPPED_4090 = card(power_limit_mw=250_000)

# A blower card whose fan has stopped: hot at rest, the thermal slowdowns asserted.
THERMAL_3090 = card(
    name="NVIDIA GeForce RTX 3090",
    uuid="GPU-30903090-0000-0000-0000-000000000002",
    capability=(8, 6),
    sm_clock=1005,
    sm_clock_max=2100,
    clock_events=SW_THERMAL | HW_THERMAL | HW_SLOWDOWN,
    temperature=93,
    slowdown_temperature=95,
    shutdown_temperature=98,
    power_limit_mw=350_000,
    power_default_mw=350_000,
    power_range_mw=(100_000, 350_000),
)

# A 3090 on a riser in a Gen 3 x4 slot.
GEN3_X4_3090 = card(
    name="NVIDIA GeForce RTX 3090",
    uuid="GPU-30903090-0000-0000-0000-000000000003",
    capability=(8, 6),
    sm_clock_max=2100,
    power_limit_mw=350_000,
    power_default_mw=350_000,
    power_range_mw=(100_000, 350_000),
    pcie_gen=1,
    pcie_width=4,
    pcie_gen_max=3,
    pcie_width_max=4,
    pcie_gen_card_max=4,
)

MIG_1G = "MIG-a1a1a1a1-0000-0000-0000-000000000001"
MIG_A100 = data_centre(
    "NVIDIA A100-SXM4-80GB",
    "GPU-a100a100-0000-0000-0000-000000000004",
    sm_clock_max=1410,
    memory_clock_max=1593,
    power_limit_mw=400_000,
    power_default_mw=400_000,
    power_range_mw=(100_000, 400_000),
    memory_total=81920 * MIB,
    mig_mode=(1, 1),
    mig_slices=[
        mig_slice("NVIDIA A100-SXM4-80GB MIG 1g.10gb", MIG_1G, 9984),
        None,  # an empty slot
        mig_slice("NVIDIA A100-SXM4-80GB MIG 3g.40gb", "MIG-b2b2b2b2-0000-0000-0000-000000000002", 40192),
    ],
)

ECC_A100 = data_centre(
    "NVIDIA A100-SXM4-40GB",
    "GPU-a100a100-0000-0000-0000-000000000005",
    sm_clock_max=1410,
    power_limit_mw=400_000,
    power_default_mw=400_000,
    power_range_mw=(100_000, 400_000),
    memory_total=40960 * MIB,
    ecc_errors={"volatile_corrected": 12, "volatile_uncorrected": 2,
                "aggregate_corrected": 40, "aggregate_uncorrected": 5},
    remapped_rows=(3, 2, 1, 0),  # correctable remaps, uncorrectable remaps, pending, failure
)  # fmt: skip

# Before Ampere: retired pages instead of remapped rows (nvmlDeviceGetRemappedRows unsupported).
RETIRED_V100 = data_centre(
    "Tesla V100-SXM2-16GB",
    "GPU-v100v100-0000-0000-0000-000000000006",
    capability=(7, 0),
    sm_clock_max=1530,
    power_limit_mw=300_000,
    power_default_mw=300_000,
    power_range_mw=(150_000, 300_000),
    memory_total=16384 * MIB,
    remapped_rows=None,
    unsupported={"nvmlDeviceGetRemappedRows", "nvmlDeviceGetMigMode"},
    retired_pages={0: [0x1A2B000], 1: [0x2B3C000, 0x3C4D000]},
    retired_pending=1,
)

PERSISTENCE_OFF_H100 = data_centre(
    "NVIDIA H100 80GB HBM3",
    "GPU-h100h100-0000-0000-0000-000000000007",
    capability=(9, 0),
    sm_clock_max=1980,
    power_limit_mw=700_000,
    power_default_mw=700_000,
    power_range_mw=(200_000, 700_000),
    memory_total=81559 * MIB,
    pcie_gen_max=5,
    pcie_gen_card_max=5,
    persistence=0,
)
