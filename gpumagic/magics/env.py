"""``%gpuenv``: IPython glue over :mod:`gpumagic.env`."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class, output_can_be_silenced

from gpumagic.magics.args import MagicParser, documented, without_silencer

PARSER = MagicParser(
    "%gpuenv",
    description="Show GPUs, driver, CUDA/cuDNN/NCCL, torch build and flags, CPUs and the traps among them.",
)
PARSER.add_argument(
    "--freeze",
    metavar="FILE",
    help="also pin every installed package: FILE.txt -> requirements.txt, FILE.yml/.yaml -> conda "
    "environment.yml, Dockerfile or NAME.Dockerfile -> an image (nvidia/cuda or python:slim base, "
    "requirements.frozen.txt beside it, JupyterLab as CMD)",
)


@magics_class
class EnvMagics(Magics):
    @output_can_be_silenced
    @line_magic
    @documented(PARSER)
    def gpuenv(self, line: str = "") -> Any:
        """The GPU environment of this kernel, with known traps flagged.

        Shows GPU names and memory, the NVIDIA driver, the CUDA runtime torch was built with,
        cuDNN, NCCL, key package versions, the determinism/TF32 flags, CUDA_VISIBLE_DEVICES and
        allocator settings, usable CPUs and a suggested DataLoader num_workers. The report is
        returned (``e = %gpuenv`` keeps it, a bare call shows it as ``Out[]``, a trailing ``;``
        shows nothing) and stored as ``_gpuenv``; ``gpumagic.env()`` returns the same report
        from a script. --freeze writes every installed distribution pinned (the name picks
        the format; ``Dockerfile`` writes an image definition and its requirements beside it)
        and says what it wrote, and where; the report is kept in ``_gpuenv``, not shown again.
        """
        from gpumagic.environment import FreezeError, env
        from gpumagic.environment.freeze import freeze, freeze_format

        opts = PARSER.parse_line(without_silencer(line))
        if opts is None:  # -h: the help was printed
            return None
        if opts.freeze is not None:
            try:  # before the slow part: a wrong extension is a typo worth failing fast on
                freeze_format(opts.freeze)
            except FreezeError as exc:
                raise PARSER.usage_error(str(exc)) from None
        report = env()
        written = None
        if opts.freeze is not None:
            try:
                written = freeze(opts.freeze, report)
            except FreezeError as exc:
                raise UsageError(f"%gpuenv --freeze: {exc}") from None
        shell: Any = self.shell
        shell.user_ns["_gpuenv"] = report
        if written is not None:
            # What was written, and where, is the answer to --freeze: the note is shown (also
            # after a trailing ";": a file was written) and the report it pinned is kept in
            # _gpuenv, not shown a second time under a note that asked only for a file.
            from IPython.display import display

            display(written)
            return None
        return report
