"""Many ranks without holding them all: each rank reduced to a summary, in a worker.

Holistic Trace Analysis parses every rank of a job into the memory of the process that
asked (200 GB of traces took 950 GB of RAM, HolisticTraceAnalysis#250; 512 traces do not
fit, #166; 8 x 5 GB hang, #332). Here a directory of rank traces is handed out one file
per task to a ``concurrent.futures.Executor`` (by default a local process pool sized to
the usable CPUs; a Dask cluster's ``Client.get_executor()`` spreads them over machines).
Each worker reads, analyses and reduces its rank to a :class:`RankSummary` (the per-rank
row, the breakdown, idle time, collectives and their overlap, top operators and kernels,
time per line and per module where the trace has them): tens of kB where the rank's
events took tens of MB. The notebook holds the summaries; the one rank the report shows
in full (the slowest) is read again in the notebook when its tables are asked for, and
``result.rank(7)`` reads any other on demand, so the notebook's memory stays near one
rank's, whatever the number of ranks.

:class:`Rank` is what a :class:`~gpumagic.profile.result.ProfileResult` holds per rank:
either an analysis already in memory (one file, or a cell just profiled), whose numbers it
reads directly, or a summary from a worker plus the file to read again. Both give the same
per-rank numbers, through the same functions below.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpumagic.profile.analysis.breakdown import CATEGORIES
from gpumagic.profile.analysis.comms import collective_durations
from gpumagic.profile.analysis.trace_analysis import Analysis
from gpumagic.profile.trace.decode import read_trace
from gpumagic.profile.trace.errors import TraceError
from gpumagic.profile.trace.spans import CodeLabels

if TYPE_CHECKING:
    from concurrent.futures import Executor

    import pandas as pd

# Rows of the operator and kernel tables a summary keeps: the report shows 10 to 15.
TOP_ROWS = 25

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class LoadOptions:
    """How every rank of a directory is analysed (``load_trace``'s keyword arguments)."""

    step_marks: bool = True
    mark_limit: int | None = None
    skip_first: bool = False
    labels: CodeLabels | None = None
    keep_startup: bool = False  # an unmarked trace's start-up phase stays in its step


def analyse_file(path: str | Path, options: LoadOptions, rank: int | None = None) -> Analysis:
    """Read and analyse one rank's trace; ``rank`` overrides the number the file declares."""
    trace = read_trace(path)
    if options.labels is not None:
        trace.code.labels = options.labels
    if rank is not None:
        trace.rank = rank
    return Analysis(
        trace, options.step_marks, options.mark_limit, options.skip_first, options.keep_startup
    )


# --- what a rank is, summarised --------------------------------------------------------------


def communication_row(a: Analysis) -> dict[str, Any]:
    """The per-rank columns of communication: the overlap, and the per-step split."""
    split = a.comms.step_split(a.steps)
    mean = split.mean(axis=0) if len(split) else [0.0] * 4
    return {
        "communication_overlap_percent": a.comms.overlap_percent,
        "computation_only_us_per_step": float(mean[0]),
        "overlap_us_per_step": float(mean[1]),
        "communication_only_us_per_step": float(mean[2]),
        "other_us_per_step": float(mean[3]),
    }


def rank_row(a: Analysis) -> dict[str, Any]:
    """One rank's ``per_rank`` columns, from ``steps`` to the communication split."""
    bd, idle = a.breakdown, a.idle
    n = max(len(a.steps), 1)
    row: dict[str, Any] = {
        "steps": len(a.steps),
        "step_time_us": bd.mean_step_us,
        "gpu_utilization_percent": a.gpu_utilization_percent,
        "gpu_idle_us_per_step": sum(idle.device_us.values()) / n,
        "collective_us_per_step": a.collective_us_per_step,
    }
    for c, p in zip(CATEGORIES, bd.percent.tolist()):
        row[f"{c}_percent"] = p
    row.update(communication_row(a))
    return row


def communicates(a: Analysis) -> bool:
    """The rank ran collectives (kernels, CPU-backend spans, or recorded calls)."""
    return bool(a.comms.present or len(a.comms.calls))


@dataclass
class RankSummary:
    """What a worker sends back for one rank: small, picklable, enough for the job's view.

    Times are µs (per step where the name says so), as in the full analysis.
    """

    file: str
    declared_rank: int | None  # distributedInfo.rank as the file records it
    row: dict[str, Any]  # the per_rank columns (see rank_row)
    breakdown_us: dict[str, float]  # mean µs per step per category (CATEGORIES)
    call_us: dict[str, np.ndarray]  # collective calls inside the steps, by name (the waits)
    collectives: pd.DataFrame  # Communication.collectives_frame
    overlap: pd.DataFrame  # Communication.overlap_frame
    steps: pd.DataFrame  # Analysis.steps_frame
    ops: pd.DataFrame  # the TOP_ROWS operators by device time
    kernels: pd.DataFrame  # the TOP_ROWS kernels by time
    idle_us_per_step: dict[str, float]  # device idle split (host_wait, kernel_wait, other)
    idle_gaps: pd.DataFrame  # the longest device-wide gaps
    lines: pd.DataFrame  # time per statement of a %%gpuprofile cell (empty otherwise)
    modules: pd.DataFrame  # time per nn.Module (empty where the trace has none)
    communicates: bool
    devices: list[str] = field(default_factory=list)
    events: int = 0
    notes: list[str] = field(default_factory=list)  # what the trace's own events say (Trace.notes)

    @property
    def mean_step_us(self) -> float:
        return float(self.row["step_time_us"])

    @property
    def collective_us_per_step(self) -> float:
        return float(self.row["collective_us_per_step"])

    @property
    def step_count(self) -> int:
        return int(self.row["steps"])


def summarize(a: Analysis, file: str | Path, declared_rank: int | None) -> RankSummary:
    """Reduce one analysed rank to its summary (what a worker does before it lets go)."""
    from gpumagic.profile.analysis.lines import line_attribution
    from gpumagic.profile.analysis.modules import module_attribution

    rank = declared_rank if declared_rank is not None else -1
    n = max(len(a.steps), 1)
    trace = a.trace
    return RankSummary(
        file=str(file),
        declared_rank=declared_rank,
        row=rank_row(a),
        breakdown_us=dict(zip(CATEGORIES, (float(v) for v in a.breakdown.mean_us))),
        call_us=collective_durations(a),
        collectives=a.comms.collectives_frame(rank),
        overlap=a.comms.overlap_frame(rank, a.steps),
        steps=a.steps_frame(),
        ops=a.ops_frame().head(TOP_ROWS),
        kernels=a.kernels_frame().head(TOP_ROWS),
        idle_us_per_step={k: v / n for k, v in a.idle.device_us.items()},
        idle_gaps=a.idle.gaps,
        lines=line_attribution(a).frame(),
        modules=module_attribution(a).frame(),
        communicates=communicates(a),
        devices=sorted(
            {d.name for d in (trace.device(m.device) for m in a.devices) if d is not None}
        ),
        events=trace.events,
        notes=list(trace.notes),
    )


@dataclass
class _Failed:
    """A rank a worker could not read: sent back as data, raised in the caller as a
    TraceError (whose two-argument constructor does not survive pickling)."""

    path: str
    why: str


def summarize_file(path: str, options: LoadOptions) -> RankSummary | _Failed:
    """The worker's task: read, analyse and summarise one rank's file."""
    try:
        analysis = analyse_file(path, options)
        return summarize(analysis, path, analysis.trace.rank)
    except TraceError as exc:
        return _Failed(exc.path, exc.why)


# --- one rank of a result --------------------------------------------------------------------


class Rank:
    """One rank of a result: its numbers, and its full analysis on demand.

    Built either around an analysis in memory (its numbers are read from it, nothing is
    summarised) or around a worker's :class:`RankSummary` and the file it came from (the
    analysis is read again each time :meth:`analysis` is called, and not kept).
    """

    def __init__(
        self,
        number: int,
        *,
        analysis: Analysis | None = None,
        summary: RankSummary | None = None,
        options: LoadOptions | None = None,
    ) -> None:
        if analysis is None and summary is None:
            raise ValueError("a Rank needs an analysis or a summary")
        self.number = number
        self._analysis = analysis
        self._summary = summary
        self._options = options or LoadOptions()

    @property
    def held(self) -> bool:
        """Whether the full analysis is in memory."""
        return self._analysis is not None

    @property
    def file(self) -> str:
        if self._analysis is not None:
            return self._analysis.trace.source
        assert self._summary is not None
        return self._summary.file

    def analysis(self) -> Analysis:
        """The full analysis: the one held, or the file read and analysed again."""
        if self._analysis is not None:
            return self._analysis
        return analyse_file(self.file, self._options, self.number)

    @property
    def summary(self) -> RankSummary:
        """The worker's summary, or one made from the analysis held."""
        if self._summary is None:
            assert self._analysis is not None
            self._summary = summarize(self._analysis, self.file, self._analysis.trace.rank)
        return self._summary

    # the numbers the job's view needs, from whichever is at hand
    @property
    def notes(self) -> list[str]:
        a = self._analysis
        return list(a.trace.notes) if a is not None else list(self.summary.notes)

    def row(self) -> dict[str, Any]:
        return rank_row(self._analysis) if self._analysis is not None else dict(self.summary.row)

    @property
    def mean_step_us(self) -> float:
        a = self._analysis
        return a.breakdown.mean_step_us if a is not None else self.summary.mean_step_us

    @property
    def collective_us_per_step(self) -> float:
        a = self._analysis
        return a.collective_us_per_step if a is not None else self.summary.collective_us_per_step

    @property
    def step_count(self) -> int:
        return len(self._analysis.steps) if self._analysis is not None else self.summary.step_count

    @property
    def communicates(self) -> bool:
        a = self._analysis
        return communicates(a) if a is not None else self.summary.communicates

    def breakdown_us(self) -> dict[str, float]:
        a = self._analysis
        if a is None:
            return dict(self.summary.breakdown_us)
        return dict(zip(CATEGORIES, (float(v) for v in a.breakdown.mean_us)))

    def call_durations(self) -> dict[str, np.ndarray]:
        a = self._analysis
        return collective_durations(a) if a is not None else self.summary.call_us

    def collectives(self) -> pd.DataFrame:
        a = self._analysis
        if a is not None:
            return a.comms.collectives_frame(self.number)
        return self.summary.collectives.assign(rank=self.number)

    def overlap(self) -> pd.DataFrame:
        a = self._analysis
        if a is not None:
            return a.comms.overlap_frame(self.number, a.steps)
        return self.summary.overlap.assign(rank=self.number)

    def __repr__(self) -> str:
        how = "in memory" if self.held else "summarised"
        return f"<Rank {self.number} {Path(self.file).name} ({how})>"


# --- a directory of ranks --------------------------------------------------------------------


def _name_rank(f: str | Path) -> int | None:
    m = _RANK_IN_NAME.search(Path(f).name)
    return int(m.group(1)) if m else None


def _stem(f: str | Path) -> str:
    name = Path(f).name
    for suffix in (".json.gz", ".json", ".pt.trace"):
        name = name.removesuffix(suffix)
    return name


def number_ranks(declared: Sequence[int | None], files: Sequence[str | Path]) -> list[int]:
    """Each file's rank: ``distributedInfo.rank`` when the writer recorded it, else a number
    in the file name, else the position in the directory, or the next number no file took
    (two files with one number would make one unreachable).

    Where files declare one rank (a copy saved beside the original), the one whose name
    says that number keeps it, ``rank-1.json.gz`` before ``rank-1-copy.json.gz``, then the
    first in the directory: the others are numbered as undeclared (:func:`numbering_notes`
    says so)."""

    def claim_order(i: int) -> tuple[int, int]:
        if _name_rank(files[i]) != declared[i]:
            return (2, i)
        return (0 if _stem(files[i]).endswith(str(declared[i])) else 1, i)

    out: list[int | None] = [None] * len(files)
    seen: set[int] = set()
    for i in sorted((i for i, r in enumerate(declared) if r is not None), key=claim_order):
        rank = declared[i]
        if rank is not None and rank not in seen:
            seen.add(rank)
            out[i] = rank
    for i, f in enumerate(files):
        if out[i] is not None:
            continue
        named = _name_rank(f)
        rank = named if named is not None and named not in seen else i
        while rank in seen:
            rank += 1
        seen.add(rank)
        out[i] = rank
    return [int(r) for r in out if r is not None]


def numbering_notes(
    declared: Sequence[int | None], files: Sequence[str | Path], numbers: Sequence[int]
) -> list[str]:
    """A note for each file numbered otherwise than it claims (``distributedInfo.rank``, or
    its name's number when it declares none), naming the file that holds that number."""
    holder = {n: Path(f).name for n, f in zip(numbers, files)}
    notes = []
    for rank, f, n in zip(declared, files, numbers):
        claim, by = (rank, "says it is") if rank is not None else (_name_rank(f), "is named as")
        if claim is None or claim == n:
            continue
        other = holder.get(claim)
        notes.append(
            f"{Path(f).name} {by} rank {claim}, as {other} does: {other} is loaded as rank "
            f"{claim} and {Path(f).name} as rank {n} (a copy of it? leave it out of the folder)"
            if other is not None
            else f"{Path(f).name} {by} rank {claim}: it is loaded as rank {n}"
        )
    return notes


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which a Slurm or container cgroup
    sets), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


# A process pool pays for itself only past some work: starting one costs about a second
# (each worker imports numpy, pandas and msgspec), while this process reads and summarises
# about 90 MB of trace JSON a second (a 1.8 MB rank of two_ranks in 20 ms, measured on a
# 2-core machine). Below this many bytes of JSON the ranks are read here, one at a time
# (the memory is the same either way: only summaries are kept).
POOL_MIN_BYTES = 32 * 2**20
# gzip shrinks Kineto JSON about twelvefold (14x for two_ranks): the work a .gz file stands for
_GZIP_RATIO = 12


def work_bytes(files: Sequence[Path]) -> int:
    """About how many bytes of trace JSON ``files`` hold (gzip files counted expanded)."""
    total = 0
    for f in files:
        size = f.stat().st_size
        total += size * _GZIP_RATIO if f.name.endswith(".gz") else size
    return total


def _pool_context() -> Any:
    import multiprocessing  # here: a file's analysis (gpumagic analyze) needs no pool

    # Never fork: a notebook's process has threads (the kernel's, a %gpuwatch sampler), and
    # a child forked while one of them holds a lock can hang (CPython warns about it since
    # 3.12). Spawn everywhere: it leaves no server process behind and works the same on
    # Linux, macOS and Windows.
    return multiprocessing.get_context("spawn")


@dataclass
class Reduced:
    """The summaries of a directory's ranks, in file order, and how they were made."""

    summaries: list[RankSummary]
    how: str  # "a pool of N processes", "this process", "the executor given"
    note: str | None = None  # why the pool was not used, when it could not start


def reduce_ranks(
    files: Sequence[Path], options: LoadOptions, executor: Executor | None = None
) -> Reduced:
    """Summarise every file, each in a task of ``executor``. By default a local process pool
    with one worker per usable CPU (up to one per file); in this process, one rank at a time,
    where one CPU is usable or the files hold less than :data:`POOL_MIN_BYTES` of JSON.
    Raises :class:`TraceError` for the first file (in directory order) that is not a usable
    trace."""
    paths = [str(f) for f in files]
    if executor is not None:
        return Reduced(
            _collect(executor, paths, options), f"the executor given ({type(executor).__name__})"
        )
    workers = min(len(paths), usable_cpus())
    if workers < 2 or work_bytes(files) < POOL_MIN_BYTES:
        return Reduced([_checked(summarize_file(p, options)) for p in paths], "this process")
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    try:
        with ProcessPoolExecutor(workers, mp_context=_pool_context()) as pool:
            return Reduced(
                _collect(pool, paths, options, own_pool=True), f"a pool of {workers} processes"
            )
    except (BrokenProcessPool, OSError) as exc:
        # No subprocesses here (a sandbox without /dev/shm, a process limit): the same
        # summaries made in this process, one rank at a time, and the reason on the result.
        note = (
            "ranks were analysed in this process: the process pool failed "
            f"({type(exc).__name__}: {exc}); a script that loads traces at its top level "
            'needs the `if __name__ == "__main__":` guard for worker processes'
        )
        return Reduced([_checked(summarize_file(p, options)) for p in paths], "this process", note)


class RankTaskError(RuntimeError):
    """An executor's task for one rank failed for a reason outside its trace (a worker node
    lost, the executor's own error): the message names the file, the error is the cause."""

    def __init__(self, path: str, cause: BaseException) -> None:
        self.path = path
        super().__init__(
            f"{path}: the task analysing this rank failed ({type(cause).__name__}: {cause})"
        )


def _collect(
    executor: Executor, paths: list[str], options: LoadOptions, own_pool: bool = False
) -> list[RankSummary]:
    """Each file's summary from ``executor``; an error that is not the trace's names the file
    (issue 25: a Dask worker lost surfaced as a bare OSError). A broken pool of our own is
    left as it is: :func:`reduce_ranks` then reads the ranks here."""
    futures = [executor.submit(summarize_file, p, options) for p in paths]
    try:
        out = []
        for path, f in zip(paths, futures):
            try:
                done = f.result()
            except Exception as exc:
                # imported here: a single trace's analysis never loads the process pool's
                # modules (the start-up cost of `gpumagic analyze`)
                from concurrent.futures.process import BrokenProcessPool

                if own_pool and isinstance(exc, BrokenProcessPool):
                    raise
                raise RankTaskError(path, exc) from exc
            out.append(_checked(done))
        return out
    except BaseException:
        for f in futures:
            f.cancel()
        raise


def _checked(out: RankSummary | _Failed) -> RankSummary:
    if isinstance(out, _Failed):
        raise TraceError(out.path, out.why)
    return out


# --- which ranks are slow, and why -----------------------------------------------------------

# A rank is named slow when its own work per step exceeds the median rank's by this share of
# the median step: below that, the spread is the noise of two ranks doing the same work.
SLOW_SHARE = 0.05
# What each reason adds up, from the step-time breakdown (µs per step).
COMPUTE = ("Kernel", "Memcpy", "Memset", "Runtime", "CPU Exec")
INPUT = ("DataLoader",)
SLOW_COLUMNS = [
    "rank",
    "behind_us_per_step",
    "compute_us_per_step",
    "input_us_per_step",
    "collective_us_per_step",
    "extra_compute_us_per_step",
    "extra_input_us_per_step",
    "extra_collective_us_per_step",
    "reason",
]


def own_work_us(rank: Rank, synchronised: bool) -> float:
    """A rank's own work per step: its step time, less its time in collectives when the ranks
    synchronise (there, every rank's step lasts as long as the slowest one's; the time each
    spends in collectives is what tells them apart, and the rank the others wait for spends
    least)."""
    if synchronised:
        return rank.mean_step_us - rank.collective_us_per_step
    return rank.mean_step_us


def slow_ranks(ranks: Sequence[Rank], synchronised: bool) -> pd.DataFrame:
    """The ranks whose own work per step exceeds the median rank's by more than
    :data:`SLOW_SHARE` of the median step, slowest first, and what makes each slow: the
    part of its step (compute: kernels, copies, runtime and CPU work; input: the DataLoader;
    collectives) that most exceeds the median rank's."""
    import pandas as pd

    if len(ranks) < 2:
        return pd.DataFrame(columns=SLOW_COLUMNS)
    own = np.array([own_work_us(r, synchronised) for r in ranks])
    bd = [r.breakdown_us() for r in ranks]
    compute = np.array([sum(b.get(c, 0.0) for c in COMPUTE) for b in bd])
    inputs = np.array([sum(b.get(c, 0.0) for c in INPUT) for b in bd])
    coll = np.array([r.collective_us_per_step for r in ranks])
    behind = own - np.median(own)
    extra = np.stack(
        [compute - np.median(compute), inputs - np.median(inputs), coll - np.median(coll)]
    )
    threshold = SLOW_SHARE * float(np.median([r.mean_step_us for r in ranks]))
    rows = []
    for i in np.argsort(-behind, kind="stable").tolist():
        if behind[i] <= threshold or behind[i] <= 0:
            break
        rows.append(
            [
                ranks[i].number,
                float(behind[i]),
                float(compute[i]),
                float(inputs[i]),
                float(coll[i]),
                *(float(x) for x in extra[:, i]),
                _reason(extra[:, i]),
            ]
        )
    return pd.DataFrame(rows, columns=SLOW_COLUMNS)


def _reason(extra: np.ndarray) -> str:
    from gpumagic.units import fmt_us

    names = ("more compute", "input stalls", "waiting in collectives")
    detail = ("of kernels, copies and CPU work", "in the DataLoader", "in collectives")
    k = int(np.argmax(extra))
    if extra[k] <= 0:
        return "no one part stands out: its steps are longer throughout"
    return f"{names[k]} (+{fmt_us(float(extra[k]))} per step {detail[k]} over the median rank)"
