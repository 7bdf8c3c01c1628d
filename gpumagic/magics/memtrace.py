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

from gpumagic.magics.args import MagicParser

PARSER = MagicParser(
    "%%memtrace",
    description="Run the cell and account memory to each statement.",
)
PARSER.add_argument("-o", "--output", metavar="NAME", help="also store the result under NAME")
PARSER.add_argument(
    "-d", "--device", metavar="DEV", help="cuda, cuda:N or host (default: CUDA if available)"
)
PARSER.add_argument(
    "-q", "--quiet", action="store_true", help="display nothing; the result is still stored"
)
PARSER.add_argument("--no-live", action="store_true", help="no live view while the cell runs")
PARSER.add_argument(
    "--sync",
    action="store_true",
    help="synchronise the CUDA device at each statement, so its time includes its GPU work",
)
PARSER.add_argument(
    "--no-tensors",
    action="store_true",
    help="no tensor census (no categories): the CUDA allocator's counters alone, or the host's RSS",
)


@magics_class
class MemtraceMagics(Magics):
    @no_var_expand
    @output_can_be_silenced
    @line_cell_magic
    def memtrace(self, line: str, cell: str | None = None) -> Any:
        """Per-statement memory accounting.

        %%memtrace [-o NAME] [--device DEV] [--sync] [--no-tensors] [--quiet] [--no-live]
        %memtrace [options] STATEMENT                               (one statement)

        Counts tensor bytes on the traced device (CUDA, else the CPU) by category:
        parameters, gradients, optimizer state, activations, temporaries, inputs, other.
        The result (``_memtrace``, and NAME with -o) has ``.lines``, a DataFrame with
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
        """
        __tracebackhide__ = True
        from gpumagic.cell import prepare, run_measured
        from gpumagic.memory.device import DeviceError
        from gpumagic.memory.run import MemtraceRun
        from gpumagic.render.live import LiveResult, LiveView
        from gpumagic.render.memtrace import memtrace_live_html

        opts, source, header = _parse(line, cell)
        shell: Any = self.shell
        prepared = prepare(shell, source, header, instrument=True)
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

        def present(result: Any) -> Any:
            if result is None:
                return None
            result.live_frames = view.pushes
            shell.user_ns["_memtrace"] = result
            if opts.output:
                shell.user_ns[opts.output] = result
            return None if opts.quiet else result

        return run_measured(shell, prepared, run, LiveResult(view, present))


def _parse(line: str, cell: str | None) -> tuple[Any, str, str | None]:
    """(options, source, the magic's own line for a cell, None for %memtrace STATEMENT)."""
    if cell is None:
        opts, statement = PARSER.parse_prefix(line)
        if not statement:
            raise PARSER.usage_error("give a statement to trace, or use %%memtrace as a cell magic")
        source, header = statement, None
    else:
        opts = PARSER.parse_line(line)
        source, header = cell, f"%%memtrace {line}".rstrip()
    if opts.output is not None and not opts.output.isidentifier():
        raise PARSER.usage_error(f"-o {opts.output!r}: not a valid variable name")
    return opts, source, header
