"""The trace: what a profiler run left, as data.

* :mod:`.model` - a decoded trace as numpy columns (:class:`Trace`, host, runtime, GPU,
  sync and memory events, the GPUs' properties);
* :mod:`.decode` - reading a Chrome trace file (plain or gzip, old and new Kineto schemas,
  CUDA and ROCm) into that model: :func:`read_trace`, :func:`decode_trace`;
* :mod:`.folders` - a folder of per-rank traces: its trace files (:func:`trace_files`),
  and the entries named like traces that are no files;
* :mod:`.durations` - an event longer than any profiler window ends with the trace;
* :mod:`.files` - a file's JSON text (gzip inflated), and reading one ahead in a thread
  (:func:`read_ahead`);
* :mod:`.args` - the events' ``args``, decoded per kind in one batch;
* :mod:`.spans` - the cell's statement ranges and ``nn.Module`` spans, and their labels;
* :mod:`.session` - facts about the session a trace cannot show (:class:`LiveState`);
* :mod:`.errors` - :class:`TraceError`, for input that is not a readable trace.
"""

from __future__ import annotations

from gpumagic._lazy import lazy_exports
from gpumagic.profile.trace.errors import TraceError

_LAZY = {
    "Trace": ("gpumagic.profile.trace.model", "Trace"),
    "DeviceProperties": ("gpumagic.profile.trace.model", "DeviceProperties"),
    "decode_trace": ("gpumagic.profile.trace.decode", "decode_trace"),
    "read_trace": ("gpumagic.profile.trace.decode", "read_trace"),
    "read_trace_bytes": ("gpumagic.profile.trace.files", "read_trace_bytes"),
    "trace_files": ("gpumagic.profile.trace.folders", "trace_files"),
    "CodeLabels": ("gpumagic.profile.trace.spans", "CodeLabels"),
    "CodeSpans": ("gpumagic.profile.trace.spans", "CodeSpans"),
    "LiveState": ("gpumagic.profile.trace.session", "LiveState"),
}

__all__ = ["TraceError", *_LAZY]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
