"""``gpumagic.env()``: the GPU/CUDA/torch environment as data, with its known traps flagged.

``env()`` imports torch (the user is a torch user) and asks CUDA only whether it is
available and what the devices are; it creates no CUDA context. ``EnvReport.freeze(path)``
writes the installed packages, pinned, as requirements.txt or a conda environment.yml.
"""

from __future__ import annotations

import os

from gpumagic.environment.checks import Finding
from gpumagic.environment.freeze import FreezeError, FreezeResult
from gpumagic.environment.freeze import freeze as write_freeze
from gpumagic.environment.report import CpuInfo, DriverInfo, EnvReport, GpuInfo

__all__ = [
    "CpuInfo",
    "DriverInfo",
    "EnvReport",
    "Finding",
    "FreezeError",
    "FreezeResult",
    "GpuInfo",
    "env",
    "freeze",
]


def env() -> EnvReport:
    """Read the environment now: GPUs, driver, torch build and flags, CPUs, packages, traps."""
    from gpumagic.environment.collect import collect

    return collect()


def freeze(path: str | os.PathLike[str], report: EnvReport | None = None) -> FreezeResult:
    """Write the pinned environment to ``path``; ``report`` supplies the Python and torch
    build for the header (``env()`` is read now when not given)."""
    return write_freeze(path, report if report is not None else env())
