"""Pure rules over plain values: the known traps of a PyTorch GPU setup, and the sizing advice.

Nothing here reads the machine; :mod:`gpumagic.environment.collect` does that and passes the values
in, so each rule is testable with small inputs and fails visibly when it is wrong.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# CUDA toolkit (major, minor) -> the Linux x86_64 driver its GA release shipped with.
# Source: NVIDIA CUDA Toolkit Release Notes, "Table 3 CUDA Toolkit and Corresponding Driver
# Versions" (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/), the GA row of each
# release (11.0: the 11.0.2 GA row). 12.7 was never released. A driver at least this new runs
# everything the toolkit can build, including PTX compiled for it.
TOOLKIT_DRIVER: dict[tuple[int, int], str] = {
    (11, 0): "450.51.05",
    (11, 1): "455.23",
    (11, 2): "460.27.03",
    (11, 3): "465.19.01",
    (11, 4): "470.42.01",
    (11, 5): "495.29.05",
    (11, 6): "510.39.01",
    (11, 7): "515.43.04",
    (11, 8): "520.61.05",
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
    (13, 1): "590.44.01",
    (13, 2): "595.45.04",
}

# CUDA major -> the oldest Linux driver that runs any toolkit of that major through "minor
# version compatibility". Source: the same release notes, "Table 2 CUDA Toolkit and Minimum
# Required Driver Version for CUDA Minor Version Compatibility" (11.x: its footnote names
# 450.80.02). Below this, CUDA cannot initialise at all and torch sees no GPU.
MINOR_COMPAT_DRIVER: dict[int, str] = {11: "450.80.02", 12: "525", 13: "580"}

# DataLoader workers beyond this rarely speed up a notebook's input pipeline, while each one
# is a full process holding its own copy of the Dataset object.
MAX_SUGGESTED_WORKERS = 8

PYTORCH_REPRODUCIBILITY = "https://pytorch.org/docs/stable/notes/randomness.html"
PYTORCH_INSTALL = "https://pytorch.org/get-started/locally/"


@dataclass(frozen=True)
class Finding:
    """One trap found in the environment: ``level`` is ``error`` (GPU work cannot run as
    intended), ``warning`` (it runs, wrongly or slowly) or ``info`` (worth knowing)."""

    level: str
    code: str
    message: str
    fix: str


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """``'535.104.05' -> (535, 104, 5)``; None when the text holds no dotted number."""
    if not text:
        return None
    m = re.match(r"\s*(\d+(?:\.\d+)*)", text)
    if m is None:
        return None
    return tuple(int(p) for p in m.group(1).split("."))


def cuda_tag(cuda: str) -> str | None:
    """The PyTorch wheel-index tag of a CUDA version: ``'12.1' -> 'cu121'``."""
    v = version_tuple(cuda)
    if v is None or len(v) < 2:
        return None
    return f"cu{v[0]}{v[1]}"


def driver_too_old(driver: str | None, cuda: str | None) -> Finding | None:
    """Is the NVIDIA ``driver`` too old for torch's CUDA runtime ``cuda`` (``torch.version.cuda``)?

    Below the major's minor-version-compatibility floor CUDA cannot start: an error. Between
    that floor and the driver the toolkit shipped with, ordinary kernels run but PTX built for
    the newer toolkit (Triton kernels from ``torch.compile``) is rejected: a warning.
    None when the driver is new enough, or when either version is unknown to the tables.
    """
    have = version_tuple(driver)
    want = version_tuple(cuda)
    if have is None or want is None or len(want) < 2:
        return None
    major, minor = want[0], want[1]
    floor = MINOR_COMPAT_DRIVER.get(major)
    shipped = TOOLKIT_DRIVER.get((major, minor))
    floor_v = version_tuple(floor)
    shipped_v = version_tuple(shipped)
    if floor_v is not None and shipped_v is not None and shipped_v < floor_v:
        # CUDA 11.0 shipped with 450.51.05, below the 11.x compatibility floor (450.80.02):
        # a toolkit's own driver always runs it.
        floor, floor_v = shipped, shipped_v
    if floor_v is not None and have < floor_v:
        need = shipped or floor
        return Finding(
            "error",
            "driver-too-old",
            f"NVIDIA driver {driver} is too old for the CUDA {major}.{minor} runtime torch was "
            f"built with, which needs driver {floor} or newer: CUDA cannot initialise and "
            "torch sees no GPU.",
            f"Upgrade the NVIDIA driver to {need} or newer, or install a torch build for an "
            f"older CUDA that this driver supports (see {PYTORCH_INSTALL}).",
        )
    if shipped_v is not None and have < shipped_v:
        return Finding(
            "warning",
            "driver-older-than-toolkit",
            f"NVIDIA driver {driver} is older than the {shipped} that CUDA {major}.{minor} "
            "shipped with. Ordinary kernels run (CUDA minor-version compatibility), but PTX "
            f"compiled for CUDA {major}.{minor}, e.g. Triton kernels from torch.compile, can fail "
            "with 'the provided PTX was compiled with an unsupported toolchain'.",
            f"Upgrade the NVIDIA driver to {shipped} or newer.",
        )
    return None


def cpu_only_torch(
    torch_version: str | None,
    cuda: str | None,
    hip: str | None,
    driver: str | None,
    driver_present: bool,
    gpu_names: list[str],
    driver_cuda: str | None = None,
) -> Finding | None:
    """A CPU-only torch on a machine whose NVIDIA driver is loaded: every tensor stays on the CPU."""
    if torch_version is None or cuda or hip or not driver_present:
        return None
    seen = f" and sees {gpu_list(gpu_names)}" if gpu_names else ""
    drv = f" {driver}" if driver else ""
    supports = f" (this driver supports CUDA up to {driver_cuda})" if driver_cuda else ""
    return Finding(
        "error",
        "cpu-only-torch",
        f"torch {torch_version} is a CPU-only build, but the NVIDIA driver{drv} is loaded{seen}: "
        "nothing in this kernel can run on the GPU.",
        f"Install a CUDA build of torch{supports}: pick the CUDA variant at {PYTORCH_INSTALL} "
        "and reinstall with its --index-url, then restart the kernel.",
    )


def visible_devices(value: str | None) -> Finding | None:
    """``CUDA_VISIBLE_DEVICES`` set but empty (or ``-1``) hides every GPU from CUDA."""
    if value is None:
        return None
    stripped = value.strip()
    if stripped == "":
        return Finding(
            "warning",
            "visible-devices-empty",
            "CUDA_VISIBLE_DEVICES is set but empty, which hides every GPU from CUDA "
            "(unset means all GPUs; empty means none).",
            "Unset it (del os.environ['CUDA_VISIBLE_DEVICES'] before torch initialises CUDA, "
            "or restart the kernel without it), or list the GPUs to use, e.g. '0' or '0,1'.",
        )
    if stripped.split(",")[0].strip() == "-1":
        return Finding(
            "info",
            "visible-devices-hidden",
            "CUDA_VISIBLE_DEVICES=-1 hides every GPU from CUDA.",
            "If that is not intended, unset it and restart the kernel.",
        )
    return None


def deterministic_with_benchmark(
    deterministic_algorithms: bool, cudnn_deterministic: bool, benchmark: bool
) -> Finding | None:
    """Deterministic mode asked for while cuDNN benchmarking may pick a different algorithm per run."""
    if not benchmark or not (deterministic_algorithms or cudnn_deterministic):
        return None
    which = (
        "torch.use_deterministic_algorithms(True)"
        if deterministic_algorithms
        else "torch.backends.cudnn.deterministic = True"
    )
    return Finding(
        "warning",
        "deterministic-with-benchmark",
        f"{which} is set together with torch.backends.cudnn.benchmark = True: benchmarking "
        "times several convolution algorithms and keeps the fastest, so the choice (and the "
        "result's last bits) can differ from run to run.",
        f"Set torch.backends.cudnn.benchmark = False for reproducible runs ({PYTORCH_REPRODUCIBILITY}).",
    )


def cublas_workspace(
    deterministic_algorithms: bool, cuda: str | None, value: str | None
) -> Finding | None:
    """Deterministic algorithms on CUDA need ``CUBLAS_WORKSPACE_CONFIG``, or cuBLAS calls raise."""
    if not deterministic_algorithms or not cuda or value in (":4096:8", ":16:8"):
        return None
    shown = "unset" if value is None else repr(value)
    return Finding(
        "warning",
        "cublas-workspace",
        f"torch.use_deterministic_algorithms(True) is on but CUBLAS_WORKSPACE_CONFIG is {shown}: "
        "cuBLAS operations (matmul, linear layers) on the GPU will raise a RuntimeError.",
        "Set os.environ['CUBLAS_WORKSPACE_CONFIG'] = ':4096:8' (or ':16:8') before the first "
        f"CUDA call ({PYTORCH_REPRODUCIBILITY}).",
    )


def tf32_off(
    capabilities: list[str], matmul_allow_tf32: bool | None, matmul_precision: str | None
) -> Finding | None:
    """Full-FP32 matmuls on GPUs whose tensor cores do TF32 (compute capability 8.0 and newer)."""
    tf32_gpus = [c for c in capabilities if (version_tuple(c) or (0,)) >= (8, 0)]
    if not tf32_gpus or matmul_allow_tf32 or matmul_precision != "highest":
        return None
    return Finding(
        "info",
        "tf32-off",
        f"The GPU (compute capability {tf32_gpus[0]}) has TF32 tensor cores, but float32 matmuls "
        "run in full FP32 (torch.get_float32_matmul_precision() is 'highest').",
        "Where TF32 precision is acceptable (it usually is for training), "
        "torch.set_float32_matmul_precision('high') lets float32 matmuls use the tensor cores.",
    )


def threads_oversubscribed(torch_threads: int | None, usable_cpus: int) -> Finding | None:
    if torch_threads is None or torch_threads <= usable_cpus:
        return None
    return Finding(
        "warning",
        "threads-oversubscribed",
        f"torch uses {torch_threads} intra-op threads but only {usable_cpus} CPUs are usable "
        "by this process: threads time-share cores and CPU ops slow down.",
        f"torch.set_num_threads({usable_cpus}) (or set OMP_NUM_THREADS before starting the kernel).",
    )


def cpu_quota_below_visible(visible: int | None, quota: float | None) -> Finding | None:
    """A container CPU quota smaller than the cores the process can see."""
    if visible is None or quota is None or quota >= visible:
        return None
    return Finding(
        "info",
        "cpu-quota",
        f"The container's CPU quota is {quota:g} CPUs although {visible} cores are visible: "
        "pools sized by core count (DataLoader workers, torch threads) oversubscribe the quota.",
        "Size worker pools by the quota; the num_workers suggestion here already does.",
    )


def alloc_conf_conflict(alloc_conf: str | None, cuda_alloc_conf: str | None) -> Finding | None:
    if alloc_conf is None or cuda_alloc_conf is None or alloc_conf == cuda_alloc_conf:
        return None
    return Finding(
        "warning",
        "alloc-conf-conflict",
        f"PYTORCH_ALLOC_CONF={alloc_conf!r} and PYTORCH_CUDA_ALLOC_CONF={cuda_alloc_conf!r} "
        "disagree: recent torch reads PYTORCH_ALLOC_CONF first, older torch reads only "
        "PYTORCH_CUDA_ALLOC_CONF, so the allocator setting depends on the torch version.",
        "Keep one of the two variables.",
    )


def launch_blocking(value: str | None) -> Finding | None:
    if value is None or value.strip() in ("", "0"):
        return None
    return Finding(
        "warning",
        "launch-blocking",
        f"CUDA_LAUNCH_BLOCKING={value}: every kernel launch waits for the GPU to finish, "
        "which is for debugging and makes training much slower.",
        "Unset CUDA_LAUNCH_BLOCKING and restart the kernel once the error is found.",
    )


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 ``cpu.max`` (``'200000 100000'`` -> 2.0 CPUs; ``'max 100000'`` -> None)."""
    parts = text.split()
    if len(parts) < 1 or parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def usable_cpus(logical: int | None, affinity: int | None, quota: float | None) -> int:
    """CPUs this process can keep busy: the affinity mask (what torch's DataLoader checks),
    lowered to a container's CPU quota, which the affinity mask does not show."""
    n = affinity or logical or 1
    if quota is not None:
        n = min(n, max(1, math.floor(quota)))
    return n


def suggest_num_workers(usable: int, gpus: int) -> tuple[int, str]:
    """DataLoader ``num_workers`` for one training process per GPU, and the rule that gave it."""
    per_gpu = usable // max(gpus, 1)
    if usable <= 1:
        return 0, "one usable CPU: load in the main process (num_workers=0)"
    n = max(1, min(per_gpu - 1, MAX_SUGGESTED_WORKERS))
    who = f"per GPU ({usable} CPUs / {gpus} GPUs)" if gpus > 1 else f"({usable})"
    return n, (
        f"min(usable CPUs {who} - 1, {MAX_SUGGESTED_WORKERS}), at least 1: one core stays "
        "with the process that feeds the GPU; more than "
        f"{MAX_SUGGESTED_WORKERS} workers rarely helps and each is a full process"
    )


def parse_proc_driver_version(text: str) -> str | None:
    """The driver version in ``/proc/driver/nvidia/version`` (proprietary or open kernel module)."""
    for line in text.splitlines():
        if line.startswith("NVRM"):
            m = re.search(r"\s(\d{3,}\.\d+(?:\.\d+)?)\s", line + " ")
            if m:
                return m.group(1)
    return None


def format_cudnn(version: int | None) -> str | None:
    """``torch.backends.cudnn.version()`` as text: 90100 -> '9.1.0' (cuDNN 9 encodes
    major*10000+minor*100+patch), 8902 -> '8.9.2' (cuDNN 8: major*1000+minor*100+patch)."""
    if version is None:
        return None
    if version >= 10000:
        return f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
    return f"{version // 1000}.{version % 1000 // 100}.{version % 100}"


def format_cuda_driver_version(code: int | None) -> str | None:
    """NVML's ``nvmlSystemGetCudaDriverVersion`` code: 12040 -> '12.4'."""
    if not code:
        return None
    return f"{code // 1000}.{code % 1000 // 10}"


def gpu_list(names: list[str]) -> str:
    if not names:
        return "no GPU"
    if len(set(names)) == 1:
        return f"{len(names)} × {names[0]}" if len(names) > 1 else names[0]
    return ", ".join(names)
