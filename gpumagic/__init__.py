"""gpumagic: the advanced user's GPU toolbox for PyTorch in IPython/Jupyter.

``%load_ext gpumagic`` registers ``%%memtrace``/``%memtrace``, ``%%memfit``, ``%%gpuprofile``,
``%gpuwatch``, ``%gpuenv``, ``%gpucheck`` and ``%gpuselect``. The same analyses are callable from scripts through the
names below. Importing this package is cheap: torch, pandas and matplotlib load only
when a feature runs.
"""

from __future__ import annotations

import importlib
from typing import Any

from gpumagic._version import __version__

# public name -> (module, attribute); resolved on first use so `import gpumagic` stays fast
_LAZY = {
    "MemTrace": ("gpumagic.memory.trace.result", "MemTrace"),
    "MemFit": ("gpumagic.memory.fit.result", "MemFit"),
    "memfit": ("gpumagic.memory.fit.api", "memfit"),
    "load_trace": ("gpumagic.profile.load", "load_trace"),
    "compare": ("gpumagic.profile.compare", "compare"),
    "difference": ("gpumagic.profile.analysis.noise", "difference"),
    "step": ("gpumagic.profile.record.recorder", "step"),
    "watch": ("gpumagic.monitor", "watch"),
    "env": ("gpumagic.environment", "env"),
    "env_diff": ("gpumagic.environment.diff", "env_diff"),
    "gpucheck": ("gpumagic.environment.check", "gpucheck"),
    "GpuCheck": ("gpumagic.environment.check.result", "GpuCheck"),
    "select_gpus": ("gpumagic.monitor.choose", "select_gpus"),
    "serve_metrics": ("gpumagic.monitor.exporter", "serve_metrics"),
}

__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension", *_LAZY]


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'gpumagic' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def load_ipython_extension(ipython: Any) -> None:
    from gpumagic.magics import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from gpumagic.magics import unload

    unload(ipython)
