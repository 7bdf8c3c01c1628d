"""Reading the running environment: torch's build and flags, the NVIDIA driver, CPUs, packages.

Each reader returns plain values and never raises for a missing piece (no torch, no driver,
no NVML library, an unreadable ``/proc`` file): the report says what was missing instead.
torch's CUDA state is never initialised here: ``torch.cuda.is_available()`` and
``device_count()`` leave it alone, while ``get_device_properties()`` would run
``_lazy_init``, after which every ``fork`` (DataLoader workers, multiprocessing) fails with
"Cannot re-initialize CUDA in forked subprocess". So the GPUs' names and memory come from
NVML, mapped to torch's indexes through ``CUDA_VISIBLE_DEVICES``; torch's own device
properties are read only when something else has initialised CUDA already.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from gpumagic.environment import checks
from gpumagic.environment.checks import Finding
from gpumagic.environment.report import CpuInfo, DriverInfo, EnvReport, GpuInfo

# Shown in the report when installed, in this order: the stack a notebook GPU user runs on.
KEY_PACKAGES = (
    "torch",
    "torchvision",
    "torchaudio",
    "triton",
    "numpy",
    "pandas",
    "matplotlib",
    "ipython",
    "ipykernel",
    "ipywidgets",
    "jupyterlab",
    "notebook",
    "psutil",
    "nvidia-ml-py",
    "pynvml",
    "msgspec",
    "gpumagic",
)

# Environment variables that change what torch does on the GPU; shown set, empty or unset.
ENV_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "CUDA_LAUNCH_BLOCKING",
    "CUBLAS_WORKSPACE_CONFIG",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
)

PROC_DRIVER = Path("/proc/driver/nvidia/version")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def collect() -> EnvReport:
    """Read everything and apply the rules in :mod:`gpumagic.environment.checks`."""
    env_vars = {name: os.environ.get(name) for name in ENV_VARS}
    nvml = read_nvml()
    driver = read_driver(nvml)
    t = read_torch(nvml)
    cpu = read_cpu()
    gpu_count = len(t.gpus) if t.cuda_available else 0
    workers, rule = checks.suggest_num_workers(cpu.usable, gpu_count)
    shown_gpus = t.gpus if t.cuda_available else nvml.gpus
    findings = _findings(t, driver, cpu, env_vars, shown_gpus)
    return EnvReport(
        python=platform.python_version(),
        python_executable=sys.executable,
        platform=platform.platform(),
        torch_version=t.version,
        torch_build=t.build,
        cuda_runtime=t.cuda,
        hip_runtime=t.hip,
        cudnn=t.cudnn,
        nccl=t.nccl,
        cuda_available=t.cuda_available,
        mps_available=t.mps_available,
        gpu_summary=gpu_summary(t, driver, env_vars, shown_gpus),
        gpus=shown_gpus,
        driver=driver,
        flags=t.flags,
        env_vars=env_vars,
        cpu=cpu,
        torch_threads=t.threads,
        torch_interop_threads=t.interop_threads,
        num_workers=workers,
        num_workers_rule=rule,
        packages=read_packages(),
        findings=findings,
    )


# --- torch -------------------------------------------------------------------------------


@dataclass
class TorchState:
    version: str | None = None
    build: str = "not installed"
    cuda: str | None = None
    hip: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    cuda_available: bool = False
    mps_available: bool = False
    gpus: list[GpuInfo] = field(default_factory=list)
    flags: dict[str, bool | str | None] = field(default_factory=dict)
    threads: int | None = None
    interop_threads: int | None = None
    warnings: list[str] = field(default_factory=list)
    import_error: str | None = None


def read_torch(nvml: NvmlState | None = None) -> TorchState:
    state = TorchState()
    try:
        import torch
    except ModuleNotFoundError as exc:
        if exc.name != "torch":  # installed, but a dependency of it is missing
            _broken(state, exc)
        return state
    except (ImportError, OSError) as exc:  # e.g. a CUDA library the wheel links against is missing
        _broken(state, exc)
        return state
    state.version = str(torch.__version__)
    state.cuda = torch.version.cuda
    state.hip = getattr(torch.version, "hip", None)
    if state.hip:
        state.build = f"ROCm {state.hip}"
    elif state.cuda:
        state.build = f"CUDA {state.cuda}"
    else:
        state.build = "CPU-only"
    # torch reports driver problems as warnings from is_available()/device queries; keep them
    # for the report instead of letting them scroll past above it.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state.cuda_available = bool(_try(torch.cuda.is_available, False))
        if state.cuda_available:
            state.gpus = _try(partial(_torch_gpus, torch, nvml), [])
        if _try(torch.backends.cudnn.is_available, False):
            state.cudnn = checks.format_cudnn(_try(torch.backends.cudnn.version, None))
        if state.cuda:
            state.nccl = _format_nccl(_try(torch.cuda.nccl.version, None))
        state.mps_available = bool(_try(torch.backends.mps.is_available, False))
    state.warnings = [str(w.message) for w in caught]
    state.flags = _torch_flags(torch)
    state.threads = _try(torch.get_num_threads, None)
    state.interop_threads = _try(torch.get_num_interop_threads, None)
    return state


def _broken(state: TorchState, exc: BaseException) -> None:
    try:
        state.version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        state.version = "?"
    state.import_error = f"{type(exc).__name__}: {exc}"
    state.build = "fails to import"


def _torch_flags(torch: Any) -> dict[str, bool | str | None]:
    cudnn = torch.backends.cudnn
    matmul = torch.backends.cuda.matmul
    readers: dict[str, Callable[[], Any]] = {
        "torch.backends.cudnn.enabled": lambda: cudnn.enabled,
        "torch.backends.cudnn.benchmark": lambda: cudnn.benchmark,
        "torch.backends.cudnn.deterministic": lambda: cudnn.deterministic,
        "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled,
        "torch.is_deterministic_algorithms_warn_only_enabled()": (
            torch.is_deterministic_algorithms_warn_only_enabled
        ),
        "torch.backends.cuda.matmul.allow_tf32": lambda: matmul.allow_tf32,
        "torch.backends.cudnn.allow_tf32": lambda: cudnn.allow_tf32,
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision,
    }
    # torch 2.9 added per-backend fp32_precision settings beside allow_tf32; show them where they exist.
    if hasattr(matmul, "fp32_precision"):
        readers["torch.backends.cuda.matmul.fp32_precision"] = lambda: matmul.fp32_precision
    if hasattr(cudnn, "fp32_precision"):
        readers["torch.backends.cudnn.fp32_precision"] = lambda: cudnn.fp32_precision
    flags: dict[str, bool | str | None] = {}
    for name, read in readers.items():
        try:
            value = read()
        except Exception as exc:  # e.g. torch refusing to mix the legacy and new TF32 APIs
            value = f"error: {exc}"
        flags[name] = value if isinstance(value, (bool, str)) or value is None else str(value)
    return flags


def _torch_gpus(torch: Any, nvml: NvmlState | None) -> list[GpuInfo]:
    """The GPUs torch can use, by torch's index, without initialising CUDA (module docstring)."""
    count = int(_try(torch.cuda.device_count, 0) or 0)
    if _try(torch.cuda.is_initialized, False):
        gpus = _try(partial(_gpus_from_torch, torch, nvml, count), None)
        if gpus is not None:
            return list(gpus)
    return _gpus_from_nvml(count, nvml)


def _gpus_from_torch(torch: Any, nvml: NvmlState | None, count: int) -> list[GpuInfo]:
    by_uuid = {_uuid_key(g.uuid): g for g in nvml.gpus} if nvml is not None else {}
    gpus = []
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        uuid = str(props.uuid) if getattr(props, "uuid", None) is not None else None
        # NVML's used-memory counts every process's allocations; torch.cuda.mem_get_info would
        # too, but it creates a CUDA context (hundreds of MiB) on each GPU it is asked about.
        seen = by_uuid.get(_uuid_key(uuid))
        gpus.append(
            GpuInfo(
                index=i,
                name=str(props.name),
                source="torch",
                total_memory=int(props.total_memory),
                used_memory=seen.used_memory if seen is not None else None,
                capability=f"{props.major}.{props.minor}",
                multiprocessors=getattr(props, "multi_processor_count", None),
                uuid=uuid,
            )
        )
    return gpus


def _gpus_from_nvml(count: int, nvml: NvmlState | None) -> list[GpuInfo]:
    """torch's ``count`` devices described by NVML, in the order ``CUDA_VISIBLE_DEVICES``
    gives them (the NVML index is not torch's); unnamed when NVML cannot say."""
    from gpumagic.monitor.devices import parse_visible_devices

    nvml_gpus = nvml.gpus if nvml is not None else []
    order, _ = parse_visible_devices(
        os.environ.get("CUDA_VISIBLE_DEVICES"), [g.uuid for g in nvml_gpus]
    )
    gpus = []
    for i in range(count):
        if i < len(order) and order[i] < len(nvml_gpus):
            seen = nvml_gpus[order[i]]
            gpus.append(dataclasses.replace(seen, index=i))
        else:  # e.g. a MIG instance, or NVML unavailable
            gpus.append(GpuInfo(index=i, name="?", source="none"))
    return gpus


def _uuid_key(uuid: str | None) -> str | None:
    # torch prints UUIDs bare, NVML with a "GPU-" prefix.
    if not uuid:
        return None
    u = uuid.lower()
    return u[4:] if u.startswith("gpu-") else u


def _format_nccl(version: Any) -> str | None:
    if version is None:
        return None
    if isinstance(version, tuple):
        return ".".join(str(p) for p in version)
    return str(version)


# --- NVIDIA driver -------------------------------------------------------------------------


@dataclass
class NvmlState:
    driver: str | None = None
    cuda: str | None = None
    gpus: list[GpuInfo] = field(default_factory=list)
    error: str | None = None


def read_nvml() -> NvmlState:
    """Driver version and GPUs through NVML (``pynvml`` from nvidia-ml-py), imported here only.

    ``nvmlInit``/``nvmlShutdown`` are reference-counted by NVML, so a balanced pair here does
    not disturb a sampler (``%gpuwatch``) that keeps NVML initialised.
    """
    try:
        import pynvml
    except ImportError:
        return NvmlState(error="nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return NvmlState(error=str(exc) or type(exc).__name__)
    try:
        state = NvmlState(driver=_text(_try(pynvml.nvmlSystemGetDriverVersion, None)))
        state.cuda = checks.format_cuda_driver_version(
            _try(pynvml.nvmlSystemGetCudaDriverVersion_v2, None)
        )
        for i in range(_try(pynvml.nvmlDeviceGetCount, 0)):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            except Exception:  # a lost or inaccessible GPU: list the others
                continue
            mem = _memory_info(pynvml, handle)
            cc = _try(partial(pynvml.nvmlDeviceGetCudaComputeCapability, handle), None)
            state.gpus.append(
                GpuInfo(
                    index=i,
                    name=_text(_try(partial(pynvml.nvmlDeviceGetName, handle), None)) or "?",
                    source="nvml",
                    total_memory=int(mem.total) if mem is not None else None,
                    used_memory=int(mem.used) if mem is not None else None,
                    capability=f"{cc[0]}.{cc[1]}" if cc else None,
                    uuid=_text(_try(partial(pynvml.nvmlDeviceGetUUID, handle), None)),
                )
            )
        return state
    finally:
        _try(pynvml.nvmlShutdown, None)


def _memory_info(pynvml: Any, handle: Any) -> Any:
    """NVML's memory info as nvidia-smi (R510+) and ``%gpuwatch`` report it: the
    v2 struct's "used" leaves out the driver's reserved memory, which v1's includes (a
    few hundred MiB "used" on an idle H100). v1 only where v2 is missing."""
    version = getattr(pynvml, "nvmlMemory_v2", None)
    if version is not None:
        info = _try(partial(pynvml.nvmlDeviceGetMemoryInfo, handle, version=version), None)
        if info is not None:
            return info
    return _try(partial(pynvml.nvmlDeviceGetMemoryInfo, handle), None)


def read_driver(nvml: NvmlState) -> DriverInfo:
    """Is an NVIDIA driver loaded, which version: NVML, then ``/proc``, then ``nvidia-smi``."""
    checked = []
    if nvml.driver:
        return DriverInfo(True, nvml.driver, nvml.cuda, "NVML", [f"NVML: driver {nvml.driver}"])
    checked.append(f"NVML: {nvml.error or 'no driver version'}")
    try:
        text = PROC_DRIVER.read_text()
    except OSError as exc:
        checked.append(f"{PROC_DRIVER}: {exc.strerror or 'unreadable'}")
    else:
        version = checks.parse_proc_driver_version(text)
        checked.append(f"{PROC_DRIVER}: {version or 'no version line'}")
        return DriverInfo(True, version, None, str(PROC_DRIVER), checked)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        checked.append("nvidia-smi: not on PATH")
        return DriverInfo(False, checked=checked)
    version = _nvidia_smi_driver(smi)
    checked.append(f"nvidia-smi: {version or 'present, no driver version'}")
    return DriverInfo(True, version, None, "nvidia-smi", checked)


def _nvidia_smi_driver(smi: str) -> str | None:
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.stdout.strip().splitlines()[:1]
    return first[0].strip() if out.returncode == 0 and first else None


# --- CPUs ----------------------------------------------------------------------------------


def read_cpu() -> CpuInfo:
    logical = os.cpu_count()
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    quota = read_cgroup_quota()
    return CpuInfo(logical, affinity, quota, checks.usable_cpus(logical, affinity, quota))


def read_cgroup_quota(
    root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")
) -> float | None:
    """The tightest CPU quota (in CPUs) on this process's cgroup path, v2 or v1; None if unlimited.

    Docker's ``--cpus`` and Kubernetes CPU limits set this while the affinity mask still shows
    every core, so pools sized by ``os.cpu_count()`` oversubscribe.
    """
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        files: tuple[str, ...]
        if controllers == "":  # cgroup v2 unified hierarchy
            base, files = root, ("cpu.max",)
        elif "cpu" in controllers.split(","):
            base, files = root / controllers, ("cpu.cfs_quota_us", "cpu.cfs_period_us")
            if not base.exists():
                base = root / "cpu"
        else:
            continue
        quotas.extend(_quotas_up_the_tree(base, rel.strip("/"), files))
    return min(quotas) if quotas else None


def _quotas_up_the_tree(base: Path, rel: str, files: tuple[str, ...]) -> list[float]:
    # A limit on any ancestor cgroup applies too; inside a container the path is often "/".
    found = []
    parts = [p for p in rel.split("/") if p]
    for depth in range(len(parts), -1, -1):
        d = base.joinpath(*parts[:depth])
        try:
            if len(files) == 1:
                q = checks.parse_cpu_max(d.joinpath(files[0]).read_text())
            else:
                quota = int(d.joinpath(files[0]).read_text())
                period = int(d.joinpath(files[1]).read_text())
                q = quota / period if quota > 0 and period > 0 else None
        except (OSError, ValueError):
            continue
        if q is not None:
            found.append(q)
    return found


# --- packages ------------------------------------------------------------------------------


def read_packages(names: tuple[str, ...] = KEY_PACKAGES) -> dict[str, str]:
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    if "gpumagic" not in found:  # running from a source tree that is not installed
        from gpumagic._version import __version__

        found["gpumagic"] = __version__
    return found


# --- summary and findings ------------------------------------------------------------------


def gpu_summary(
    t: TorchState, driver: DriverInfo, env_vars: dict[str, str | None], gpus: list[GpuInfo]
) -> str:
    """One sentence: which GPUs torch can use, or why it can use none."""
    if t.version is None:
        return "torch is not installed."
    if t.import_error:
        return f"No GPU: torch {t.version} is installed but fails to import ({t.import_error})."
    if t.cuda_available and t.gpus:
        names = checks.gpu_list([g.name for g in t.gpus])
        return f"torch {t.version} ({t.build}) sees {names}."
    drv = f" {driver.version}" if driver.version else ""
    if t.hip:
        return f"No GPU: torch {t.version} is a ROCm build and torch.cuda.is_available() is False."
    if not t.cuda:
        mps = " Apple's MPS backend is available." if t.mps_available else ""
        if driver.present:
            seen = f", which sees {checks.gpu_list([g.name for g in gpus])}" if gpus else ""
            return (
                f"No GPU for torch: torch {t.version} is a CPU-only build, although the NVIDIA "
                f"driver{drv} is loaded{seen}.{mps}"
            )
        return f"No GPU: torch {t.version} is a CPU-only build and no NVIDIA driver was found.{mps}"
    visible = env_vars.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and (not visible.strip() or visible.strip().startswith("-1")):
        return f"No GPU: CUDA_VISIBLE_DEVICES={visible!r} hides every GPU from CUDA."
    if not driver.present:
        return (
            f"No GPU: torch {t.version} is built for CUDA {t.cuda} but no NVIDIA driver was found."
        )
    too_old = checks.driver_too_old(driver.version, t.cuda)
    if too_old is not None and too_old.level == "error":
        return f"No GPU: the NVIDIA driver{drv} is too old for CUDA {t.cuda}."
    said = f" torch said: {t.warnings[0]}" if t.warnings else ""
    return (
        f"No GPU: torch.cuda.is_available() is False although the NVIDIA driver{drv} is "
        f"loaded.{said}"
    )


def _findings(
    t: TorchState,
    driver: DriverInfo,
    cpu: CpuInfo,
    env_vars: dict[str, str | None],
    gpus: list[GpuInfo],
) -> list[Finding]:
    flags = t.flags
    deterministic = flags.get("torch.are_deterministic_algorithms_enabled()") is True
    allow_tf32 = flags.get("torch.backends.cuda.matmul.allow_tf32")
    precision = flags.get("torch.get_float32_matmul_precision()")
    candidates = [
        checks.cpu_only_torch(
            t.version,
            t.cuda,
            t.hip,
            driver.version,
            driver.present,
            [g.name for g in gpus],
            driver.cuda,
        ),
        checks.driver_too_old(driver.version, t.cuda) if not t.hip else None,
        checks.visible_devices(env_vars.get("CUDA_VISIBLE_DEVICES")),
        checks.deterministic_with_benchmark(
            deterministic,
            flags.get("torch.backends.cudnn.deterministic") is True,
            flags.get("torch.backends.cudnn.benchmark") is True,
        ),
        checks.cublas_workspace(deterministic, t.cuda, env_vars.get("CUBLAS_WORKSPACE_CONFIG")),
        checks.tf32_off(
            [g.capability for g in t.gpus if g.capability] if t.cuda_available else [],
            allow_tf32 if isinstance(allow_tf32, bool) else None,
            precision if isinstance(precision, str) else None,
        ),
        checks.threads_oversubscribed(t.threads, cpu.usable),
        checks.cpu_quota_below_visible(cpu.affinity or cpu.logical, cpu.quota),
        checks.alloc_conf_conflict(
            env_vars.get("PYTORCH_ALLOC_CONF"), env_vars.get("PYTORCH_CUDA_ALLOC_CONF")
        ),
        checks.launch_blocking(env_vars.get("CUDA_LAUNCH_BLOCKING")),
    ]
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted((f for f in candidates if f is not None), key=lambda f: order.get(f.level, 3))


# --- helpers -------------------------------------------------------------------------------


def _try(fn: Callable[[], Any], default: Any) -> Any:
    try:
        return fn()
    except Exception:
        return default


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
