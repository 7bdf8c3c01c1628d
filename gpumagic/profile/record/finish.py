"""After a profiled cell ran and the recorder stopped: read the session, analyse the trace.

This is the core half of ``%%gpuprofile``'s ending (the magic only shows what comes out).
Each step that can fail once the cell has run is caught on its own and said, so what can
be kept is kept: a profile without the session's settings (reading a torch flag can raise,
see :mod:`.session`), a trace whose analysis failed (left on disk, its path in the
problem), the stop of a profiler that raised (:class:`~.run.ProfileRun` says that one).
Nothing here may hide the cell's own outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpumagic.interrupts import interruptible
from gpumagic.profile import load
from gpumagic.profile.record import session as live
from gpumagic.profile.record.recorder import RecordError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpumagic.profile.record.probe import CodeProbe
    from gpumagic.profile.record.recorder import Recorder
    from gpumagic.profile.result import ProfileResult
    from gpumagic.profile.trace.session import LiveState
    from gpumagic.profile.trace.spans import CodeLabels


def reason(exc: BaseException) -> str:
    """An exception as a problem line: a RecordError says it all, others name their type."""
    return str(exc) if isinstance(exc, RecordError) else f"{type(exc).__name__}: {exc}"


@dataclass
class Finished:
    """What a profiled cell left: the result (None when nothing could be analysed), the
    problems met on the way, whether the analysis completed (a partial result is kept
    for the user, but not shown as a report), and the cell's own error."""

    result: ProfileResult | None = None
    problems: list[str] = field(default_factory=list)
    analysed: bool = False
    cell_error: str = ""  # "ValueError: ..." when the cell failed ("" when it completed)

    @property
    def reported(self) -> bool:
        """The analysis completed: the result is shown as a report."""
        return self.analysed and self.result is not None

    def notes(self) -> list[str]:
        """What to say above the report, or in its place: that the cell failed (the profile
        covers what ran before), each problem; and, without a report and without a problem
        that says why, that no profile was recorded."""
        notes = []
        if self.cell_error:
            notes.append(
                f"The cell failed ({self.cell_error}); the profile covers what ran before."
            )
        notes += [f"%%gpuprofile: {p}" for p in self.problems]
        if not self.reported and not self.problems:
            notes.append("%%gpuprofile: no profile was recorded")
        return notes


def finish(
    recorder: Recorder,
    trace: Path,
    namespace: Mapping[str, Any],
    probe: CodeProbe | None = None,
    *,
    name: str,
    trace_path: str | None = None,
    keep_first: bool = False,
) -> Finished:
    """Analyse ``trace``, what the stopped ``recorder`` wrote, with the session facts of
    ``namespace`` and the cell's statement and module labels from ``probe``; the result is
    called ``name``. ``trace_path``: also save the trace there (``--trace``). Never raises
    for a failure after the cell ran: it is a problem line of the returned
    :class:`Finished`. The analysis may be interrupted (Ctrl-C,
    :func:`gpumagic.cell.interruptible`): it holds nothing the recorder does not release."""
    out = Finished()
    state = None
    try:
        state = live.capture_live_state(namespace)
    except Exception as exc:
        out.problems.append(
            f"the session's settings could not be read ({reason(exc)}); "
            "the diagnosis uses the trace alone"
        )
    labels = None
    if probe is not None:
        try:
            labels = probe.labels()
        except Exception as exc:
            out.problems.append(f"the cell's lines and modules could not be named ({reason(exc)})")
    saved: Path | None = None
    if trace_path:
        try:
            saved = recorder.save(trace_path, labels.to_json() if labels is not None else None)
        except Exception as exc:
            out.problems.append(f"the trace could not be written to {trace_path} ({reason(exc)})")
    try:
        with interruptible():
            _analyse(out, recorder, trace, state, probe, labels, name, keep_first)
    except Exception as exc:
        try:
            kept = (
                f"the trace is kept at {saved or recorder.keep()} "
                "(%gpuprofile --load PATH, or open it in Perfetto)"
            )
        except Exception as keep_exc:
            kept = f"the trace could not be kept ({reason(keep_exc)})"
        out.problems.append(
            f"the analysis failed ({reason(exc)}); {kept}"
            + ("; the partial result is in _gpuprofile" if out.result is not None else "")
        )
        return out
    out.analysed = True
    return out


def _analyse(
    out: Finished,
    recorder: Recorder,
    trace: Path,
    state: LiveState | None,
    probe: CodeProbe | None,
    labels: CodeLabels | None,
    name: str,
    keep_first: bool,
) -> None:
    # Without a schedule the first marked step holds the first-call setup (cuBLAS/cuDNN
    # handles, lazy CUDA module loading, autotuning), which no later step repeats.
    skip_first = recorder.marked_steps and not recorder.options.scheduled and not keep_first
    out.result = load.load_trace(
        trace,
        state,
        step_marks=recorder.marked_steps,
        mark_limit=recorder.mark_limit,
        skip_first=skip_first,
        labels=labels,
    )
    out.result.name = name
    st = out.result.primary.steps
    in_trace = len(st) + int(st.first_left_out) + st.dropped
    out.result.notes[:0] = recorder.notes(
        out.result.primary.trace, in_trace if st.source == "ProfilerStep" else 0
    ) + (probe.notes if probe is not None else [])
    # analyse now, so a failure is told here and not by a traceback in the report
    _ = out.result.summary, out.result.findings
