"""``%%gpuprofile`` core: load profiler traces, analyse them, diagnose, compare.

Pure analysis (no IPython, no printing). The public entry points:

* :func:`gpumagic.profile.load.load_trace` - a trace file or a directory of ranks
  -> :class:`gpumagic.profile.result.ProfileResult`
* :func:`gpumagic.profile.load.from_profiler` - a finished ``torch.profiler.profile``
* :func:`gpumagic.profile.compare.compare` - two results -> a side-by-side comparison
  (``gpumagic.compare``; here ``gpumagic.profile.compare`` is that module)
* :class:`gpumagic.profile.live.LiveState` / :func:`~gpumagic.profile.live.capture_live_state`
  - session facts that sharpen the diagnosis

Importing this package loads nothing heavy; numpy, pandas and msgspec come with the
submodules.
"""

from __future__ import annotations

import importlib
from typing import Any

from gpumagic.profile.errors import TraceError

_LAZY = {
    "load_trace": ("gpumagic.profile.load", "load_trace"),
    "from_profiler": ("gpumagic.profile.load", "from_profiler"),
    "ProfileResult": ("gpumagic.profile.result", "ProfileResult"),
    "Comparison": ("gpumagic.profile.compare", "Comparison"),
    "Finding": ("gpumagic.profile.rules", "Finding"),
    "LiveState": ("gpumagic.profile.live", "LiveState"),
    "capture_live_state": ("gpumagic.profile.live", "capture_live_state"),
    "CATEGORIES": ("gpumagic.profile.breakdown", "CATEGORIES"),
}

__all__ = ["TraceError", *_LAZY]


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'gpumagic.profile' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
