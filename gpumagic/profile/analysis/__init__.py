"""Analysis of one decoded trace: pure functions and one memoising object over its columns.

* :mod:`.trace_analysis` - :class:`Analysis`, the one object the rules and the result read;
* :mod:`.steps` - which spans are the training steps;
* :mod:`.breakdown` - the step time split into categories (kernel, memcpy, ..., idle);
* :mod:`.idle` - GPU idle gaps and what the host was doing during them;
* :mod:`.comms` - communication kernels and spans, their overlap with computation;
* :mod:`.collectives` - the collective calls: which, how big, in which group, bandwidth;
* :mod:`.precision` - tensor-core kernels and matmuls under autocast, read from the trace;
* :mod:`.lines`, :mod:`.modules` - time per statement of the cell and per ``nn.Module``;
* :mod:`.where` - the line and module where a finding's evidence sits;
* :mod:`.intervals`, :mod:`.tree` - interval arithmetic and call-tree helpers they share.
"""

from __future__ import annotations

from gpumagic._lazy import lazy_exports

_LAZY = {
    "Analysis": ("gpumagic.profile.analysis.trace_analysis", "Analysis"),
    "IdleReport": ("gpumagic.profile.analysis.trace_analysis", "IdleReport"),
    "Steps": ("gpumagic.profile.analysis.steps", "Steps"),
    "CATEGORIES": ("gpumagic.profile.analysis.breakdown", "CATEGORIES"),
    "Communication": ("gpumagic.profile.analysis.comms", "Communication"),
    "line_attribution": ("gpumagic.profile.analysis.lines", "line_attribution"),
    "module_attribution": ("gpumagic.profile.analysis.modules", "module_attribution"),
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
