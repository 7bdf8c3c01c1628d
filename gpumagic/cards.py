"""The GPUs ``%%memfit --gpu NAME`` knows, with the memory CUDA lets a process use and where
each figure comes from.

``cuda_bytes`` is what CUDA reports as the device's total (``cudaDeviceProp::totalGlobalMem``,
``torch.cuda.get_device_properties(i).total_memory``, the "total capacity" of PyTorch's
out-of-memory message): the memory a process can have, before its own CUDA context. It is
less than ``nvidia-smi``'s total by what the driver and firmware keep (453 MiB on an H100
SXM, 762 MiB on an A100 80GB, 354-556 MiB on the others recorded here). Where only a
rounded figure was published (PyTorch's message prints GiB with two decimals), the
uncertainty says so.

Each row names its source: a recording of CUDA's ``deviceQuery`` or PyTorch's out-of-memory
message on that card (public GitHub issues and repositories), NVIDIA's datasheet where no
recording was found. Add a card with a source of the same kind.

``specs`` is what ``%gpucheck`` judges a card against (issue 29): dense throughput in FP32
(CUDA cores), TF32, BF16 and FP16 (tensor cores, FP32 accumulation: what torch's matmuls
ask cuBLAS for), memory bandwidth, the PCIe link, power, clocks; every number with the
vendor's datasheet or whitepaper and the table it is in. Datasheets print tensor figures
"with sparsity" (2:4 structured sparsity doubles them); the dense half is kept here, and the
note says so. A figure the vendor does not publish is None, never estimated.

The table is a bottom module so that both cores may read it (``memory/fit`` for the
memory, ``environment/check`` for the rest).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from gpumagic.card_specs import CardSpecs, Source, Sourced, specs_of

MiB = 2**20
GiB = 2**30
_GIB_2DP = int(0.005 * GiB)  # PyTorch's message rounds to 0.01 GiB
_DEVICEQUERY = "https://github.com/thamada/nvidia-smi/blob/b09ef139265ffc7e3c78006346981de8e4d70499/gls/"


@dataclass(frozen=True)
class GpuSpec:
    name: str
    cuda_bytes: int  # the total CUDA reports; the process's own context comes out of it
    uncertainty_bytes: int  # how far the true total may be from cuda_bytes
    smi_mib: int | None  # nvidia-smi's total, for reference
    source: str  # where cuda_bytes comes from
    how: str  # what that source recorded
    aliases: tuple[str, ...] = ()
    capability: int | None = None  # the compute capability's major number (sizes cuBLASLt's workspace)
    capability_minor: int | None = None  # its minor number (which attention kernels train what)
    specs: CardSpecs | None = None  # what %gpucheck compares with (gpumagic/card_specs.py)


_MEMORY: tuple[GpuSpec, ...] = (
    GpuSpec(
        "H200", 143771 * MiB - 453 * MiB, 400 * MiB, 143771,
        "https://www.nvidia.com/en-us/data-center/h200/",
        "datasheet: 141 GB HBM3e; nvidia-smi shows 143771 MiB on H200 machines; CUDA's total "
        "taken as that less the H100's driver reserve (453 MiB), within 400 MiB",
        ("h200-141gb", "h200 sxm"),
        capability=9,
    ),
    # The NVL board has the SXM's memory and a lower power limit and throughput (its own
    # specifications), so it is a row of its own; the memory figures are the H200's.
    GpuSpec(
        "H200 NVL", 143771 * MiB - 453 * MiB, 400 * MiB, 143771,
        "https://www.nvidia.com/en-us/data-center/h200/",
        "as the H200 (SXM): the datasheet gives both boards 141 GB of HBM3e",
        ("h200-nvl",),
        capability=9,
    ),
    GpuSpec(
        "H100 80GB", 85045477376, 0, 81559,
        _DEVICEQUERY + "H100SXMx8_deviceQuery.py",
        "deviceQuery on an H100 80GB HBM3 (SXM): 85045477376 bytes",
        ("h100", "h100-80gb", "h100 sxm", "h100 80gb hbm3"),
        capability=9,
    ),
    GpuSpec(
        "H100 NVL", 99861594112, 0, 95830,
        _DEVICEQUERY + "H100NVLx2_deviceQuery.py",
        "deviceQuery on an H100 NVL: 99861594112 bytes",
        ("h100-nvl",),
        capability=9,
    ),
    GpuSpec(
        "A100 80GB", 85100068864, 0, 81920,
        _DEVICEQUERY + "A100SXMx4_deviceQuery.py",
        "deviceQuery on an A100-SXM4-80GB: 85100068864 bytes",
        ("a100-80gb", "a100 80", "a100-sxm4-80gb"),
        capability=8,
    ),
    GpuSpec(
        "A100 40GB", int(39.59 * GiB), _GIB_2DP, 40960,
        "https://github.com/raoyongming/DenseCLIP/issues/52",
        "PyTorch's out-of-memory message on a 40 GB A100: 39.59 GiB total capacity",
        ("a100", "a100-40gb", "a100 40", "a100-sxm4-40gb"),
        capability=8,
    ),
    GpuSpec(
        "L40S", 47803596800, 0, 46068,
        _DEVICEQUERY + "L40S_deviceQuery.py",
        "deviceQuery on an L40S: 47803596800 bytes",
        ("l40s",),
        capability=8,
    ),
    GpuSpec(
        "A40", 47608692736, 0, 46068,
        _DEVICEQUERY + "A40x10_deviceQuery.py",
        "deviceQuery on an A40: 47608692736 bytes",
        capability=8,
    ),
    GpuSpec(
        "L4", 23570219008, 0, 23034,
        _DEVICEQUERY + "L4_deviceQuery.py",
        "deviceQuery on an L4: 23570219008 bytes",
        capability=8,
    ),
    GpuSpec(
        "A10G", int(22.20 * GiB), _GIB_2DP, 23028,
        "https://github.com/XavierXiao/Dreambooth-Stable-Diffusion/issues/18",
        "PyTorch's out-of-memory message on a g5.12xlarge (A10G): 22.20 GiB total capacity; "
        "nvidia-smi 23028 MiB (NVIDIA/DCGM#232)",
        ("a10g-24gb",),
        capability=8,
    ),
    GpuSpec(
        "T4", int(14.75 * GiB), _GIB_2DP, 15360,
        "https://github.com/NVIDIA/DALI/issues/1813",
        "TensorFlow's device listing on Tesla T4s: deviceMemorySize 14.75GiB",
        ("tesla t4", "t4-16gb"),
        capability=7,
    ),
    GpuSpec(
        "V100 32GB", int(31.74 * GiB), _GIB_2DP, None,
        "https://github.com/haotian-liu/LLaVA/issues/812",
        "PyTorch's out-of-memory message on 32 GB V100s: 31.74 GiB total capacity",
        ("v100-32gb", "v100 32"),
        capability=7,
    ),
    GpuSpec(
        "V100 16GB", int(15.78 * GiB), _GIB_2DP, None,
        "https://github.com/kchengiva/Shift-GCN/issues/34",
        "PyTorch's out-of-memory message on a 16 GB V100: 15.78 GiB total capacity",
        ("v100", "v100-16gb", "v100 16"),
        capability=7,
    ),
    GpuSpec(
        "RTX 4090", 25386352640, 0, 24564,
        _DEVICEQUERY + "RTX4090_deviceQuery.py",
        "deviceQuery on a GeForce RTX 4090: 25386352640 bytes",
        ("4090", "rtx4090", "geforce rtx 4090"),
        capability=8,
    ),
    GpuSpec(
        "RTX 3090", 25327697920, 0, 24576,
        _DEVICEQUERY + "RTX3090_deviceQuery.py",
        "deviceQuery on a GeForce RTX 3090: 25327697920 bytes",
        ("3090", "rtx3090", "geforce rtx 3090"),
        capability=8,
    ),
    GpuSpec(
        "RTX 6000 Ada", 51002867712, 0, 49140,
        _DEVICEQUERY + "RTX6000Ada_x8_deviceQuery.py",
        "deviceQuery on an RTX 6000 Ada Generation: 51002867712 bytes",
        ("rtx6000ada", "rtx 6000 ada generation"),
        capability=8,
    ),
)

# The compute capability's minor number, from NVIDIA's table (https://developer.nvidia.com/cuda-gpus):
# torch's attention rules tell sm86/sm89 from sm80 (flash's backward for head dims over 192).
_CAPABILITY_MINOR = {
    "H200": 0, "H200 NVL": 0, "H100 80GB": 0, "H100 NVL": 0, "A100 80GB": 0, "A100 40GB": 0,
    "L40S": 9, "A40": 6, "L4": 9, "A10G": 6, "T4": 5, "V100 32GB": 0, "V100 16GB": 0,
    "RTX 4090": 9, "RTX 3090": 6, "RTX 6000 Ada": 9,
}  # fmt: skip

# Each row with what %gpucheck compares it with (gpumagic/card_specs.py).
GPUS: tuple[GpuSpec, ...] = tuple(
    dataclasses.replace(g, specs=specs_of(g.name), capability_minor=_CAPABILITY_MINOR.get(g.name)) for g in _MEMORY
)

__all__ = [
    "GPUS", "CardSpecs", "GiB", "GpuSpec", "MiB", "Source", "Sourced", "find_gpu", "find_specs",
    "gpu_names", "name_form",
]  # fmt: skip


# Words in the names drivers give cards that say nothing about their memory.
_NOISE = re.compile(r"nvidia|geforce|tesla|generation|sxm\d?|pcie|hbm3e?|[^a-z0-9]+")
# The board form a name states, where it states one ("NVIDIA H100 PCIe", "A100-SXM4-80GB").
_FORMS = (("sxm", "SXM"), ("pcie", "PCIe"), ("nvl", "NVL"))


def _key(name: str) -> str:
    return _NOISE.sub("", name.lower())


def find_gpu(name: str) -> GpuSpec | None:
    """The table's row for ``name`` ("A100-80GB", "h100", "NVIDIA GeForce RTX 4090", the
    name torch gives a card: "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB"), None if it has
    none. Names match ignoring case, spaces, dashes, the maker's words and the form factor."""
    wanted = _key(name)
    for gpu in GPUS:
        if wanted in {_key(gpu.name), *(_key(a) for a in gpu.aliases)}:
            return gpu
    return None


def name_form(name: str) -> str | None:
    """The board form a card's name states (``SXM``, ``PCIe``, ``NVL``), None when it says none."""
    lower = name.lower()
    return next((form for word, form in _FORMS if word in lower), None)


def find_specs(name: str) -> tuple[GpuSpec | None, CardSpecs | None, str]:
    """The row for the card NVML or torch names ``name``, its specifications, and why there
    are none where there are none (no row; a row without a datasheet; a name stating another
    board form than the one the figures are for, whose power, clocks and bandwidth differ)."""
    row = find_gpu(name)
    if row is None:
        return None, None, f"{name} is not in gpumagic's card table"
    if row.specs is None:
        return row, None, f"the card table has no published specification for the {row.name}"
    form = name_form(name)
    if form is not None and form != row.specs.form:
        return row, None, (
            f"the card table's {row.name} figures are for the {row.specs.form} board, and "
            f"{name} is a {form} board (other clocks, power and bandwidth)"
        )
    return row, row.specs, ""


def gpu_names() -> list[str]:
    return [g.name for g in GPUS]
