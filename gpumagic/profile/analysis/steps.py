"""Training steps: where they are in a trace.

A step is what the user's loop repeats. ``torch.profiler`` marks each with a
``ProfilerStep#N`` CPU span, but the GPU work launched inside a step usually finishes
after the span ends (launches are asynchronous), so a step is extended to the end of
the device work its own runtime calls launched, following the launch correlation ids.
This is the PyTorch Profiler TensorBoard plugin's definition, kept so the numbers agree
with it:

* a runtime call belongs to a step when it lies entirely inside the step's CPU span;
* a step ends at the later of its CPU end and the end of the GPU work it launched;
* a step starts no earlier than the previous step's (extended) end, so steps never
  overlap and every instant is counted once;
* a last step that launched no GPU work, or less than 80% of what the step before it
  launched, is dropped: the profiler stopped before its kernels were recorded.

Without ``ProfilerStep`` marks (or when told to ignore them: a profiled cell that
never called ``gpumagic.step()`` has one mark spanning the whole cell) each
``DataLoader.__next__`` starts a step when the trace has them, else the whole trace is
one step, less its start-up phase (the first CUDA context, lazy module loading, first
calls: :mod:`gpumagic.profile.analysis.startup`), which is named apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gpumagic.profile.analysis.startup import Startup, find_startup
from gpumagic.profile.trace.model import Trace

PROFILER_STEP = re.compile(r"^ProfilerStep\s*#\s*(\d+)")
# torch.utils.data wraps every fetch in record_function("enumerate(DataLoader)#<Iter>.__next__");
# DataPipes use "enumerate(DataPipe)#..."
_DATALOADER = re.compile(r"^enumerate\(DataLoader\)#.*\.__next__$|^enumerate\(DataPipe\)#")

# The plugin drops a last step that launched under 80% of its predecessor's device work.
_TAIL_FRACTION = 0.8


def is_profiler_step(name: str) -> bool:
    return PROFILER_STEP.match(name) is not None


def is_dataloader(name: str) -> bool:
    return _DATALOADER.match(name) is not None


@dataclass
class Steps:
    """The analysed steps, in time order; all times in µs on the trace's clock."""

    names: list[str]
    start: np.ndarray  # after extension: disjoint, sorted
    end: np.ndarray
    host_start: np.ndarray  # the CPU span that defines the step
    host_end: np.ndarray
    device_events: np.ndarray  # GPU events launched from inside each step's CPU span
    source: str  # "ProfilerStep", "DataLoader" or "trace"
    dropped: int = 0  # tail steps left out because their GPU work was not all recorded
    first_left_out: bool = False  # the first marked step (first-call setup) is not among these
    # a trace without step marks: its start-up phase, and whether the step starts after it
    startup: Startup | None = None
    startup_left_out: bool = False

    def __len__(self) -> int:
        return len(self.names)

    @property
    def duration(self) -> np.ndarray:
        return self.end - self.start

    @property
    def span(self) -> tuple[float, float]:
        return float(self.start[0]), float(self.end[-1])

    @property
    def window(self) -> tuple[float, float]:
        """From the first step's CPU start to the last one's CPU end (µs): without the steps
        left out (the first-call setup step, a cell's tail after its last step, a last step
        whose GPU work was not all recorded). One step of a whole trace: everything, from the
        end of its start-up phase when that is left out."""
        if not len(self) or self.source == "trace":
            lo = float(self.host_start[0]) if len(self) and self.startup_left_out else -np.inf
            return lo, np.inf
        return float(self.host_start[0]), float(self.host_end[-1])


def find_steps(
    trace: Trace,
    launch_runtime: np.ndarray,
    use_marks: bool = True,
    mark_limit: int | None = None,
    skip_first: bool = False,
    keep_startup: bool = False,
) -> Steps:
    """Find the steps of ``trace``.

    ``launch_runtime[g]`` is the index of the runtime call that launched GPU event ``g``
    (-1 when unknown), as :attr:`gpumagic.profile.analysis.trace_analysis.Analysis.launch_runtime` has it.
    ``use_marks=False`` ignores ``ProfilerStep#N`` spans. ``mark_limit=n`` keeps only
    ``ProfilerStep#N`` with ``N < n``: a profiled cell that called ``gpumagic.step()`` n
    times closed n steps, and the span the profiler opened after the last call is the
    cell's tail (code after the loop), not a step. ``skip_first=True`` leaves the first
    ``ProfilerStep`` out when others remain: a cell profiled from its first iteration pays
    first-call costs there (cuBLAS/cuDNN handles and workspaces, lazy loading of CUDA modules,
    autotuning, DataLoader start-up) that no later step repeats. A trace without marks or
    DataLoader batches is one step, which starts after the trace's start-up phase unless
    ``keep_startup`` (the TensorBoard plugin's whole-trace step); the phase is named either way.
    """
    host = trace.host
    names = host.name
    marks = np.flatnonzero(names.mask(is_profiler_step)) if use_marks else np.zeros(0, np.int64)
    if len(marks) and mark_limit is not None:
        numbers = np.array([int(PROFILER_STEP.match(names.at(int(i))).group(1)) for i in marks])  # type: ignore[union-attr]
        marks = marks[numbers < mark_limit]
    if len(marks):
        order = marks[np.argsort(host.ts[marks], kind="stable")]
        labels = [PROFILER_STEP.match(names.at(i)).group(1) for i in order]  # type: ignore[union-attr]
        h_start, h_end, source = host.ts[order], host.end[order], "ProfilerStep"
    else:
        loader = np.flatnonzero(names.mask(is_dataloader))
        if len(loader):
            begin = np.sort(host.ts[loader])
            last = float(host.end.max())
            h_start = begin
            h_end = np.append(begin[1:], max(last, float(begin[-1])))
            labels = [str(i + 1) for i in range(len(begin))]
            source = "DataLoader"
        else:
            return _one_step(trace, launch_runtime, keep_startup)
    steps = _extend_to_device(trace, launch_runtime, labels, h_start, h_end, source)
    if skip_first and source == "ProfilerStep" and len(steps) > 1:
        # after the extension, so the next step still starts where the first one's GPU work ended
        steps = _without_first(steps)
    return steps


def _one_step(trace: Trace, launch_runtime: np.ndarray, keep_startup: bool) -> Steps:
    """The whole trace as one step, starting after its start-up phase when it has one and
    host work follows it (else the phase is only named)."""
    host = trace.host
    if len(host.ts):
        lo, hi = float(host.ts.min()), float(host.end.max())
    else:  # a device-only trace
        lo, hi = trace.start, trace.end
    startup = find_startup(trace) if len(host.ts) else None
    after = startup is not None and not keep_startup and bool((host.ts >= startup.end).any())
    if startup is not None and after:
        lo = max(lo, startup.end)
    steps = _extend_to_device(trace, launch_runtime, ["0"], np.array([lo]), np.array([hi]), "trace")
    steps.startup, steps.startup_left_out = startup, after
    return steps


def _without_first(st: Steps) -> Steps:
    return Steps(
        names=st.names[1:],
        start=st.start[1:],
        end=st.end[1:],
        host_start=st.host_start[1:],
        host_end=st.host_end[1:],
        device_events=st.device_events[1:],
        source=st.source,
        dropped=st.dropped,
        first_left_out=True,
    )


def _extend_to_device(
    trace: Trace,
    launch_runtime: np.ndarray,
    labels: list[str],
    h_start: np.ndarray,
    h_end: np.ndarray,
    source: str,
) -> Steps:
    rt, gpu = trace.runtime, trace.gpu
    k = len(labels)
    # the step whose CPU span wholly contains each runtime call (-1: none)
    step_of_rt = np.searchsorted(h_start, rt.ts, side="right") - 1
    inside = (step_of_rt >= 0) & (rt.end <= h_end[np.maximum(step_of_rt, 0)])
    step_of_rt = np.where(inside, step_of_rt, -1)

    launched = launch_runtime >= 0
    step_of_gpu = np.full(len(gpu.ts), -1, np.int64)
    step_of_gpu[launched] = step_of_rt[launch_runtime[launched]]
    matched = step_of_gpu >= 0
    counts = np.bincount(step_of_gpu[matched], minlength=k)[:k]
    dev_min = np.full(k, np.inf)
    dev_max = np.full(k, -np.inf)
    np.minimum.at(dev_min, step_of_gpu[matched], gpu.ts[matched])
    np.maximum.at(dev_max, step_of_gpu[matched], gpu.end[matched])

    start, end = h_start.astype(float).copy(), h_end.astype(float).copy()
    dropped = 0
    if matched.any():
        prev_end = float(h_start[0])
        if np.isfinite(dev_min[0]):
            # device work launched before the first step (warm-up) that finished before the
            # first step's own kernels began still occupies the GPU: start after it
            early = ~matched & (gpu.end < dev_min[0])
            if early.any():
                prev_end = max(prev_end, float(gpu.end[early].max()))
        for i in range(k):
            s = max(prev_end, float(h_start[i]))
            e = float(h_end[i])
            e = max(e, float(dev_max[i])) if np.isfinite(dev_max[i]) else max(e, s)
            start[i], end[i] = s, max(e, s)
            prev_end = end[i]
        if k > 1:
            with_work = np.flatnonzero(counts > 0)
            if len(with_work):
                last = int(with_work[-1])
                keep = last + 1
                if last > 0 and counts[last - 1] * _TAIL_FRACTION > counts[last]:
                    keep = last
                dropped = k - keep
    keep = k - dropped
    return Steps(
        names=labels[:keep],
        start=start[:keep],
        end=end[:keep],
        host_start=np.asarray(h_start[:keep], float),
        host_end=np.asarray(h_end[:keep], float),
        device_events=counts[:keep],
        source=source,
        dropped=dropped,
    )
