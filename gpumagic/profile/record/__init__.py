"""Recording a cell: the collecting half of ``%%gpuprofile``.

* :mod:`.recorder` - the cell under ``torch.profiler`` (:class:`Recorder`, :func:`step`),
  written to a temporary Chrome trace;
* :mod:`.probe` - one profiler range per statement of the cell and the module hooks
  (:class:`CodeProbe`), so time can be charged to lines and ``nn.Module`` instances;
* :mod:`.session` - the session facts read off the namespace (:func:`capture_live_state`);
* :mod:`.finish` - the ending of a run: read the session, analyse (:func:`finish`), and
  what to say about it (:meth:`Finished.notes`);
* :mod:`.run` - one profiled cell through :func:`gpumagic.cell.run_measured`
  (:class:`ProfileRun`): recorder, probe, ending, and the live view's data
  (:class:`ProfileStatus`);
* :mod:`.repeat` - the runs of ``--repeat N`` merged into one result (:class:`Repeats`).
"""

from __future__ import annotations

from gpumagic._lazy import lazy_exports

_LAZY = {
    "Recorder": ("gpumagic.profile.record.recorder", "Recorder"),
    "RecordOptions": ("gpumagic.profile.record.recorder", "RecordOptions"),
    "RecordError": ("gpumagic.profile.record.recorder", "RecordError"),
    "step": ("gpumagic.profile.record.recorder", "step"),
    "CodeProbe": ("gpumagic.profile.record.probe", "CodeProbe"),
    "capture_live_state": ("gpumagic.profile.record.session", "capture_live_state"),
    "Finished": ("gpumagic.profile.record.finish", "Finished"),
    "finish": ("gpumagic.profile.record.finish", "finish"),
    "ProfileRun": ("gpumagic.profile.record.run", "ProfileRun"),
    "ProfileStatus": ("gpumagic.profile.record.run", "ProfileStatus"),
    "Repeats": ("gpumagic.profile.record.repeat", "Repeats"),
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
