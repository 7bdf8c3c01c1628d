"""``%%memtrace`` / ``%memtrace``: IPython glue over :mod:`gpumagic.memory`."""

from __future__ import annotations

from typing import Any

from IPython.core.magic import (
    Magics,
    line_cell_magic,
    magics_class,
    no_var_expand,
    output_can_be_silenced,
)

from gpumagic.usage import MagicParser, documented, output_option, returns_result

PARSER = MagicParser(
    "%%memtrace",
    description="Run the cell and account memory to each statement.",
    forms=["%memtrace [options] STATEMENT   (one statement)"],
)
output_option(PARSER, "a cell's value, a statement's value")
PARSER.add_argument("-d", "--device", metavar="DEV", help="cuda, cuda:N or host (default: CUDA if available)")
PARSER.add_argument("-q", "--quiet", action="store_true", help="display nothing; the result is still stored")
PARSER.add_argument("--no-live", action="store_true", help="no live view while the cell runs")
PARSER.add_argument(
    "--sync", action="store_true",
    help="synchronise the CUDA device at each statement, so its time includes its GPU work",
)
PARSER.add_argument(
    "--no-tensors", action="store_true",
    help="no tensor census (no categories): the CUDA allocator's counters alone, or the host's RSS",
)


@magics_class
class MemtraceMagics(Magics):
    @no_var_expand
    @output_can_be_silenced
    @line_cell_magic
    @documented(PARSER)
    def memtrace(self, line: str, cell: str | None = None) -> Any:
        """Per-statement memory accounting: one row per statement of the cell.

        Counts tensor bytes on the traced device (CUDA, else the CPU) by category:
        parameters, gradients, optimizer state, activations, temporaries, inputs, other.
        The result (``_memtrace``) has ``.lines``, a DataFrame with
        line, source, hits, delta_bytes (summed over hits), delta_per_hit_bytes,
        peak_bytes (the highest hit), allocated_bytes, reserved_bytes, host_delta_bytes,
        host_peak_bytes (the process's RSS) and one ``<category>_bytes`` column per
        category; ``.timeline`` (memory by category over the cell), ``.at_peak`` (what was
        alive at the peak, activations by module), ``.export_memory_viz(path)`` and
        ``.plot()``. Per-statement peaks reset the device's peak counter
        (``torch.cuda.max_memory_allocated``) at each statement.

        On CUDA the ``time`` column is host time (kernels run asynchronously); ``--sync``
        waits for the device at each statement boundary so each time includes the GPU work
        the statement queued, and the report says what those waits cost.
        ``t = %memtrace -o x @ y`` keeps the result (-o, as ``%timeit -o``).
        """
        __tracebackhide__ = True
        from gpumagic.cell import ShellCompiler, prepare, run_measured
        from gpumagic.memory.trace.device import DeviceError
        from gpumagic.memory.trace.run import MemtraceRun
        from gpumagic.render.live import LiveResult, LiveView
        from gpumagic.render.memtrace import memtrace_live_html

        parsed = _parse(line, cell)
        if parsed is None:  # -h: the help was printed
            return None
        opts, source, header = parsed
        shell: Any = self.shell
        prepared = prepare(ShellCompiler(shell), source, header, instrument=True)
        try:
            run = MemtraceRun(
                prepared.statements,
                shell.user_ns,
                opts.device,
                sync=opts.sync,
                cell_filename=prepared.filename,
                tensors=not opts.no_tensors,
            )
        except DeviceError as exc:
            raise PARSER.usage_error(str(exc)) from None
        mode = "off" if opts.quiet or opts.no_live else None
        view = LiveView(lambda: memtrace_live_html(run.status()), delay=1.0, interval=1.0, mode=mode)

        kept: dict[str, Any] = {}

        def present(result: Any) -> Any:
            if result is None:
                return None
            result.live_frames = view.pushes
            shell.user_ns["_memtrace"] = kept["result"] = result
            # -o: the result is the magic's value, shown once as Out[] (`t = ...` keeps it)
            return None if opts.quiet or returns_result(opts) else result

        value = run_measured(
            shell.user_global_ns, prepared, run, LiveResult(view, present), local_ns=shell.user_ns
        )
        return kept.get("result") if returns_result(opts) else value


def _parse(line: str, cell: str | None) -> tuple[Any, str, str | None] | None:
    """(options, source, the magic's own line for a cell, None for %memtrace STATEMENT);
    None after -h."""
    if cell is None:
        parsed = PARSER.parse_prefix(line)
        if parsed is None:
            return None
        opts, statement = parsed
        if not statement:
            raise PARSER.usage_error("give a statement to trace, or use %%memtrace as a cell magic")
        source, header = statement, None
    else:
        whole = PARSER.parse_line(line)
        if whole is None:
            return None
        opts, source, header = whole, cell, f"%%memtrace {line}".rstrip()
    return opts, source, header
