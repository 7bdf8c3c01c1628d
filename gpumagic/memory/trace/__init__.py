"""``%%memtrace``'s core (the glue is gpumagic.magics.memtrace): a cell run for real, its
memory accounted to each statement, by the device's readers and the tensor census
(:mod:`gpumagic.memory.census`).

* :mod:`.device` - the traced device: what it is, how ``--device`` resolves, which tensors
  are on it;
* :mod:`.readers` - the readers of memory at statement boundaries: the CUDA caching
  allocator, the host's RSS, the census's running total (a "probe" is the call before each
  statement, :mod:`gpumagic.instrument`; the tracer answers it by reading these);
* :mod:`.tracer` - the probe's side: per-statement accounting, handing out
  :class:`~.tracer.TraceTotals`;
* :mod:`.oom` - the out-of-memory post-mortem, one job a module;
* :mod:`.result` - :class:`~.result.MemTrace`, what a user holds; :mod:`.lines` its
  DataFrame, :mod:`.timeline` its memory over time and at the peak, :mod:`.plot` its chart;
* :mod:`.run` - :class:`~.run.MemtraceRun`, one traced cell through
  :func:`gpumagic.cell.run_measured` (start, stop, finish, close, the live view's data).

Importing this package loads nothing heavy.
"""

from __future__ import annotations

from gpumagic._lazy import lazy_exports

_LAZY = {
    "MemtraceRun": ("gpumagic.memory.trace.run", "MemtraceRun"),
    "MemtraceStatus": ("gpumagic.memory.trace.run", "MemtraceStatus"),
    "MemTrace": ("gpumagic.memory.trace.result", "MemTrace"),
    "AtPeak": ("gpumagic.memory.trace.timeline", "AtPeak"),
    "TracedDevice": ("gpumagic.memory.trace.device", "TracedDevice"),
    "DeviceError": ("gpumagic.memory.trace.device", "DeviceError"),
    "resolve_device": ("gpumagic.memory.trace.device", "resolve_device"),
    "OomReport": ("gpumagic.memory.trace.oom.model", "OomReport"),
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
