"""Recording a cell under ``torch.profiler``: the collecting half of ``%%gpuprofile``.

The recorder writes a Chrome trace and the analysis reads it back with the same
loader that reads saved traces, so a cell profiled here and a trace from a cluster
job are analysed by one code path.

Steps: ``gpumagic.step()`` inside the cell calls the profiler's ``step()``, which
closes ``ProfilerStep#N`` and opens the next. The profiler only writes those spans
when it has a schedule, so the recorder always passes one: the user's
``--wait/--warmup/--active`` when given, else "record everything". When the cell
never calls ``step()``, the single ``ProfilerStep#0`` that spans the whole cell says
nothing, and the analysis is told to fall back to DataLoader iterations or one step.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_current: Recorder | None = None
_lock = threading.Lock()


def step() -> None:
    """Mark a step boundary inside a ``%%gpuprofile`` cell (like ``prof.step()``).

    Call it at the end of each training iteration. Outside a profiled cell it does
    nothing, so a notebook can keep the call when it runs without the magic.
    """
    recorder = _current
    if recorder is not None:
        recorder.step()


def current() -> Recorder | None:
    """The recorder of the cell being profiled now, if any."""
    return _current


class RecordError(RuntimeError):
    """The profiler recorded nothing usable (e.g. the schedule's window never opened)."""


@dataclass(frozen=True)
class RecordOptions:
    memory: bool = False
    shapes: bool = False
    stack: bool = False
    flops: bool = False
    wait: int | None = None
    warmup: int | None = None
    active: int | None = None

    @property
    def scheduled(self) -> bool:
        return self.active is not None or self.wait is not None or self.warmup is not None


class Recorder:
    """One profiled cell: ``start()``, the cell runs (calling :func:`step`), ``stop()``."""

    def __init__(self, options: RecordOptions) -> None:
        self.options = options
        self.steps = 0  # step() calls so far
        self.started = 0.0
        self.elapsed_s = 0.0
        self.cuda = False
        self._prof: Any = None
        self._dir = Path(tempfile.mkdtemp(prefix="gpumagic-profile-"))
        self._trace: Path | None = None

    @property
    def marked_steps(self) -> bool:
        """True when the cell called :func:`step` (so ProfilerStep spans are real steps)."""
        return self.steps > 0

    @property
    def mark_limit(self) -> int | None:
        """Without a schedule every ``step()`` closes ``ProfilerStep#N`` and opens the next,
        so the last span is the cell's tail: only the first ``steps`` spans are steps. With a
        schedule the recorded window ends on a ``step()`` call and has no tail."""
        return None if self.options.scheduled else self.steps

    def start(self) -> Recorder:
        global _current
        import torch
        from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule

        opts = self.options
        # Kineto in recent torch prints "USDT: ... profiler_start/stop" lines on stderr at
        # every start and stop, which ipykernel shows in red under every profiled cell. Its
        # levels put those above errors, so only "off" (6) hides them; a KINETO_LOG_LEVEL the
        # user set wins. Read once, when the process first starts the profiler.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        self.cuda = bool(torch.cuda.is_available())
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        if opts.scheduled:
            with warnings.catch_warnings():
                # torch warns when warmup is 0; the user chose the schedule
                warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
                plan = schedule(
                    wait=opts.wait or 0, warmup=opts.warmup or 0, active=opts.active or 1, repeat=1
                )
        else:

            def plan(step: int) -> ProfilerAction:  # record everything, with step spans
                return ProfilerAction.RECORD

        self._prof = profile(
            activities=activities,
            schedule=plan,
            on_trace_ready=self._on_ready,
            record_shapes=opts.shapes,
            profile_memory=opts.memory,
            with_stack=opts.stack,
            with_flops=opts.flops,
        )
        with _lock:
            if _current is not None:
                raise RecordError("a %%gpuprofile cell is already being profiled")
            self._prof.start()
            _current = self
        self.started = time.perf_counter()
        return self

    def step(self) -> None:
        self.steps += 1
        self._prof.step()

    def _on_ready(self, prof: Any) -> None:
        path = self._dir / f"trace_{len(list(self._dir.iterdir()))}.json"
        prof.export_chrome_trace(str(path))
        if self._trace is None:  # keep the first window (repeat=1 gives one anyway)
            self._trace = path

    def stop(self) -> Path:
        """Stop the profiler (always, also after an error) and return the trace written."""
        global _current
        try:
            if self._prof is not None:
                self._prof.stop()
        finally:
            with _lock:
                if _current is self:
                    _current = None
            self.elapsed_s = time.perf_counter() - self.started if self.started else 0.0
        if self._trace is None or not self._trace.exists():
            opts = self.options
            if opts.scheduled:
                need = (opts.wait or 0) + (opts.warmup or 0) + 1
                raise RecordError(
                    f"nothing was recorded: the schedule (wait={opts.wait or 0}, warmup={opts.warmup or 0}, "
                    f"active={opts.active or 1}) needs at least {need} gpumagic.step() calls before it "
                    f"records, and the cell made {self.steps}"
                )
            raise RecordError("the profiler wrote no trace")
        return self._trace

    def save(self, destination: str | os.PathLike[str]) -> Path:
        """Copy the recorded trace to ``destination`` (gzip if it ends in .gz); open it in Perfetto."""
        if self._trace is None:
            raise RecordError("no trace recorded")
        dest = Path(destination).expanduser()
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.suffix == ".gz":
            with open(self._trace, "rb") as src, gzip.open(dest, "wb", compresslevel=6) as out:
                shutil.copyfileobj(src, out)
        else:
            shutil.copyfile(self._trace, dest)
        return dest

    def cleanup(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)
