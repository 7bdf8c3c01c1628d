"""``gpumagic.env()``: the GPU/CUDA/torch environment as data, with its known traps flagged.

``env()`` imports torch (the user is a torch user) and asks CUDA only whether it is
available and what the devices are; it creates no CUDA context. ``EnvReport.freeze(path)``
writes the installed packages, pinned, as requirements.txt or a conda environment.yml;
``save(path)`` the report as JSON for ``env_diff`` (``saved.py``, ``diff.py``); ``check/``
is ``%gpucheck``'s room.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gpumagic.environment.checks import Finding
from gpumagic.environment.freeze import FreezeError, FreezeResult
from gpumagic.environment.freeze import freeze as write_freeze
from gpumagic.environment.report import CpuInfo, DriverInfo, EnvReport, GpuInfo

if TYPE_CHECKING:
    from pathlib import Path

    from gpumagic.environment.check.result import GpuCheck

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
    "save",
]


def env() -> EnvReport:
    """Read the environment now: GPUs, driver, torch build and flags, CPUs, packages, traps."""
    from gpumagic.environment.collect import collect

    return collect()


def freeze(path: str | os.PathLike[str], report: EnvReport | None = None) -> FreezeResult:
    """Write the pinned environment to ``path``; ``report`` supplies the Python and torch
    build for the header (``env()`` is read now when not given)."""
    return write_freeze(path, report if report is not None else env())


def save(
    path: str | os.PathLike[str], report: EnvReport | None = None, check: GpuCheck | None = None
) -> Path:
    """Write ``report`` (``env()`` read now when not given) as JSON with ``check`` (a
    ``gpumagic.gpucheck()`` result) beside it, for ``gpumagic.env_diff`` and ``%gpuenv --diff``."""
    from gpumagic.environment.saved import save as write

    return write(path, report if report is not None else env(), check)
