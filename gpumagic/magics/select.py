"""``%gpuselect``: IPython glue over :func:`gpumagic.monitor.choose.select_gpus`."""

from __future__ import annotations

from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class, output_can_be_silenced

from gpumagic.usage import MagicParser, documented, percent, whole_number, without_silencer

PARSER = MagicParser(
    "%gpuselect",
    description="Pick the least-loaded GPUs of a shared box and make them this kernel's GPUs "
    "(sets CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER=PCI_BUS_ID); run it before CUDA starts.",
)
PARSER.add_argument(
    "count", nargs="?", type=whole_number, default=1, metavar="N", help="how many GPUs (default 1), nvisel's -n N"
)
# nvitop's names (its nvisel command and select_devices(min_free_memory=...,
# max_gpu_utilization=...))
PARSER.add_argument(
    "-f", "--min-free-memory", dest="min_free", metavar="SIZE",
    help="only GPUs with at least this much free memory (8GiB, 500MiB)",
)
PARSER.add_argument(
    "-G", "--max-gpu-utilization", dest="max_util", type=percent, metavar="PCT", help="only GPUs at most this busy (percent)"
)
PARSER.add_argument("--no-others", action="store_true", help="only GPUs no other process is using")


@magics_class
class SelectMagics(Magics):
    @output_can_be_silenced
    @line_magic
    @documented(PARSER)
    def gpuselect(self, line: str = "") -> Any:
        """Choose the N least-loaded GPUs (free memory, utilisation, other users' processes).

        Sets CUDA_VISIBLE_DEVICES to the chosen GPUs (nvidia-smi's numbers) and
        CUDA_DEVICE_ORDER=PCI_BUS_ID, shows every GPU with why it was or was not chosen, and
        returns the choice (``c = %gpuselect 2``; ``c.indices``, ``c.table``). It must run
        before CUDA starts in this kernel (``torch.cuda.is_available()`` starts it): after
        that it refuses, changing nothing, as it does without an NVIDIA GPU or NVML.
        ``gpumagic.select_gpus(...)`` does the same from a script (raising ValueError).
        """
        from IPython.core.error import UsageError

        from gpumagic.monitor.choose import SelectError, select_gpus

        opts = PARSER.parse_line(without_silencer(line))
        if opts is None:  # -h: the help was printed
            return None
        try:
            return select_gpus(
                opts.count,
                min_free_memory=opts.min_free,
                max_gpu_utilization=opts.max_util,
                no_others=opts.no_others,
            )
        except SelectError as exc:
            # not a typo: no GPU here, CUDA started already, too few GPUs qualify. Said
            # plainly, without the usage line that would send the user looking for one.
            raise UsageError(f"%gpuselect: {exc}; nothing was changed") from None
        except ValueError as exc:
            raise PARSER.usage_error(str(exc)) from None
