"""The environment report as data: plain dataclasses, ``to_dict()`` for JSON, a mime bundle for display."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpumagic.environment.checks import Finding
from gpumagic.render.html import Rendered

if TYPE_CHECKING:
    import os

    from gpumagic.environment.freeze import FreezeResult
    from gpumagic.render.sections import Report


@dataclass(frozen=True)
class GpuInfo:
    """One GPU; memory in bytes. ``index`` is torch's device index when the report's
    ``cuda_available`` is True, NVML's (which ignores ``CUDA_VISIBLE_DEVICES``) otherwise.
    ``source`` says where the name and memory came from: ``"torch"`` (its device
    properties, read only once CUDA is initialised), ``"nvml"``, or ``"none"``."""

    index: int
    name: str
    source: str
    total_memory: int | None = None
    used_memory: int | None = None
    capability: str | None = None
    multiprocessors: int | None = None
    uuid: str | None = None


@dataclass(frozen=True)
class DriverInfo:
    """The NVIDIA driver: ``version`` read from ``source``; ``cuda`` is the newest CUDA it
    supports (NVML); ``checked`` says what was tried and what each answered."""

    present: bool
    version: str | None = None
    cuda: str | None = None
    source: str | None = None
    checked: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CpuInfo:
    """``logical``: ``os.cpu_count()``; ``affinity``: CPUs in this process's affinity mask;
    ``quota``: a cgroup CPU limit in CPUs (containers), None when unlimited; ``usable``:
    what this process can keep busy (the smaller of affinity and quota)."""

    logical: int | None
    affinity: int | None
    quota: float | None
    usable: int


@dataclass(repr=False)
class EnvReport(Rendered):
    """What ``%gpuenv`` shows, as data. Every value was read from the running process."""

    python: str
    python_executable: str
    platform: str
    torch_version: str | None
    torch_build: str
    cuda_runtime: str | None
    hip_runtime: str | None
    cudnn: str | None
    nccl: str | None
    cuda_available: bool
    mps_available: bool
    gpu_summary: str
    gpus: list[GpuInfo]
    driver: DriverInfo
    flags: dict[str, bool | str | None]
    env_vars: dict[str, str | None]
    cpu: CpuInfo
    torch_threads: int | None
    torch_interop_threads: int | None
    num_workers: int
    num_workers_rule: str
    packages: dict[str, str]
    findings: list[Finding]

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts, lists, strings and numbers (``json.dumps`` takes it as is)."""
        return dataclasses.asdict(self)

    def freeze(self, path: str | os.PathLike[str]) -> FreezeResult:
        """Write the installed packages, pinned, to ``path`` (``.txt``: requirements, ``.yml``:
        conda environment) with this report's Python and torch build in the header."""
        from gpumagic.environment.freeze import freeze

        return freeze(path, self)

    def _report(self) -> Report:
        from gpumagic.render.env import env_report

        return env_report(self)
