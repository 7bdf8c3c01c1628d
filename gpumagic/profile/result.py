"""``ProfileResult``: what ``load_trace`` returns and ``%%gpuprofile`` displays.

One object per trace file or per directory of ranks. Its tables are pandas DataFrames
(kept, filtered, saved by the user), its ``findings`` the ranked diagnosis, and it
renders as one mime bundle (text and HTML) or a self-contained HTML file.

For several ranks the tables describe the slowest rank, the one that sets the pace of
a synchronous job; :attr:`ProfileResult.per_rank` compares them all side by side,
:attr:`ProfileResult.slow_ranks` says which hold the others up and why, and
:meth:`ProfileResult.rank` gives any one of them. A directory's ranks may be held as
summaries (see :mod:`gpumagic.profile.ranks`): the slowest rank's full analysis is read
when its tables are first asked for, any other's when :meth:`ProfileResult.rank` is called.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from gpumagic.profile.analysis.trace_analysis import Analysis, IdleReport
from gpumagic.profile.ranks import Rank, RankSummary, own_work_us, slow_ranks
from gpumagic.profile.rules.base import Finding
from gpumagic.profile.rules.registry import diagnose
from gpumagic.profile.summary import ProfileSummary, summarise
from gpumagic.profile.trace.session import LiveState
from gpumagic.render.html import Rendered

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.render.sections import Report

# Table rows a result shows unless told (display_rows, or a method's rows=): a terminal has
# less room than a notebook, and an exported page has room for more.
TEXT_ROWS, HTML_ROWS, PAGE_ROWS = 10, 15, 50


class ProfileResult(Rendered):
    """The analysis of one profiled run (one trace, or one trace per rank)."""

    def __init__(
        self,
        analyses: Sequence[Analysis | Rank],
        source: str,
        live: LiveState | None = None,
        name: str | None = None,
    ) -> None:
        if not analyses:
            raise ValueError("a ProfileResult needs at least one analysed trace")
        # An analysis in memory is a rank numbered as its trace says (else by position);
        # load_trace hands a directory's ranks over already numbered, as summaries.
        self._ranks = [
            a
            if isinstance(a, Rank)
            else Rank(a.trace.rank if a.trace.rank is not None else i, analysis=a)
            for i, a in enumerate(analyses)
        ]
        self.source = source
        self.live = live
        self.name = name or Path(source).name
        # Table rows whenever the result shows itself (Out[], display(), to_text(), to_html());
        # None: TEXT_ROWS as text, HTML_ROWS as HTML. %gpuprofile --rows N sets it on every
        # result it keeps, so it shows the same rows later as where it was made. This is the
        # one choice of rows (see table_rows); only export() and the CLI pass their own.
        self.display_rows: int | None = None
        # What the recording itself tells about the trace (no GPU events although CUDA was
        # recorded; the profiler stopped collecting early), and what the traces' own events
        # say (an accelerator read through another's categories, device work that cannot be
        # timed), shown above the report; each once, for all ranks.
        self.notes: list[str] = list(dict.fromkeys(n for r in self._ranks for n in r.notes))
        # The earlier runs of the same cell (%%gpuprofile --repeat N), oldest first: their
        # steps are samples of the step time too (see step_samples); the tables are this run's.
        self.earlier_runs: list[ProfileResult] = []
        # How a directory's ranks were analysed ("a pool of 8 processes", ...); None for
        # ranks analysed whole in this process.
        self.reduced_by: str | None = None

    # --- ranks -----------------------------------------------------------------------

    @property
    def analyses(self) -> list[Analysis]:
        """Every rank's full analysis. A rank held as a summary is read again for this: with
        many ranks prefer :attr:`per_rank`, :attr:`rank_summaries` and :meth:`rank`."""
        i = self._primary_index
        return [self.primary if j == i else r.analysis() for j, r in enumerate(self._ranks)]

    @property
    def rank_summaries(self) -> list[RankSummary]:
        """Each rank's summary (steps, breakdown, idle, collectives, top operators and
        kernels, lines and modules), in rank-file order; made here for ranks held whole."""
        return [r.summary for r in self._ranks]

    @cached_property
    def _primary_index(self) -> int:
        if len(self._ranks) == 1:
            return 0
        sync = self._synchronised
        work = [own_work_us(r, sync) for r in self._ranks]
        return max(range(len(work)), key=work.__getitem__)

    @cached_property
    def primary(self) -> Analysis:
        """The analysis the tables describe: the only one, or the slowest rank's (read from
        its file the first time, when the ranks are held as summaries)."""
        return self._ranks[self._primary_index].analysis()

    @property
    def ranks(self) -> list[int]:
        return [r.number for r in self._ranks]

    @property
    def slowest_rank(self) -> int | None:
        """The rank the others wait for, when there are several ranks.

        Ranks that synchronise (DDP's all-reduce) all take as long per step as the slowest
        one, so their step times cannot tell it; their own work can: the step less the time
        in collectives, where the others wait for it (the rank holding them up waits least).
        Without collectives in the traces, the rank with the longest mean step."""
        if len(self._ranks) < 2:
            return None
        return self._ranks[self._primary_index].number

    @property
    def _synchronised(self) -> bool:
        return all(r.collective_us_per_step > 0 for r in self._ranks)

    @property
    def has_communication(self) -> bool:
        """Some rank ran collectives (kernels, CPU-backend spans, or recorded calls)."""
        return any(r.communicates for r in self._ranks)

    def rank(self, rank: int) -> ProfileResult:
        """The result for one rank alone (its file read again, when held as a summary)."""
        for i, r in enumerate(self._ranks):
            if r.number == rank:
                a = self.primary if i == self._primary_index else r.analysis()
                return ProfileResult([a], a.trace.source, self.live)
        raise KeyError(f"no rank {rank} in {self.source} (ranks: {self.ranks})")

    @cached_property
    def slow_ranks(self) -> pd.DataFrame:
        """The ranks that hold the job up, slowest first: how far behind the median rank
        each is per step, and why (more compute, input stalls, waiting in collectives); see
        :func:`gpumagic.profile.ranks.slow_ranks`. Empty for one rank."""
        return slow_ranks(self._ranks, self._synchronised)

    @cached_property
    def per_rank(self) -> pd.DataFrame:
        """One row per rank: step time, utilisation, breakdown shares, device idle."""
        import pandas as pd

        rows = [{"rank": r.number, "file": Path(r.file).name, **r.row()} for r in self._ranks]
        frame = pd.DataFrame(rows)
        frame["collective_wait_us_per_step"] = self._collective_waits
        frame["slowest"] = frame["rank"] == self.slowest_rank
        return frame.sort_values("rank", kind="stable").reset_index(drop=True)

    # --- runs and their steps as samples ------------------------------------------------

    @property
    def runs(self) -> list[ProfileResult]:
        """Every run of the cell this result holds: the earlier ones of ``--repeat N``, then
        this one (whose trace the tables describe)."""
        return [*self.earlier_runs, self]

    @property
    def step_samples(self) -> list[np.ndarray]:
        """Per run (:attr:`runs`), the duration in µs of each analysed step: the samples a
        comparison's interval is drawn from (:mod:`gpumagic.profile.analysis.noise`)."""
        return [r.primary.steps.duration.astype(float) for r in self.runs]

    def category_samples(self) -> list[np.ndarray]:
        """Per run, µs of each breakdown category in each analysed step (steps x
        :data:`~gpumagic.profile.analysis.breakdown.CATEGORIES`)."""
        return [np.asarray(r.primary.breakdown.us, float) for r in self.runs]

    def metric_samples(self) -> dict[str, list[np.ndarray]]:
        """Per headline metric that has one value per step, the values per run: step time,
        and on a GPU the share of each step a compute kernel ran (percent) and the µs no
        kernel, copy or set ran. What a comparison draws its intervals from."""
        from gpumagic.profile.analysis.breakdown import step_device_busy

        out: dict[str, list[np.ndarray]] = {"step_time_us": self.step_samples}
        if not all(r.primary.trace.has_gpu for r in self.runs):
            return out
        util, idle = [], []
        for r in self.runs:
            a = r.primary
            duration = a.steps.duration.astype(float)
            compute, busy = step_device_busy(a.trace, a.steps, a.comms.kernels)
            with np.errstate(divide="ignore", invalid="ignore"):
                util.append(np.where(duration > 0, 100.0 * compute / duration, np.nan))
            idle.append(duration - busy)
        out["gpu_utilization_percent"] = util
        out["gpu_idle_us_per_step"] = idle
        return out

    def with_earlier_runs(self, earlier: list[ProfileResult]) -> ProfileResult:
        """The same run, holding ``earlier`` runs of the same cell as further samples."""
        out = self._same_run(self.live)
        out.earlier_runs = [r for e in earlier for r in e.runs]
        return out

    def _same_run(self, live: LiveState | None) -> ProfileResult:
        """A new result of the same analyses (its summary and findings made again), with
        everything else this one holds."""
        out = ProfileResult(self._ranks, self.source, live, self.name)
        out.notes = list(self.notes)
        out.display_rows = self.display_rows
        out.reduced_by = self.reduced_by
        out.earlier_runs = list(self.earlier_runs)
        if "primary" in self.__dict__:  # already read: the new result need not read it again
            out.__dict__["primary"] = self.__dict__["primary"]
        return out

    # --- the tables ------------------------------------------------------------------

    @cached_property
    def summary(self) -> ProfileSummary:
        """Headline numbers (µs, percent, counts) for the run: see :class:`ProfileSummary`."""
        return summarise(
            self.primary,
            source=self.source,
            ranks=len(self._ranks),
            slowest_rank=self.slowest_rank,
            findings=len(self.findings),
            collective_wait_us_per_step=self._collective_waits[self._primary_index],
            step_samples=self.step_samples,
        )

    @cached_property
    def breakdown(self) -> pd.DataFrame:
        """Mean µs per step and percent of the step, per category (index: :data:`~gpumagic.profile.analysis.breakdown.CATEGORIES`)."""
        return self.primary.breakdown_frame()

    @cached_property
    def steps(self) -> pd.DataFrame:
        """One row per step: span (µs from the trace start), duration, µs per category."""
        return self.primary.steps_frame()

    @cached_property
    def ops(self) -> pd.DataFrame:
        """Operators grouped by name, totals over the whole trace, by device time."""
        return self.primary.ops_frame()

    @cached_property
    def ops_by_shape(self) -> pd.DataFrame:
        """Operators grouped by name and recorded input shapes/dtypes (``record_shapes=True``)."""
        return self.primary.ops_by_shape_frame()

    @cached_property
    def kernels(self) -> pd.DataFrame:
        """GPU kernels grouped by name: calls, time, blocks per SM, achieved occupancy."""
        return self.primary.kernels_frame()

    @property
    def idle(self) -> IdleReport:
        """GPU idle time in the analysed steps, split HTA's way; the longest gaps."""
        return self.primary.idle

    def idle_breakdown(self, window: str = "steps", gaps: int = 10) -> IdleReport:
        """The idle analysis over another window: ``"hta"`` reproduces HTA's selection."""
        return self.primary.idle_report(window, gaps)

    @cached_property
    def collectives(self) -> pd.DataFrame:
        """Collectives per rank: calls, device/host time, message bytes, group size,
        algorithm and bus bandwidth as nccl-tests defines them (see :mod:`gpumagic.profile.analysis.comms`)."""
        import pandas as pd

        frames = [r.collectives() for r in self._ranks]
        frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        return frame.sort_values("rank", kind="stable").reset_index(drop=True)

    @cached_property
    def overlap(self) -> pd.DataFrame:
        """Per rank and step: computation only, overlap, communication only, other (µs): the
        TensorBoard plugin's Distributed View."""
        import pandas as pd

        frames = [r.overlap() for r in self._ranks]
        frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        return frame.sort_values("rank", kind="stable").reset_index(drop=True)

    @cached_property
    def _collective_waits(self) -> list[float | None]:
        """Per rank (in analysis order), µs per step waiting in collectives for the others."""
        from gpumagic.profile.analysis.comms import waits_from_durations

        if len(self._ranks) < 2:
            return [None] * len(self._ranks)
        return waits_from_durations(
            [r.call_durations() for r in self._ranks], [r.step_count for r in self._ranks]
        )

    @cached_property
    def lines(self) -> pd.DataFrame:
        """One row per statement of the profiled cell that ran: line, source, hits, host_us
        (its own, without nested rows: the rows add up to the analysed steps), device_us (GPU work it
        launched, whatever thread launched it), device_percent, top_op, top_kernel. Empty
        for a trace recorded outside ``%%gpuprofile`` (see :attr:`lines_note`)."""
        from gpumagic.profile.analysis.lines import line_attribution

        return line_attribution(self.primary).frame()

    @property
    def lines_note(self) -> str:
        """Why :attr:`lines` is empty ("" when it is not)."""
        from gpumagic.profile.analysis.lines import NO_LINES_NOTE

        return "" if len(self.primary.trace.code.statements) else NO_LINES_NOTE

    @cached_property
    def modules(self) -> pd.DataFrame:
        """One row per ``nn.Module`` instance called in the run: module (its name in the
        namespace, ``model.layer1.0.conv1``), type, calls, depth, forward and backward host
        and device µs (inclusive of its children), parent. From ``%%gpuprofile``'s module
        hooks, or from a ``with_stack=True`` trace's ``nn.Module`` frames; empty otherwise."""
        from gpumagic.profile.analysis.modules import module_attribution

        return module_attribution(self.primary).frame()

    @property
    def lines_span_us(self) -> float:
        """The µs the cell's statements spanned, of which :attr:`lines` accounts the host time."""
        from gpumagic.profile.analysis.lines import line_attribution

        return line_attribution(self.primary).profiled_us

    @property
    def modules_note(self) -> str:
        """Where :attr:`modules` came from (``%%gpuprofile``'s hooks, or the stacks of a
        ``with_stack=True`` trace) and what that means for reading it."""
        from gpumagic.profile.analysis.modules import ORIGIN_NOTES, module_attribution

        return ORIGIN_NOTES.get(module_attribution(self.primary).origin, "")

    def gpu_busy(self, bins: int) -> np.ndarray:
        """Per slice of the analysed steps cut into ``bins`` equal slices (the first step's
        start to the last one's end), the fraction of it in which some GPU event ran."""
        from gpumagic.profile.analysis import intervals

        a = self.primary
        lo, hi = a.steps.span
        if hi <= lo or not a.trace.has_gpu:
            return np.zeros(bins)
        edges = np.linspace(lo, hi, bins + 1)
        gpu = a.trace.gpu
        busy: np.ndarray = np.diff(intervals.cumulative(gpu.ts, gpu.end, edges)) / np.diff(edges)
        return busy

    @cached_property
    def findings(self) -> list[Finding]:
        """The diagnosis, ranked by estimated saving per step."""
        return diagnose(self.primary, self.live)

    def with_live(self, live: LiveState | None) -> ProfileResult:
        """The same analysis, diagnosed with session facts (see :mod:`gpumagic.profile.live`)."""
        return self._same_run(live)

    # --- output ----------------------------------------------------------------------

    def table_rows(self, form: Literal["text", "html", "page"], rows: int | None = None) -> int:
        """Rows in each table of the report as ``form`` ("text", "html" or "page"): ``rows``
        where given, else :attr:`display_rows`, else the form's default. A page (``export``)
        has its own default and takes no display_rows: it is a file, not a display."""
        if rows is not None:
            return rows
        if form == "page":
            return PAGE_ROWS
        if self.display_rows is not None:
            return self.display_rows
        return TEXT_ROWS if form == "text" else HTML_ROWS

    def _report(self) -> Report:
        from gpumagic.render.profile import profile_report

        return profile_report(self, self.table_rows("text"))

    def _text(self) -> str:
        return self.to_text()

    def _html(self) -> str:
        return self.to_html()

    def to_text(self, rows: int | None = None) -> str:
        """The report as text, ``rows`` rows in each table (see :meth:`table_rows`)."""
        from gpumagic.render.profile import profile_report

        return profile_report(self, self.table_rows("text", rows)).text()

    def to_html(self, rows: int | None = None) -> str:
        """The report as HTML, ``rows`` rows in each table (see :meth:`table_rows`; no
        stylesheet: see :mod:`gpumagic.render.html`; ``export`` writes a page with one)."""
        from gpumagic.render.profile import profile_report

        return profile_report(self, self.table_rows("html", rows)).html(style=False)

    def export(self, path: str | Path, rows: int | None = None) -> Path:
        """Write a self-contained HTML report (no scripts, no external files), ``rows`` rows
        in each table (default 50)."""
        from gpumagic.render.profile import report_document

        out = Path(path)
        out.write_text(report_document(self, self.table_rows("page", rows)), encoding="utf-8")
        return out
