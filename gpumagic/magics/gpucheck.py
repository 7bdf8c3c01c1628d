"""``%gpucheck``: IPython glue over :func:`gpumagic.environment.check.gpucheck`."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class, output_can_be_silenced

from gpumagic.usage import (
    MagicParser,
    documented,
    index_list,
    output_option,
    returns_result,
    without_silencer,
)

PARSER = MagicParser(
    "%gpucheck",
    description="Judge each visible GPU against its defaults and its specification (NVML "
    "readings, short measurements) and name what slows it down, with the fix; without a "
    "GPU, the host.",
)
output_option(PARSER, "otherwise it is shown, and kept in _gpucheck")
PARSER.add_argument(
    "--no-measure",
    action="store_true",
    help="readings only: no measurement, so no CUDA context is created (under a second)",
)
PARSER.add_argument(
    "--id",
    type=index_list,
    metavar="N[,M...]",
    help="the CUDA indexes of the GPUs to check, as nvidia-smi --id (default: every visible GPU)",
)
PARSER.add_argument(
    "--seconds",
    type=float,
    default=0.3,
    metavar="S",
    help="how long each figure is measured (default 0.3; the whole check takes about ten figures per GPU)",
)


@magics_class
class GpuCheckMagics(Magics):
    @output_can_be_silenced
    @line_magic
    @documented(PARSER)
    def gpucheck(self, line: str = "") -> Any:
        """Why is this GPU slower than it should be? Readings and measurements, judged.

        Each visible GPU's clocks and clock-event (throttle) reasons, power limit, PCIe link,
        temperature, persistence, compute and MIG modes and ECC health, read through NVML and
        judged against the card's defaults; then a few short measurements (matmul in FP32,
        TF32, BF16 and FP16, memory bandwidth, host-device copies, kernel launch) beside the
        card's specification, each with its source. Findings come first, ranked by what they
        cost, each with its cause, evidence and fix, or a plain "nothing found"; without a GPU
        the host's figures are measured and judged and a line says what could not be checked.
        The measurements start CUDA in this kernel. The result is kept in ``_gpucheck``
        (``.findings``, ``.measurements``, ``.to_dict()``); ``gpumagic.gpucheck()`` returns
        the same from a script, and ``%gpuenv --save FILE.json`` writes it beside the
        environment report.
        """
        from gpumagic.environment.check import gpucheck

        opts = PARSER.parse_line(without_silencer(line))
        if opts is None:  # -h: the help was printed
            return None
        if not 0 < opts.seconds <= 10:
            raise PARSER.usage_error(f"--seconds must be above 0 and at most 10, got {opts.seconds:g}")
        try:
            result = gpucheck(measure=not opts.no_measure, devices=opts.id, seconds=opts.seconds)
        except ValueError as exc:  # an index that is not visible
            raise UsageError(f"%gpucheck: {exc}") from None
        shell: Any = self.shell
        shell.user_ns["_gpucheck"] = result
        if returns_result(opts):
            return result
        from IPython.display import display

        display(result)
        return None
