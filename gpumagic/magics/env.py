"""``%gpuenv``: IPython glue over :mod:`gpumagic.env`."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class, output_can_be_silenced

from gpumagic.usage import MagicParser, documented, without_silencer

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
PARSER.add_argument(
    "--save",
    metavar="FILE.json",
    help="also write the report as data (JSON with a format version), with this session's "
    "last %%gpucheck when one ran, for %%gpuenv --diff on another machine or later",
)
PARSER.add_argument(
    "--check", action="store_true", help="with --save: run %%gpucheck now and save it too"
)
PARSER.add_argument(
    "--diff",
    metavar="FILE.json",
    help="compare this machine with a report --save wrote: what differs, what is known to "
    "change speed first, each with why it matters",
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
        --save writes the report as JSON (and the last ``%gpucheck``, or one run now with
        --check); --diff FILE.json returns what differs between that file and this machine
        (``gpumagic.env_diff(a, b)`` compares two files).
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
        theirs = _saved_to_compare(opts)  # a bad file fails here, before anything changes
        report = env()
        written = None
        if opts.freeze is not None:
            try:
                written = freeze(opts.freeze, report)
            except FreezeError as exc:
                raise UsageError(f"%gpuenv --freeze: {exc}") from None
        shell: Any = self.shell
        shell.user_ns["_gpuenv"] = report
        if theirs is not None:
            from gpumagic.environment.check import last_check
            from gpumagic.environment.diff import diff
            from gpumagic.environment.saved import current

            return diff(theirs, current(report, last_check()))
        if opts.save is not None:
            written = _save(shell, opts, report, written)
        if written is not None:
            # What was written, and where, is the answer to --freeze: the note is shown (also
            # after a trailing ";": a file was written) and the report it pinned is kept in
            # _gpuenv, not shown a second time under a note that asked only for a file.
            from IPython.display import display

            display(written)
            return None
        return report


def _saved_to_compare(opts: Any) -> Any:
    """The saved report --diff names (None without --diff), after the options' own checks."""
    from gpumagic.environment.saved import SavedEnvError, load

    if opts.check and opts.save is None:
        raise PARSER.usage_error("--check goes with --save: it saves a %gpucheck beside the report")
    if opts.save is not None and not opts.save.lower().endswith(".json"):
        raise PARSER.usage_error(f"--save writes JSON: give a FILE.json, not {opts.save!r}")
    if opts.diff is None:
        return None
    if opts.save is not None or opts.freeze is not None:
        raise PARSER.usage_error("--diff compares: give it alone, not with --save or --freeze")
    try:
        return load(opts.diff)
    except SavedEnvError as exc:  # one line naming the file; nothing was read or changed
        raise UsageError(f"%gpuenv --diff: {exc}") from None


def _save(shell: Any, opts: Any, report: Any, frozen: Any) -> Any:
    """Write --save's file (running the check first with --check); the note saying so
    (after --freeze's note when both wrote)."""
    from gpumagic.environment.check import gpucheck, last_check
    from gpumagic.environment.saved import save
    from gpumagic.render.env import saved_note

    if opts.check:
        shell.user_ns["_gpucheck"] = gpucheck()
    check = last_check()
    try:
        path = save(opts.save, report, check)
    except OSError as exc:
        raise UsageError(f"%gpuenv --save: cannot write {opts.save}: {exc.strerror or exc}") from None
    if frozen is not None:
        from IPython.display import display

        display(frozen)
    return saved_note(path, check)
