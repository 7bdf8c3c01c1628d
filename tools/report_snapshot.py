"""Snapshot the package's reports, to show that a change of structure changed no output.

    python tools/report_snapshot.py write DIR        # every report below, into DIR
    python tools/report_snapshot.py compare OLD NEW  # byte for byte; exits 1 on a difference

What is written: ``gpumagic analyze`` (text and HTML) of every shared trace and of the
two-rank folder, and the comparison of the before/after pair; the demo cell of
``gpumagic demo`` under ``%%memtrace``, run a second time (its per-statement table without
the columns that are wall time or RSS pages, which differ from run to run, and the text of
its peak), and
the same cell under ``%%memfit`` (a dry run: deterministic, so its whole report).

The shared traces are found beside the repository (``../shared/traces``); they are other
projects' files and are read, never copied here.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"

# columns of %%memtrace's table that measure time or pages, not tensors
_VARYING = re.compile(r"time|rss|host", re.IGNORECASE)


def _analyze(path: Path, out: Path, name: str) -> None:
    from gpumagic.profile.cli import main as analyze

    buf = io.StringIO()
    # the HTML's path is printed: relative to DIR, so that two snapshots read the same
    with contextlib.chdir(out), contextlib.redirect_stdout(buf):
        analyze([str(path), "--html", f"{name}.html"], prog="gpumagic analyze")
    (out / f"{name}.txt").write_text(buf.getvalue(), encoding="utf-8")


def _compare_pair(out: Path) -> None:
    from gpumagic.profile.compare import compare

    comparison = compare(
        TRACES / "a100_training_control.json.gz", TRACES / "v100_training_test.json.gz"
    )
    bundle = comparison._repr_mimebundle_()
    (out / "compare_control_test.txt").write_text(bundle["text/plain"], encoding="utf-8")
    (out / "compare_control_test.html").write_text(bundle["text/html"], encoding="utf-8")


def _cells(out: Path) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    from gpumagic.__main__ import DEMO_CELL

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext gpumagic", store_history=False)
    shell.run_cell("import torch\ntorch.manual_seed(0)\ndevice = 'cpu'", store_history=False)
    # The demo cell runs twice and the second run is the one kept: its namespace already holds
    # a model, an optimizer and a batch, so the census's "tensors from before the cell" show.
    # (The snapshots taken before issue 28 are of such a second run: this tool's first run was
    # silent, whose value is None, so it ran the cell again; the comparison needs the same.)
    for _ in range(2):
        shell.run_cell("%%memtrace -q\n" + DEMO_CELL, store_history=False, silent=True)
    trace = shell.user_ns["_memtrace"]
    lines = trace.lines
    kept = [c for c in lines.columns if not _VARYING.search(str(c))]
    (out / "memtrace_demo_lines.csv").write_text(lines[kept].to_csv(index=False), encoding="utf-8")
    peak = [line for line in trace._text().splitlines() if line.startswith("At the peak")]
    (out / "memtrace_demo_peak.txt").write_text("\n".join(peak), encoding="utf-8")

    shell.run_cell("torch.manual_seed(0)", store_history=False)
    fitted = shell.run_cell("%%memfit -q\n" + DEMO_CELL, store_history=False, silent=True)
    fit = shell.user_ns.get("_memfit")
    if fitted.success and fit is not None:
        text = re.sub(r"dry run [0-9.]+ \S+", "dry run (time)", fit._repr_mimebundle_()["text/plain"])
        (out / "memfit_demo.txt").write_text(text, encoding="utf-8")


def write(out: Path) -> None:
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(TRACES.glob("*.json.gz")):
        _analyze(path, out, path.name.removesuffix(".json.gz"))
    _analyze(TRACES / "two_ranks", out, "two_ranks")
    _compare_pair(out)
    _cells(out)


def compare(old: Path, new: Path) -> int:
    names = sorted({p.name for p in old.iterdir()} | {p.name for p in new.iterdir()})
    differ = 0
    for name in names:
        a, b = old / name, new / name
        if not a.exists() or not b.exists():
            print(f"{name}: only in {'new' if b.exists() else 'old'}")
            differ += 1
        elif a.read_bytes() != b.read_bytes():
            print(f"{name}: differs")
            differ += 1
    print(f"{len(names)} reports, {len(names) - differ} byte-identical, {differ} differ")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("write").add_argument("out", type=Path)
    p_cmp = sub.add_parser("compare")
    p_cmp.add_argument("old", type=Path)
    p_cmp.add_argument("new", type=Path)
    args = parser.parse_args(argv)
    if args.command == "write":
        write(args.out)
        return 0
    return compare(args.old, args.new)


if __name__ == "__main__":
    sys.exit(main())
