"""``%%gpuprofile`` core: record a cell, load any profiler trace, analyse, diagnose, compare.

Pure analysis (no IPython, no printing), laid out by stage; each stage imports only the
ones before it (``import-linter`` checks it, see ``pyproject.toml``):

* :mod:`~gpumagic.profile.trace` - the data model of a decoded trace, the decoder, the
  cell's statement and module spans, the session facts;
* :mod:`~gpumagic.profile.analysis` - steps, the step-time breakdown, GPU idle,
  communication, time per line and per module, locating evidence in the code;
* :mod:`~gpumagic.profile.rules` - the diagnosis: one module per family of findings;
* :mod:`~gpumagic.profile.result` (its headline numbers: :mod:`~gpumagic.profile.summary`),
  :mod:`~gpumagic.profile.load`, :mod:`~gpumagic.profile.compare` - what a user holds, and how
  it is made;
* :mod:`~gpumagic.profile.record` - recording a cell under ``torch.profiler`` and
  finishing the run (it hands the trace to ``load``, so it sits on top).

The public entry points are the names below. Importing this package loads nothing heavy.
"""

from __future__ import annotations

from gpumagic._lazy import lazy_exports
from gpumagic.profile.trace.errors import TraceError

_LAZY = {
    "load_trace": ("gpumagic.profile.load", "load_trace"),
    "from_profiler": ("gpumagic.profile.load", "from_profiler"),
    "RankTaskError": ("gpumagic.profile.ranks", "RankTaskError"),
    "ProfileResult": ("gpumagic.profile.result", "ProfileResult"),
    "ProfileSummary": ("gpumagic.profile.summary", "ProfileSummary"),
    "Comparison": ("gpumagic.profile.compare", "Comparison"),
    "Finding": ("gpumagic.profile.rules.base", "Finding"),
    "LiveState": ("gpumagic.profile.trace.session", "LiveState"),
    "capture_live_state": ("gpumagic.profile.record.session", "capture_live_state"),
    "CATEGORIES": ("gpumagic.profile.analysis.breakdown", "CATEGORIES"),
}

__all__ = ["TraceError", *_LAZY]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
