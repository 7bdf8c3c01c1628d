"""Command line: ``gpumagic demo`` and ``gpumagic analyze TRACE`` (also ``python -m gpumagic ...``).

Usage and error lines name the command as it was typed: the console script passes nothing
and is ``gpumagic``; ``python -m gpumagic`` passes its own name below. argparse's default
(the basename of ``sys.argv[0]``) would say ``__main__.py`` for the second, and a name fixed
in one parser made ``gpumagic --help`` and ``python -m gpumagic analyze -h`` disagree.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

DEMO_CELL = """\
import torch
from torch import nn
model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1),
                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(64, 3, 64, 64, device=device)
y = torch.randint(0, 10, (64,), device=device)
for step in range(3):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
loss.item()
"""


def demo(out: Path) -> int:
    """Run a forward/backward cell under %%memtrace in a headless IPython shell."""
    from IPython.core.interactiveshell import InteractiveShell

    from gpumagic.render.html import STYLE

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext gpumagic", store_history=False)
    shell.run_cell(
        "import torch\ndevice = 'cuda' if torch.cuda.is_available() else 'cpu'", store_history=False
    )
    result = shell.run_cell("%%memtrace --quiet\n" + DEMO_CELL, store_history=False, silent=True)
    if not result.success:
        return 1
    trace = shell.user_ns["_memtrace"]
    out.mkdir(parents=True, exist_ok=True)
    html_path = out / "memtrace_demo.html"
    html_path.write_text(
        "<!doctype html><meta charset='utf-8'><title>gpumagic %%memtrace demo</title>"
        + STYLE
        + "<pre>%%memtrace\n"
        + DEMO_CELL.replace("&", "&amp;").replace("<", "&lt;")
        + "</pre>"
        + trace._html(),
        encoding="utf-8",
    )
    sys.stdout.write(trace._text() + "\n\n")
    sys.stdout.write(f"HTML report: {html_path}\n")
    return 0


def main(argv: list[str] | None = None, prog: str = "gpumagic") -> int:
    """The ``gpumagic`` command (and ``python -m gpumagic``); returns the exit status.

    ``prog`` is the command's name in usage and error lines, subcommands included.
    """
    try:
        try:
            return _dispatch(argv, prog)
        finally:  # also after argparse's --help exit: a closed pipe shows here, not at exit
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`| head -1`, `| less` quit): end quietly, as Python's docs
        # recommend (library/signal, "Note on SIGPIPE"): point stdout at devnull so the
        # final flush at exit does not fail again. The status is 141 (128 + SIGPIPE),
        # what cat or grep report when killed by the same closed pipe: a pipeline under
        # `set -o pipefail` learns the output was cut short, while a plain `| head -1`
        # reports head's 0; a 0 here would claim a complete write.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141


def _dispatch(argv: list[str] | None, prog: str) -> int:
    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="trace a training cell with %%memtrace, write HTML")
    p_demo.add_argument("--out", type=Path, default=Path("out"))
    sub.add_parser("analyze", help="analyse a saved profiler trace (see 'analyze -h')", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        return demo(args.out)
    from gpumagic.profile.cli import main as analyze

    return analyze(rest, prog=f"{prog} analyze")


def run(prog: str = "gpumagic") -> None:
    """The command as a program (the console script, ``python -m gpumagic``): :func:`main`,
    then exit with its status. The work done, the cycle collector's passes over every
    object the imports made (pandas', numpy's) at interpreter exit are skipped
    (``gc.freeze``): from the report's last line to the end of the process, `gpumagic
    analyze` of the 109k-event trace took 410 ms, and 130 ms with the freeze (medians of 5,
    load average 6 on the 2-core machine; issue 27). Finalisation and atexit still run.
    Not in :func:`main`, which a caller may run inside its own long-lived process."""
    status = main(prog=prog)
    gc.freeze()
    raise SystemExit(status)


if __name__ == "__main__":
    run(prog="python -m gpumagic")
