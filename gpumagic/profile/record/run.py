"""One ``%%gpuprofile`` run, without IPython: a :class:`gpumagic.cell.MeasuredRun` that
records the cell under ``torch.profiler`` and analyses what it recorded.

It owns every part of the recording: the :class:`~.recorder.Recorder` (the profiler and its
temporary folder), the :class:`~.probe.CodeProbe` (a range per statement, the module hooks),
the ending (:func:`~.finish.finish`) and, while the cell runs, the live view's data
(:meth:`ProfileRun.status`). ``start`` starts the profiler, then the hooks; ``stop`` removes
the hooks, then stops the profiler; ``finish`` analyses the trace; ``close`` removes the
temporary folder. Each failure after the cell ran is a problem line of the result.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumagic.cell import Statement, error_text
from gpumagic.profile.record.finish import Finished, finish, reason
from gpumagic.profile.record.probe import CodeProbe
from gpumagic.profile.record.recorder import Recorder, RecordError, RecordOptions, current

__all__ = ["ProfileRun", "ProfileStatus"]


@dataclass(frozen=True)
class ProfileStatus:
    """What a live view shows while the cell runs."""

    elapsed_s: float
    steps: int  # gpumagic.step() marks so far
    devices: str  # what the profiler records: "CPU" or "CPU + CUDA"


class ProfileRun:
    """Profile one cell (a :class:`gpumagic.cell.MeasuredRun`); ``finish`` gives a
    :class:`~.finish.Finished` whose ``cell_error`` names the cell's exception, if any.

    ``attribute``: time per statement and per ``nn.Module`` (the cell must then be prepared
    with instrumentation); ``name``: the result's name; ``trace_path``: also save the trace
    there; ``keep_first``: keep the first marked step in the step statistics.

    Raises :class:`~.recorder.RecordError` when a profiled cell is running already (a
    ``%%gpuprofile`` inside another) and ImportError without torch, before anything is
    acquired.
    """

    def __init__(
        self,
        statements: Sequence[Statement],
        namespace: Mapping[str, Any],
        options: RecordOptions,
        *,
        attribute: bool = True,
        name: str = "cell",
        trace_path: str | None = None,
        keep_first: bool = False,
    ) -> None:
        import torch.profiler  # noqa: F401  (ImportError here: the magic says what to install)

        if current() is not None:
            raise RecordError("a %%gpuprofile cell is already being profiled")
        self.namespace = namespace
        self.name = name
        self.trace_path = trace_path
        self.keep_first = keep_first
        self.recorder = Recorder(options)
        self.probe = CodeProbe(statements, namespace) if attribute else None
        self._problems: list[str] = []  # what went wrong stopping
        self._trace: Path | None = None

    # -- the lifecycle ---------------------------------------------------------------------
    def start(self) -> CodeProbe | None:
        self.recorder.start()
        if self.probe is not None:
            self.probe.start()  # module hooks: only while the cell runs
        return self.probe

    def stop(self) -> None:
        try:
            if self.probe is not None:
                try:
                    self.probe.stop()
                except Exception as exc:  # must not hide the cell's own outcome
                    self._problems.append(
                        f"the module hooks could not all be removed ({reason(exc)})"
                    )
        finally:
            try:
                self._trace = self.recorder.stop()
            except Exception as exc:  # RecordError, or what torch raised stopping
                self._problems.append(reason(exc))

    def finish(self, error: BaseException | None) -> Finished:
        done = Finished()
        if self._trace is not None:
            try:
                done = finish(
                    self.recorder,
                    self._trace,
                    self.namespace,
                    self.probe,
                    name=self.name,
                    trace_path=self.trace_path,
                    keep_first=self.keep_first,
                )
            except Exception as exc:  # a bug of ours must not hide the cell's own outcome
                done.problems.append(
                    f"the profile could not be built ({type(exc).__name__}: {exc})"
                )
        done.problems[:0] = self._problems
        done.cell_error = error_text(error) if error is not None else ""
        return done

    def close(self) -> None:
        """The temporary folder goes; and, where ``stop`` was cut short, the hooks and the
        profiler (each release is a no-op the second time)."""
        try:
            if self.probe is not None and self.probe.modules is not None:
                self.probe.modules.remove()
        finally:
            self.recorder.cleanup()

    # -- the live view's data (any thread) -------------------------------------------------
    def status(self) -> ProfileStatus:
        recorder = self.recorder
        elapsed = time.perf_counter() - recorder.started if recorder.started else 0.0
        return ProfileStatus(elapsed, recorder.steps, "CPU + CUDA" if recorder.cuda else "CPU")
