"""Does ``%gpuprofile --compare`` tell noise from a real change? A/A and A/B, counted.

* **A/A**: the same cell profiled twice (``-n a1``, ``-n a2``) and compared, ``--pairs``
  times: each comparison must say "no difference" (beyond the noise) in at least 19 of 20.
* **A/B**: the cell against the same cell whose sleep per step is 30% longer: each
  comparison must say "slower" in every one of them.

The cell is a training-shaped loop: a small MLP's forward and backward on one thread (the
part a busy machine slows down) and a sleep (the part a change lengthens), ``--steps``
steps marked with ``gpumagic.step()``. ``--hog`` runs a CPU-bound process beside it for the
whole benchmark (``python -c "while True: pass"``), as another user of a shared box would;
run it both ways. ``--repeat N`` profiles each side N times (``%%gpuprofile --repeat N``).

    python benchmarks/bench_noise.py [--pairs 20] [--steps 30] [--sleep 0.03] [--hog] [--repeat 1]

Prints each comparison's verdict and interval, the counts, and the targets; exits 1 when a
target is missed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from typing import Any

SETUP = """
import time
import torch
import gpumagic
torch.set_num_threads(1)  # one thread: a second would wait on a busy core at every op
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
x = torch.randn(64, 256)
"""

CELL = """%%gpuprofile -q -n {name} --repeat {repeat}
for _ in range({steps}):
    model(x).sum().backward()
    time.sleep({sleep})
    gpumagic.step()
"""

# A's sleep per step (B's is 30% longer). Long against the scheduler's noise: on a busy
# machine a process that wakes from a sleep may wait a time slice (a few ms) for a core,
# which would be as large as the change itself with a sleep of 10 ms.
SLEEP_S = 0.030
TARGET_AA, TARGET_AB = 19, 20  # of 20


def _shell() -> Any:
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    ip.run_line_magic("load_ext", "gpumagic")
    ip.run_cell(SETUP)
    return ip


def _profile(ip: Any, name: str, steps: int, sleep: float, repeat: int) -> None:
    r = ip.run_cell(CELL.format(name=name, steps=steps, sleep=sleep, repeat=repeat))
    if not r.success:
        raise RuntimeError(f"profiling {name} failed: {r.error_in_exec or r.error_before_exec}")


def _compare(ip: Any, a: str, b: str) -> Any:
    return ip.run_line_magic("gpuprofile", f"--compare {a} {b} --quiet") or ip.user_ns[
        "_gpuprofile_compare"
    ]


def run_pairs(
    ip: Any, kind: str, pairs: int, steps: int, repeat: int, sleep: float
) -> Counter[str]:
    """``pairs`` comparisons of A against A (``kind="A/A"``) or against B (``"A/B"``)."""
    verdicts: Counter[str] = Counter()
    slow = sleep * (1.3 if kind == "A/B" else 1.0)
    for i in range(pairs):
        _profile(ip, "first", steps, sleep, repeat)
        _profile(ip, "second", steps, slow, repeat)
        c = _compare(ip, "first", "second")
        d = c.step_time
        lo, hi = d.interval_percent or (float("nan"), float("nan"))
        print(
            f"  {kind} {i + 1:2d}: {d.a / 1000:6.2f} -> {d.b / 1000:6.2f} ms, "
            f"{d.percent:+6.1f}% (95% CI {lo:+6.1f}% to {hi:+6.1f}%)  {c.verdict}",
            flush=True,
        )
        verdicts[c.verdict] += 1
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20, help="comparisons of each kind")
    parser.add_argument("--steps", type=int, default=30, help="steps per profiled run")
    parser.add_argument("--sleep", type=float, default=SLEEP_S, help="A's sleep per step (s)")
    parser.add_argument("--repeat", type=int, default=1, help="%%gpuprofile --repeat N")
    parser.add_argument("--hog", action="store_true", help="a CPU-bound process runs beside")
    args = parser.parse_args(argv)
    os.environ.setdefault("GPUMAGIC_LIVE", "off")
    hog = None
    if args.hog:
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    started = time.perf_counter()
    try:
        ip = _shell()
        print(
            f"{args.pairs} A/A and {args.pairs} A/B comparisons, {args.steps} steps per run "
            f"(sleep {1000 * args.sleep:g} ms, B {1300 * args.sleep:g} ms), "
            f"--repeat {args.repeat}, {'with' if hog else 'without'} a CPU hog, "
            f"{len(os.sched_getaffinity(0))} CPUs, load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        aa = run_pairs(ip, "A/A", args.pairs, args.steps, args.repeat, args.sleep)
        ab = run_pairs(ip, "A/B", args.pairs, args.steps, args.repeat, args.sleep)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    same, slower = aa["no difference"], ab["slower"]
    need_aa = -(-TARGET_AA * args.pairs // 20)  # 19 of 20, scaled to --pairs
    need_ab = -(-TARGET_AB * args.pairs // 20)
    ok = same >= need_aa and slower >= need_ab
    print(
        f"A/A: no difference in {same} of {args.pairs} (target >= {need_aa}); {dict(aa)}\n"
        f"A/B (B sleeps 30% longer): slower in {slower} of {args.pairs} (target {need_ab}); "
        f"{dict(ab)}\n"
        f"{'PASS' if ok else 'FAIL'} in {time.perf_counter() - started:.0f} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
