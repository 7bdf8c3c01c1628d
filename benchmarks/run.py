"""Run every benchmark of the project in one go (``make bench``).

Each entry below is a benchmark module, the arguments it runs with, and what it stands
for. Each prints its own figures: ratios measured side by side in this run, from
alternating pairs, with the median's 95% interval and a verdict against its target
(``ratios.py``); the summary at the end lists every entry's verdict. To add a target, add
an entry (a module with ``main(argv) -> int``, non-zero when a target is missed).

    python benchmarks/run.py              # everything
    python benchmarks/run.py bench_profile bench_watch   # the entries of those modules
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ratios import load_average  # the benchmarks' shared helper, beside this file

# Issue 27, item 4: no trace loads slower than at the commit the issue was filed against.
ISSUE_27_BASELINE = "343c11d"

BENCHMARKS: list[tuple[str, list[str], str]] = [
    ("bench_memtrace", [], "%%memtrace's cost on a training loop and on cheap statements"),
    (
        "bench_memfit",
        [],
        "issue 27 item 3, issue 26 item 8: %%memfit's warm dry run against the real step, "
        "median over models (<= 0.5), and one allocator replay a run",
    ),
    (
        "bench_profile",
        [],
        "issue 27 item 2: trace analysis against Holistic Trace Analysis, warm (>= 10x) and "
        "the whole `gpumagic analyze` process (>= 5x)",
    ),
    ("bench_watch", [], "issue 27 item 4: %gpuwatch's cost (<= 1.01x)"),
    ("bench_lines", [], "issue 10: per-line and per-module attribution's cost"),
    (
        "bench_lines",
        [
            "--mode", "load", "--baseline", ISSUE_27_BASELINE, "--target", "1.05",
            "--each-trace", "--repeats", "14",
        ],
        f"issue 27 item 4: every trace's load + analysis within 5% of {ISSUE_27_BASELINE}'s",
    ),
    ("bench_ranks", [], "a folder of ranks: summaries in workers"),
    ("bench_noise", [], "comparisons' intervals and verdicts"),
]


def main(argv: list[str] | None = None) -> int:
    only = set(sys.argv[1:] if argv is None else argv)
    status = 0
    verdicts: list[str] = []
    for name, args, what in BENCHMARKS:
        if only and name not in only:
            continue
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        print(f"\n=== {name} {' '.join(args)}\n    {what}\n    {load_average()}", flush=True)
        t = time.perf_counter()
        rc = module.main(list(args))
        minutes = (time.perf_counter() - t) / 60
        if isinstance(rc, int):  # some benchmarks return their numbers instead of a status
            status |= rc
            verdicts.append(
                f"  {'met' if rc == 0 else 'MISSED':<6} {name} {' '.join(args)} ({minutes:.1f} min)"
            )
    print("\n=== targets\n" + "\n".join(verdicts), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
