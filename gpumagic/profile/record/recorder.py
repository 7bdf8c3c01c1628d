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
import re
import secrets
import shutil
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpumagic.profile.record.exclusive import Handover, restore_profile_function

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpumagic.profile.trace.model import Trace

_current: Recorder | None = None
_lock = threading.Lock()
_kineto_started = False  # this process has started a Kineto trace (its log level is set)
_LAUNCH = re.compile(r"Launch|Memcpy|Memset")  # cudaLaunchKernel, cuLaunchKernel, cudaMemcpyAsync


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

    def validate(self) -> None:
        """ValueError for a schedule ``torch.profiler.schedule`` rejects (with a bare
        AssertionError, once the profiler is half set up) or would record differently
        from what was asked (``active=0`` cannot record: it is no "record nothing")."""
        for name in ("wait", "warmup"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"--{name} must be 0 or more, not {value}")
        if self.active is not None and self.active < 1:
            raise ValueError(f"--active must be at least 1 (steps to record), not {self.active}")


class Recorder:
    """One profiled cell: ``start()``, the cell runs (calling :func:`step`), ``stop()``, then
    ``cleanup()`` removes the temporary folder.

    ``stop()`` and ``cleanup()`` are safe after a ``start()`` that failed or was interrupted
    at any point: the folder is named before it is made, and a profiler this recorder turned
    on is turned off even when torch's ``start()`` never returned.
    """

    def __init__(self, options: RecordOptions) -> None:
        self.options = options
        self.steps = 0  # step() calls so far
        self.started = 0.0
        self.elapsed_s = 0.0
        self.cuda = False  # CUDA activity was asked of the profiler
        self.cuda_used = False  # the cell allocated CUDA memory (so it ran GPU work)
        self._cuda_at_start: tuple[int, ...] | None = None
        self.device_stopped_at: int | None = None  # step at which Kineto stopped collecting
        self.stop_error = ""  # what went wrong stopping the profiler, when a trace survived
        self._prof: Any = None
        self._started = False  # torch's start() returned
        self._owns_profiler = False  # torch's start() was called with no profiler on before
        self._dir: Path | None = None  # made by start(), removed by cleanup()
        self._trace: Path | None = None
        # The cell starting a torch profiler of its own ends this recording there (see
        # exclusive.py); ``before_handover`` runs first (the probe closes its ranges).
        self.before_handover: Callable[[], None] | None = None
        self._handover: Handover | None = None
        self.handed_over_at_step: int | None = None  # steps marked when the cell took over
        # --with-stack: torch's Python tracer replaces this thread's sys.setprofile function
        # while it records and clears it when it stops; the user's is put back
        self._user_profile: Any = None
        self.profile_function_restored = ""  # the restored function's name, for a note

    @property
    def marked_steps(self) -> bool:
        """True when the cell called :func:`step` (so ProfilerStep spans are real steps)."""
        return self.steps > 0

    @property
    def mark_limit(self) -> int:
        """Every ``step()`` closes ``ProfilerStep#N`` and opens the next, so the span after the
        last call is the cell's tail: only ``ProfilerStep#0`` to ``#steps-1`` are steps. A
        schedule's window usually ends on a ``step()`` call, but not when the cell ends inside
        it: its last span is then the tail too (issue 25)."""
        return self.steps

    def start(self) -> Recorder:
        global _current
        import torch
        from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule

        with _lock:
            if _current is not None:
                raise RecordError("a %%gpuprofile cell is already being profiled")
            _current = self
        # Named before it is made, so that cleanup() finds it whatever interrupts start().
        self._dir = Path(tempfile.gettempdir()) / f"gpumagic-profile-{secrets.token_hex(8)}"
        self._dir.mkdir(mode=0o700)
        opts = self.options
        self.cuda = cuda_recordable(torch)
        self._cuda_at_start = _cuda_allocations() if self.cuda else None
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
        self._owns_profiler = not _profiler_on()
        if opts.stack:
            self._user_profile = sys.getprofile()
        self._handover = Handover(self._hand_over)
        with _KINETO_LINES:
            _start_quietly(self._prof)
        self._started = True
        self.started = time.perf_counter()
        self._handover.install()
        return self

    @property
    def handed_over(self) -> bool:
        """The cell started a torch profiler of its own, which ended this recording."""
        return self.handed_over_at_step is not None

    def step(self) -> None:
        self.steps += 1
        if self.handed_over or self._handover is None:
            return  # the profiler is the cell's now: its steps are not ours to take
        # a schedule's step starts torch's profiler (ours: no handover), and starts and
        # stops Kineto's trace
        with self._handover.owner(), _KINETO_LINES:
            self._prof.step()
        if self.device_stopped_at is None and _device_stopped(self._prof):
            # Kineto stopped device collection (CUPTI buffers full, a device error): torch
            # wrote the trace so far and records nothing more this cell; notes() says so
            self.device_stopped_at = self.steps

    def _hand_over(self) -> None:
        """The cell is starting a torch profiler of its own (see exclusive.py): stop
        recording now, cleanly, so that its profiler starts on a process with none running
        and this one's trace keeps what it recorded so far."""
        self.handed_over_at_step = self.steps
        try:
            if self.before_handover is not None:
                self.before_handover()
        finally:
            try:
                if self._started:
                    self._synchronize_other_devices()
                    with _KINETO_LINES:
                        self._prof.stop()
            except Exception as exc:
                self.stop_error = f"{type(exc).__name__}: {exc}"
            finally:
                self._owns_profiler = False  # what runs from now on is the cell's

    def _on_ready(self, prof: Any) -> None:
        assert self._dir is not None
        path = self._dir / f"trace_{len(list(self._dir.iterdir()))}.json"
        prof.export_chrome_trace(str(path))
        if self._trace is None:  # keep the first window (repeat=1 gives one anyway)
            self._trace = path

    def stop(self) -> Path:
        """Stop the profiler (always, also after an error) and return the trace written."""
        failure: Exception | None = None
        try:
            if self._started and not self.handed_over:
                # The cell has ended, so no profiler start from now on is the cell's; and
                # torch's own stop starts one: a schedule stopped in warm-up runs its (WARMUP,
                # None) transition, start_trace then stop_trace, to end the Kineto session
                # prepared for the window. Left installed, the handover took that start for
                # the cell's own profiler and ran this stop() inside itself: the one Kineto
                # session prepared for the window was started and stopped twice, and the
                # second disable crashed the process (a segfault, issue 25).
                if self._handover is not None:
                    self._handover.remove()
                self._synchronize_other_devices()
                with _KINETO_LINES:
                    self._prof.stop()
        except Exception as exc:
            failure = exc
        finally:
            # After a sticky CUDA error (device-side assert, illegal address) torch's stop()
            # raises in its torch.cuda.synchronize(), before it disables the profiler; and a
            # start() interrupted inside torch's own start() may have enabled it without
            # returning. Either way it is turned off here, so that the next cell does not run
            # under an orphan profiler; one that was on before this recorder is left alone.
            self._release_profiler()
            self.elapsed_s = time.perf_counter() - self.started if self.started else 0.0
            self.cuda_used = self.cuda and _cuda_used(self._cuda_at_start)
        if failure is not None:
            reason = f"{type(failure).__name__}: {failure}"
            if self._trace is None or not self._trace.exists():
                raise RecordError(f"the profiler failed to stop ({reason})") from failure
            self.stop_error = reason
        if self._trace is None or not self._trace.exists():
            opts = self.options
            if self.handed_over:
                raise RecordError(
                    "nothing was recorded: the cell started a torch profiler of its own "
                    "before %%gpuprofile recorded anything (torch runs one profiler per "
                    "process; the cell's own profiler ran as it would without the magic)"
                )
            if opts.scheduled:
                need = (opts.wait or 0) + (opts.warmup or 0) + 1
                raise RecordError(
                    f"nothing was recorded: the schedule (wait={opts.wait or 0}, warmup={opts.warmup or 0}, "
                    f"active={opts.active or 1}) needs at least {need} gpumagic.step() calls before it "
                    f"records, and the cell made {self.steps}"
                )
            raise RecordError("the profiler wrote no trace")
        return self._trace

    def save(self, destination: str | os.PathLike[str], labels: bytes | None = None) -> Path:
        """Copy the recorded trace to ``destination`` (gzip if it ends in .gz); open it in Perfetto.

        ``labels`` (:meth:`gpumagic.profile.trace.spans.CodeLabels.to_json`) go into the file, so
        that loading it again gives the per-line and per-module tables their sources and names.
        """
        if self._trace is None:
            raise RecordError("no trace recorded")
        dest = Path(destination).expanduser()
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.suffix == ".gz":
            with open(self._trace, "rb") as src, gzip.open(dest, "wb", compresslevel=6) as out:
                _copy(src, out, labels)
        elif labels:
            with open(self._trace, "rb") as src, open(dest, "wb") as out:
                _copy(src, out, labels)
        else:
            shutil.copyfile(self._trace, dest)
        return dest

    def cleanup(self) -> None:
        """Remove the temporary folder, and release the profiler if :meth:`stop` did not get
        to it (it was interrupted): everything this recorder holds is gone after this."""
        try:
            self._release_profiler()
        finally:
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)

    def _release_profiler(self) -> None:
        global _current
        if self._handover is not None:
            self._handover.remove()
        if self._owns_profiler:
            _disable_profiler()
            self._owns_profiler = False
        if self._user_profile is not None:
            self.profile_function_restored = restore_profile_function(self._user_profile)
            self._user_profile = None
        with _lock:
            if _current is self:
                _current = None

    def keep(self) -> Path:
        """Move the recorded trace out of the folder :meth:`cleanup` removes; its new path
        (for a trace whose analysis failed: the user can load it again, or open it)."""
        if self._trace is None or not self._trace.exists():
            raise RecordError("no trace recorded")
        fd, name = tempfile.mkstemp(prefix="gpumagic-trace-", suffix=".json")
        os.close(fd)
        shutil.move(self._trace, name)
        self._trace = Path(name)
        return self._trace

    def _synchronize_other_devices(self) -> None:
        # torch's stop() synchronises only the current device; kernels still queued on other
        # GPUs this process uses would miss the trace. Only devices with a context: touching
        # another one would create a context there.
        if not self.cuda or not _cuda_initialized():
            return
        import torch

        has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
        if has_context is None:
            return
        try:
            current = torch.cuda.current_device()
            for i in range(torch.cuda.device_count()):
                if i != current and has_context(i):
                    torch.cuda.synchronize(i)
        except Exception:
            pass  # a device error surfaces in stop()'s own synchronize, which is handled

    def notes(self, trace: Trace, steps_in_trace: int) -> list[str]:
        """What the recording says about ``trace`` that the analysis cannot: CUDA recorded
        but no GPU event in the trace, a stop that failed, fewer steps than the cell marked.

        ``steps_in_trace``: the marked steps the trace holds (before any is left out).
        """
        out: list[str] = []
        # launches and copies only: torch's stop() itself calls cudaDeviceSynchronize
        launches = int(trace.runtime.name.mask(lambda n: _LAUNCH.search(n) is not None).sum())
        if self.cuda and not trace.has_gpu and (self.cuda_used or launches):
            seen = (
                f"the host made {launches} CUDA launch/copy calls but no kernel or copy reached it"
                if launches
                else "the cell allocated CUDA memory, so it ran GPU work, but none reached it"
            )
            out.append(
                "CUDA activity was recorded, yet the trace holds no GPU events: "
                f"{seen}. CUPTI may be busy or unavailable (another profiler attached, such as "
                "Nsight Systems or DCGM profiling; no permission for GPU profiling; a 'CUPTI "
                "initialization error', pytorch#99615), or this torch build lacks Kineto's GPU "
                "support. The analysis below covers the host only."
            )
        if self.stop_error:
            out.append(f"The profiler failed to stop cleanly ({self.stop_error}).")
        if self.profile_function_restored:
            out.append(
                f"--with-stack: torch's Python tracer replaced this thread's sys.setprofile "
                f"function ({self.profile_function_restored}) while the cell ran, and "
                "cleared it when it stopped; it is set again."
            )
        expected = self._expected_steps()
        if self.handed_over:
            pass  # the steps after the cell took the profiler were never ours to record
        elif self.device_stopped_at is not None:
            out.append(
                f"The profiler stopped collecting device activity early, at step "
                f"{self.device_stopped_at} of the {self.steps} the cell marked (Kineto's buffers "
                "filled, or a device error): the trace covers only the cell's start. Record "
                "fewer steps with --wait/--warmup/--active."
            )
        elif expected == 0:
            opts = self.options
            out.append(
                f"The schedule (wait={opts.wait or 0}, warmup={opts.warmup or 0}) began "
                f"recording at the cell's last gpumagic.step() call, of {self.steps}: the "
                "trace holds only the code after it, no whole step "
                f"({self.steps + 1} calls record one)."
            )
        elif expected is not None and steps_in_trace < expected:
            out.append(
                f"The trace holds {steps_in_trace} of the {expected} steps the cell marked: "
                "the profiler stopped recording before the cell ended."
            )
        return out

    def _expected_steps(self) -> int | None:
        """How many marked steps the trace should hold (None: the cell marked none)."""
        if not self.steps:
            return None
        opts = self.options
        if not opts.scheduled:
            return self.steps
        skipped = (opts.wait or 0) + (opts.warmup or 0)
        return max(0, min(opts.active or 1, self.steps - skipped))


def _copy(src: Any, out: Any, labels: bytes | None) -> None:
    if labels:
        from gpumagic.profile.trace.spans import copy_with_labels

        copy_with_labels(src, out, labels)
    else:
        shutil.copyfileobj(src, out)


def cuda_recordable(torch: Any) -> bool:
    """Whether the profiler can record CUDA here: this build's Kineto supports it (builds
    without Kineto's GPU support fall back to a trace with no kernels) and a GPU is visible."""
    try:
        from torch.profiler import ProfilerActivity, supported_activities

        return ProfilerActivity.CUDA in supported_activities() and bool(torch.cuda.is_available())
    except Exception:
        return False


def _cuda_allocations() -> tuple[int, ...] | None:
    """The current device's allocation counters (None before CUDA is initialised; reading
    them never initialises it). Any GPU op that makes a tensor moves them."""
    if not _cuda_initialized():
        return None
    import torch

    try:
        stats = torch.cuda.memory_stats_as_nested_dict()
        count = stats.get("allocation", {}).get("all", {})
        nbytes = stats.get("allocated_bytes", {}).get("all", {})
        # counts stay 0 under the cudaMallocAsync backend; its byte counters move
        return tuple(int(d.get(k, 0)) for d in (count, nbytes) for k in ("allocated", "peak"))
    except Exception:
        return None


def _cuda_used(at_start: tuple[int, ...] | None) -> bool:
    """Whether the cell used the GPU: CUDA was initialised during it, or allocated in it."""
    now = _cuda_allocations()
    return now is not None and (at_start is None or now != at_start)


def _cuda_initialized() -> bool:
    import torch

    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


_USDT = re.compile(rb"^USDT:")


class _WithoutKinetoLines:
    """Around torch's profiler start, step and stop: file descriptor 2 goes to a temporary
    file, and what was written there goes back to stderr afterwards, less Kineto's
    ``USDT:... profiler_start`` / ``profiler_stop`` lines.

    Kineto (torch 2.13) writes those lines from C++ straight to fd 2 at every start and stop,
    whatever Python's ``sys.stderr`` is, and ipykernel forwards fd 2 to the notebook, so they
    showed in red under every profiled cell. Its log level could hide them only until
    something else in the process started a Kineto trace first (the level is read once per
    process, see :func:`_start_quietly`): a test suite, or a cell that used
    ``torch.profiler`` itself. Everything else written meanwhile, by any thread, comes back,
    in order, once the call returns. Reentrant, so a nested use is a no-op; where fd 2 cannot
    be duplicated (no stderr at all), it does nothing.
    """

    def __init__(self) -> None:
        self._depth = 0
        self._lock = threading.Lock()
        self._saved = -1
        self._file: Any = None

    def __enter__(self) -> None:
        with self._lock:
            self._depth += 1
            if self._depth > 1:
                return
            try:
                sys.stderr.flush()  # what Python buffered goes out before, in order
            except Exception:
                pass
            try:
                if self._file is None:
                    self._file = tempfile.TemporaryFile()
                self._saved = os.dup(2)
                os.dup2(self._file.fileno(), 2)
            except OSError:
                self._saved = -1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth or self._saved < 0:
                return
            saved, self._saved = self._saved, -1
            try:
                os.dup2(saved, 2)
            finally:
                os.close(saved)
            f = self._file
            try:
                size = os.lseek(f.fileno(), 0, os.SEEK_CUR)
                if size:
                    os.lseek(f.fileno(), 0, os.SEEK_SET)
                    text = os.read(f.fileno(), size)
                    os.ftruncate(f.fileno(), 0)
                    os.lseek(f.fileno(), 0, os.SEEK_SET)
                    kept = b"".join(
                        line for line in text.splitlines(keepends=True) if not _USDT.match(line)
                    )
                    if kept:
                        os.write(2, kept)
            except OSError:
                pass


_KINETO_LINES = _WithoutKinetoLines()


def _start_quietly(prof: Any) -> None:
    """``prof.start()``, with Kineto's own log lines off for the process.

    Kineto reads KINETO_LOG_LEVEL once, when the process first prepares a trace (inside this
    start()), and keeps the level, so the variable is set for that call only: left in
    os.environ it would pass to every child of the kernel (and silence their Kineto warnings
    too). A KINETO_LOG_LEVEL the user set wins. Kineto's own warnings (a CUPTI that fails to
    start) are silenced with the rest; the report's notes say what the trace lacks instead.
    The "USDT: ... profiler_start/stop" lines are above every level but "off" (6), and come
    back whenever something else started Kineto first: :class:`_WithoutKinetoLines` drops
    them at every start, step and stop, whatever the level.
    """
    global _kineto_started
    if _kineto_started or "KINETO_LOG_LEVEL" in os.environ:
        _kineto_started = True
        prof.start()
        return
    os.environ["KINETO_LOG_LEVEL"] = "6"
    try:
        prof.start()
    finally:
        os.environ.pop("KINETO_LOG_LEVEL", None)
        _kineto_started = True


def _device_stopped(prof: Any) -> bool:
    from torch.profiler import ProfilerAction

    stopped = getattr(ProfilerAction, "DEVICE_STOPPED", None)  # absent in older torch
    return stopped is not None and getattr(prof, "current_action", None) == stopped


def _profiler_on() -> bool:
    try:
        from torch.autograd import _profiler_enabled

        return bool(_profiler_enabled())
    except Exception:
        return False


def _disable_profiler() -> None:
    """Turn torch's profiler off where its own stop() failed or never ran (guarded: private
    API); nothing when it is off."""
    try:
        from torch.autograd import _profiler_enabled
        from torch.autograd.profiler import _disable_profiler as disable

        if _profiler_enabled():
            disable()
    except Exception:
        pass
    try:
        from torch.autograd.profiler import _set_is_profiler_enabled

        _set_is_profiler_enabled(False)
    except Exception:
        pass
