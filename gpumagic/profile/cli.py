"""``gpumagic analyze PATH [--html OUT.html] [--rows N]``: the report in a terminal.

Wired into the ``gpumagic`` command (and ``python -m gpumagic``) by :mod:`gpumagic.__main__`;
``main`` takes the arguments after ``analyze`` (or with it) and the name the command was
typed as, which its usage and error lines show, and returns the exit status.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from gpumagic.profile.trace.errors import TraceError
from gpumagic.profile.trace.files import read_ahead


def build_parser(prog: str = "gpumagic analyze") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Analyse a torch.profiler Chrome trace (or a directory of per-rank traces).",
    )
    p.add_argument("path", help="trace file (.json / .json.gz) or directory of rank traces")
    p.add_argument("--html", metavar="OUT.html", help="also write a self-contained HTML report")
    p.add_argument("--rows", type=int, default=10, metavar="N", help="rows per table (default 10)")
    p.add_argument(
        "--keep-startup",
        action="store_true",
        help="a trace without step marks: keep its start-up phase (first CUDA context, lazy "
        "module loading, slow first calls) in the step, as the TensorBoard plugin does",
    )
    return p


def main(argv: Sequence[str] | None = None, prog: str = "gpumagic analyze") -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["analyze"]:
        args_in = args_in[1:]
    args = build_parser(prog).parse_args(args_in)
    if args.rows < 1:
        sys.stderr.write(f"{prog}: --rows must be at least 1\n")
        return 2

    if os.path.isfile(os.path.expanduser(args.path)):
        # Start reading (and inflating) the file now: the imports below take longer than
        # that, and zlib releases the GIL (see gpumagic.profile.trace.files).
        read_ahead(args.path)
    from gpumagic.profile.load import load_trace

    try:
        result = load_trace(args.path, keep_startup=args.keep_startup)
        text = result.to_text(rows=args.rows)
    except TraceError as e:
        sys.stderr.write(f"{prog}: {e}\n")
        return 1
    # The file before the text: when stdout is a pipe that closes early (`| head -1`), the
    # write fails and the command ends, and the report asked for is written all the same.
    out, failed = None, ""
    if args.html:
        try:
            out = result.export(args.html, rows=max(args.rows, 25))
        except OSError as e:
            failed = f"{prog}: cannot write {args.html}: {e.strerror or e}\n"
    sys.stdout.write(text + "\n")
    if failed:
        sys.stderr.write(failed)
        return 1
    if out is not None:
        sys.stdout.write(f"HTML report: {out}\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(prog="python -m gpumagic.profile.cli"))
