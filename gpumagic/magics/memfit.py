"""``%%memfit``: IPython glue over :mod:`gpumagic.memory.fit`.

The cell is prepared by the shared runner (:func:`gpumagic.cell.prepare`: IPython syntax,
the cell's own line numbers, a probe before each statement) but not run through
:func:`gpumagic.cell.run_measured`: a dry run does not run the cell in the namespace, runs
it several times (``--batch``, ``--what-if``), and its value is a fake tensor, which must
never reach ``Out[]``. The magic's value is the prediction.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from IPython.core.magic import Magics, cell_magic, magics_class, no_var_expand

from gpumagic.render.live import kept_off_screen
from gpumagic.usage import MagicParser, documented, output_option, returns_result

PARSER = MagicParser(
    "%%memfit",
    description=(
        "Dry-run the cell on fake tensors (no allocation, no GPU needed) and predict its CUDA "
        "peak: by category and module, against a GPU with the headroom, the largest batch, "
        "and what each fix would save."
    ),
)
output_option(PARSER, "without it too, unless -q")
PARSER.add_argument("--gpu", metavar="NAME", help='a GPU of the table ("A100 80GB", H100, T4, "RTX 4090", ...)')
PARSER.add_argument("--memory", metavar="SIZE", help="the GPU memory to fit in instead (24GiB, 80GB)")
PARSER.add_argument(
    "--batch", metavar="VAR=v1,v2,...",
    help="set VAR to each size for a dry run, fit peak against it, report the largest that fits",
)
PARSER.add_argument(
    "--what-if", metavar="FIX,...", dest="what_if",
    help="amp, checkpoint, sgd, adafactor, set_to_none, batch, lora:RANK, or all: each a dry run with the change",
)
PARSER.add_argument("--gpus", metavar="N", type=int, help="with --shard: the number of GPUs the step is sharded over")
PARSER.add_argument(
    "--shard", metavar="MODE,...",
    help="ddp, fsdp, zero1, zero2, zero3 or all: one rank's peak at --gpus N, and the smallest N that fits",
)
PARSER.add_argument("--timeout", metavar="SECONDS", type=float, default=120.0, help="per dry run (default 120)")
PARSER.add_argument("-q", "--quiet", action="store_true", help="display nothing; the result is still stored")


class MemfitError(RuntimeError):
    """The dry run stopped before the end of the cell; the partial report was shown."""


@magics_class
class MemfitMagics(Magics):
    @no_var_expand
    @cell_magic
    @documented(PARSER)
    def memfit(self, line: str, cell: str) -> Any:
        """Predict whether the cell fits on a GPU, before running it there.

        The result (``_memfit``, and the cell's value unless -q without -o) has
        ``.peak_bytes``, ``.categories``, ``.modules`` (DataFrame), ``.peak_line``, ``.fits``
        (True, False, or None within the headroom's uncertainty), ``.max_batch``,
        ``.what_if`` (DataFrame), ``.notes``.
        """
        __tracebackhide__ = True
        from gpumagic.cell import ShellCompiler, prepare
        from gpumagic.memory.fit.api import batch_unread, predict

        opts = PARSER.parse_line(line)
        if opts is None:  # -h: the help was printed
            return None
        fit_opts = _options(opts)
        shell: Any = self.shell
        # a statement that does not compile stops the magic before any dry run, shown as
        # IPython shows it: the dry run never sets the user's names, so there is nothing of a
        # plain cell's "the statements before it ran" to reproduce
        prepared = prepare(
            ShellCompiler(shell), cell, f"%%memfit {line}".rstrip(), instrument=True, raise_compile_errors=True
        )
        if fit_opts.batch is not None:
            unread = batch_unread(prepared, fit_opts.batch[0], shell.user_ns)
            if unread:
                raise PARSER.usage_error(unread)
        with kept_off_screen() as shown:
            fit = predict(prepared, shell.user_ns, replace(fit_opts, hidden=frozenset(shell.user_ns_hidden)))
        if shown:
            fit.notes.append(f"The dry runs displayed {shown[0]} outputs (figures, tables), not shown.")
        shell.user_ns["_memfit"] = fit
        if fit.error:
            if not opts.quiet:
                from IPython.display import display

                display(fit)
            raise MemfitError(f"%%memfit: the dry run stopped at {fit.error}")
        return None if opts.quiet and not returns_result(opts) else fit


def _options(opts: Any) -> Any:
    from gpumagic.memory.fit.api import fit_options

    try:
        return fit_options(
            opts.gpu, opts.memory, opts.batch, opts.what_if or (), opts.timeout, opts.gpus, opts.shard
        )
    except ValueError as exc:
        raise PARSER.usage_error(str(exc)) from None
