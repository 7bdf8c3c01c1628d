"""``%%gpuprofile`` / ``%gpuprofile``: IPython glue over :mod:`gpumagic.profile`.

Parse the options, run the cell through the shared runner once per ``--repeat`` (the core
merges the runs: :class:`~gpumagic.profile.record.repeat.Repeats`), keep the result and
show it, the core's notes above it (:meth:`~gpumagic.profile.record.finish.Finished.notes`).
"""

from __future__ import annotations

from typing import Any

from IPython.core.magic import Magics, line_cell_magic, magics_class, output_can_be_silenced

from gpumagic.cell import running_cell_number
from gpumagic.render.profile_notes import noted
from gpumagic.usage import (
    MagicParser,
    documented,
    output_option,
    returns_result,
    without_silencer,
)

PARSER = MagicParser(
    "%%gpuprofile",
    description="Profile the cell under torch.profiler and explain where the time went.",
    forms=[
        "%gpuprofile --compare A B [-o] [-q]   two runs kept with -n, side by side",
        "%gpuprofile --load PATH [--rows N] [-o] [-q]   a saved trace or rank folder",
    ],
)
PARSER.add_argument("-n", "--name", metavar="NAME", help="keep this run under NAME for --compare")
output_option(PARSER, "a cell's value; the line forms return theirs anyway")
PARSER.add_argument("--rows", type=int, default=15, metavar="N", help="rows in the operator and kernel tables")
# torch.profiler's own names: profile(profile_memory=..., record_shapes=..., with_stack=...,
# with_flops=...)
PARSER.add_argument(
    "--profile-memory", dest="memory", action="store_true", help="record memory (torch.profiler's profile_memory=True)"
)
PARSER.add_argument("--record-shapes", dest="shapes", action="store_true", help="record input shapes (record_shapes=True)")
PARSER.add_argument("--with-stack", dest="stack", action="store_true", help="record Python stacks (with_stack=True)")
PARSER.add_argument("--with-flops", dest="flops", action="store_true", help="estimate FLOPs (with_flops=True)")
PARSER.add_argument(
    "--wait", type=int, metavar="N",
    help="schedule, as torch.profiler.schedule(wait=N): steps to skip (needs gpumagic.step())",
)
PARSER.add_argument("--warmup", type=int, metavar="N", help="schedule: warm-up steps")
PARSER.add_argument("--active", type=int, metavar="N", help="schedule: steps to record")
PARSER.add_argument(
    "--keep-first", action="store_true",
    help="keep the first gpumagic.step() step (first-call setup) in the step statistics",
)
PARSER.add_argument(
    "--repeat", type=int, default=1, metavar="N",
    help="run the cell N times: the steps of every run are samples of the step time, so "
    "--compare counts run-to-run noise too (the tables describe the last run)",
)
PARSER.add_argument(
    "--no-attribution", action="store_true",
    help="no time per line and per nn.Module (no statement ranges, no module hooks)",
)
PARSER.add_argument("--trace", metavar="PATH", help="write the Chrome trace here (.json or .json.gz; opens in Perfetto)")
PARSER.add_argument(
    "-q", "--quiet", action="store_true",
    help="display nothing (a line form returns None unless -o); the result is still stored",
)
PARSER.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two named runs (line magic)")
PARSER.add_argument("--load", metavar="PATH", help="analyse a saved trace file or per-rank directory (line magic)")


@magics_class
class ProfileMagics(Magics):
    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.runs: dict[str, Any] = {}  # -n NAME -> result, for --compare
        self.last_live_frames = 0  # frames the live line pushed during the last profiled cell

    # No @no_var_expand: the line holds only options, and "--active {STEPS}" or "--trace
    # $path" from a parameters cell is what a notebook wants.
    @output_can_be_silenced
    @line_cell_magic
    @documented(PARSER)
    def gpuprofile(self, line: str, cell: str | None = None) -> Any:
        """Profile a cell under torch.profiler: step-time breakdown, GPU idle, tables, diagnosis.

        The line forms return their result (``cmp = %gpuprofile --compare A B`` keeps it, a
        bare call shows it as ``Out[]``, a trailing ``;`` or ``--quiet`` shows nothing); it is
        also kept in ``_gpuprofile_compare`` / ``_gpuprofile``. ``--compare`` gives each change
        with its 95% interval, and a verdict: faster, slower, or no difference beyond the noise.

        Inside the cell, ``gpumagic.step()`` marks the end of a training step (a no-op outside
        a profile); without marks each DataLoader batch starts a step, else the whole cell is
        one step. Without a schedule the first marked step (first-call setup: cuBLAS/cuDNN
        handles, lazy CUDA module loading, autotuning) is left out of the step statistics
        when others follow. The result (``_gpuprofile``) has ``.summary``, ``.breakdown``,
        ``.steps``, ``.ops``, ``.kernels``, ``.idle``, ``.findings``, ``.notes`` and
        ``.export(path)``; ``.lines`` (time per statement of the cell) and ``.modules`` (per
        ``nn.Module`` instance, forward and backward), and each finding's
        ``line``/``source``/``module`` say where in the code the time went.
        """
        __tracebackhide__ = True
        opts = PARSER.parse_line(without_silencer(line) if cell is None else line)
        if opts is None:  # -h: the help was printed
            return None
        PARSER.check_variable("-n", opts.name)
        if opts.rows < 1:
            raise PARSER.usage_error("--rows must be at least 1")
        if opts.repeat < 1:
            raise PARSER.usage_error("--repeat must be at least 1")
        if cell is None:
            return self._line(opts)
        if opts.compare or opts.load:
            raise PARSER.usage_error(
                "--compare and --load are line magics: %gpuprofile --load PATH"
            )
        return self._profile(opts, cell, line)

    # -- %gpuprofile --compare / --load ---------------------------------------------------------
    def _line(self, opts: Any) -> Any:
        # Returned, not display()ed: IPython shows the value once as Out[] (a trailing ";"
        # drops it, through @output_can_be_silenced) and `x = %gpuprofile ...` keeps it.
        # --quiet asks for nothing shown, and a returned value would show, so it returns None.
        result: Any
        if opts.compare:
            from gpumagic.profile.compare import compare

            result = compare(*(self._run_named(n) for n in opts.compare))
        elif opts.load:
            from gpumagic.profile.load import load_trace
            from gpumagic.profile.trace.errors import TraceError

            try:
                result = load_trace(opts.load)
            except TraceError as exc:
                raise PARSER.usage_error(str(exc)) from None
        else:
            raise PARSER.usage_error("as a line magic, give --compare A B or --load PATH")
        self._store(result, opts)
        return None if opts.quiet and not returns_result(opts) else result

    def _run_named(self, name: str) -> Any:
        from gpumagic.profile.result import ProfileResult

        if name in self.runs:
            return self.runs[name]
        value = self.shell.user_ns.get(name)  # type: ignore[union-attr]
        if isinstance(value, ProfileResult):
            return value
        known = ", ".join(sorted(self.runs)) or "none yet (use %%gpuprofile -n NAME)"
        raise PARSER.usage_error(f"no run named {name!r}; runs kept: {known}")

    # -- %%gpuprofile ---------------------------------------------------------------------------
    def _profile(self, opts: Any, cell: str, line: str) -> Any:
        __tracebackhide__ = True
        from gpumagic.cell import ShellCompiler, prepare
        from gpumagic.profile.record.repeat import Repeats

        shell: Any = self.shell
        prepared = prepare(
            ShellCompiler(shell), cell, f"%%gpuprofile {line}".rstrip(), instrument=not opts.no_attribution
        )
        # the temporary trace file's name says nothing: a cell is known by its In[n]
        number = running_cell_number(shell)
        name = opts.name or (f"cell In[{number}]" if number is not None else "cell")
        repeats = Repeats(opts.repeat)
        value = None
        for last in repeats:
            value = self._run_once(prepared, opts, name, repeats, last)
        return value

    def _run_once(self, prepared: Any, opts: Any, name: str, repeats: Any, last: bool) -> Any:
        """One profiled run of the cell (of ``--repeat N``): the cell's value, or with -o
        (after the last run) the result."""
        __tracebackhide__ = True
        from gpumagic.cell import run_measured
        from gpumagic.profile.record.recorder import RecordError, RecordOptions
        from gpumagic.profile.record.run import ProfileRun
        from gpumagic.render.live import LiveResult, LiveView
        from gpumagic.render.profile_live import profile_live_html

        options = RecordOptions(
            opts.memory, opts.shapes, opts.stack, opts.flops, opts.wait, opts.warmup, opts.active
        )
        try:
            run = ProfileRun(
                prepared.statements,
                self.shell.user_ns,  # type: ignore[union-attr]
                options,
                attribute=not opts.no_attribution,
                name=name,
                trace_path=opts.trace if last else None,
                keep_first=opts.keep_first,
            )
        except ImportError as exc:
            raise PARSER.usage_error(f"%%gpuprofile needs torch: {exc}") from None
        except (RecordError, ValueError) as exc:  # one inside another; a bad schedule
            raise PARSER.usage_error(str(exc)) from None
        # one display slot per cell: the runs before the last of --repeat N show none (a
        # live view would leave an empty output behind each of them)
        mode = "off" if opts.quiet or not last else None
        view = LiveView(lambda: profile_live_html(run.status()), delay=1.0, interval=1.0, mode=mode)
        kept: list[Any] = []

        def present(done: Any) -> Any:
            self.last_live_frames = view.pushes
            # None: the ending was interrupted, or a run kept as samples for the last one
            done = repeats.end(done, last) if done is not None else None
            if done is None:
                return None
            if done.result is not None:  # a partial result too: the user may look into it
                self._store(done.result, opts)
                kept.append(done.result)
            return None if opts.quiet else noted(done, returns_result(opts))

        shell: Any = self.shell
        value = run_measured(
            shell.user_global_ns, prepared, run, LiveResult(view, present), local_ns=shell.user_ns
        )
        # -o: the result is the magic's value (Out[] shows it with --rows rows)
        return kept[0] if last and returns_result(opts) and kept else value

    def _store(self, result: Any, opts: Any) -> None:
        """Keep a result in ``_gpuprofile`` (a comparison in ``_gpuprofile_compare``), a
        profiled cell's under -n NAME for --compare too; a profile shows --rows rows, where
        it is made and whenever it shows again."""
        from gpumagic.profile.result import ProfileResult

        ns = self.shell.user_ns  # type: ignore[union-attr]
        if not isinstance(result, ProfileResult):
            ns["_gpuprofile_compare"] = result
            return
        result.display_rows = opts.rows
        ns["_gpuprofile"] = result
        if opts.name and not opts.load:
            self.runs[opts.name] = result
