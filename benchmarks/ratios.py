"""Pair ratios as every benchmark reports them: spread, the median, its 95% CI, a verdict;
and the long-lived timing worker the trace benchmarks run each side in.

On the 2-vCPU machine these benchmarks run on, the speed of one thread moves in steps of
10-40% that last a second or so, in an idle guest with no steal time and whether or not
the thread is pinned (measured for issue 8: 100-step blocks of the bench_watch loop went
0.30 -> 0.42 -> 0.33 s of CPU with nothing else running). That comes from the host, and
CPU time sees it as much as wall time. Alternating pairs cancel what is slower than a
pair; what is left shows in the spread, and the median of the pairs carries an
uncertainty that can exceed a 1% target. So each verdict is against the median, and
says so when the median misses but its 95% confidence interval still holds the target:
then the run cannot tell the code from the machine, and a rerun (or more pairs) decides.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
from pathlib import Path


def median_ci(values: list[float]) -> tuple[float, float]:
    """Distribution-free 95% confidence interval of the median (order statistics)."""
    xs = sorted(values)
    n = len(xs)
    half = 1.96 * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half) - 1)
    hi = min(n - 1, math.ceil(n / 2 + half) - 1)
    return xs[lo], xs[hi]


def describe(values: list[float], digits: int = 3) -> str:
    """``min a / median b / max c (95% CI of the median lo..hi, n pairs)``."""
    lo, hi = median_ci(values)
    f = f"{{:.{digits}f}}"
    return (
        f"min {f.format(min(values))} / median {f.format(statistics.median(values))} / "
        f"max {f.format(max(values))}  (median's 95% CI {f.format(lo)}..{f.format(hi)}, "
        f"{len(values)} pairs)"
    )


def verdict(values: list[float], target: float, higher_is_better: bool = False) -> tuple[bool, str]:
    """(failed, text): the target against the median of the pair ratios."""
    med = statistics.median(values)
    lo, hi = median_ci(values)
    sign = ">=" if higher_is_better else "<="
    head = f"target: median {sign} {target:g} -> "
    ok = med >= target if higher_is_better else med <= target
    if ok:
        return False, head + "met"
    holds = hi >= target if higher_is_better else lo <= target
    if holds:
        return False, head + (
            f"not judged: median {med:.3f} misses, but its 95% CI {lo:.3f}..{hi:.3f} holds "
            "the target (the machine's noise; rerun)"
        )
    return True, head + "NOT met"


class TimingWorker:
    """A long-lived interpreter that times one run per path written to its stdin and answers
    ``{"seconds": ...}`` per line: imports and first-call costs are paid once, outside the
    timings, and two workers can alternate run by run."""

    def __init__(self, argv: list[str], what: str, **popen: object) -> None:
        self.what = what
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **popen
        )

    def time(self, path: Path) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{path}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.what} exited")
        return float(json.loads(line)["seconds"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def load_average() -> str:
    """The machine's load average, for the record of a run on a shared machine."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average: unknown"
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min), {fifteen:.2f} (15 min) on {os.cpu_count()} CPUs"
