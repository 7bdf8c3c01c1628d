"""%%memtrace overhead, as ratios against the same cell run plainly in the same process.

Workloads (the same code for every runner):
  cnn   - a small CNN training cell, 40 steps on the CPU (target: memtrace <= 1.03x)
  tight - a tight Python loop of 20,000 cheap statements (reported, no target)
Runners:
  plain         - the cell through IPython's run_cell
  memtrace      - the same cell under %%memtrace --quiet
  memory_profiler - memory_profiler's line profiler on the same code as a function (the anchor)
Runs alternate (plain, memtrace, plain, ...) and the ratio of each adjacent pair is taken;
the target holds against their median, printed with the spread (min / median / max) and
the median's 95% CI. Time is the main thread's CPU time (torch runs single-threaded here),
which other processes on a shared 2-core machine disturb far less than wall time; the
host's own swings hit both alike (ratios.py: why the verdict needs the CI). Wall-clock
ratios are printed beside it.

    python benchmarks/bench_memtrace.py [--repeats 5] [--steps 40]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ratios import describe, verdict  # the benchmarks' shared helper, beside this file

TARGET_RATIO = 1.03  # cnn: %%memtrace against plain, main-thread CPU time

SETUP = """\
import torch
from torch import nn
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(32 * 8 * 8, 10),
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
data = torch.randn(32, 3, 32, 32)
target = torch.randint(0, 10, (32,))
"""

CNN_CELL = """\
for step in range(STEPS):
    optimizer.zero_grad(set_to_none=True)
    out = model(data)
    loss = nn.functional.cross_entropy(out, target)
    loss.backward()
    optimizer.step()
final = loss.item()
"""

TIGHT_CELL = """\
acc = 0
for i in range(10000):
    a = i + 1
    acc = acc + a
"""


def _as_function(body: str, name: str) -> str:
    return f"def {name}():\n    global final, acc\n" + textwrap.indent(body, "    ") + "\n"


def run(repeats: int, steps: int) -> dict[str, dict[str, Any]]:
    from IPython.core.interactiveshell import InteractiveShell

    os.environ.setdefault("GPUMAGIC_LIVE", "off")
    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext gpumagic", store_history=False)
    shell.run_cell(SETUP, store_history=False)
    cells = {"cnn": CNN_CELL.replace("STEPS", str(steps)), "tight": TIGHT_CELL}

    have_mprof = importlib.util.find_spec("memory_profiler") is not None
    mprof_funcs = {}
    if have_mprof:
        from memory_profiler import LineProfiler

        # memory_profiler needs the code in a real file to profile it line by line
        tmp = Path(tempfile.mkdtemp()) / "mprof_workloads.py"
        tmp.write_text(
            SETUP + "\n" + "\n".join(_as_function(body, f"work_{k}") for k, body in cells.items())
        )
        spec = importlib.util.spec_from_file_location("mprof_workloads", tmp)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for k in cells:
            lp = LineProfiler(backend="psutil")
            mprof_funcs[k] = lp(getattr(module, f"work_{k}"))

    wall: dict[str, list[float]] = {}

    def timed(label: str, fn: object) -> float:
        w0, c0 = time.perf_counter(), time.thread_time()
        fn()  # type: ignore[operator]
        cpu, dt = time.thread_time() - c0, time.perf_counter() - w0
        wall.setdefault(label, []).append(dt)
        return cpu

    def run_cell(cell: str) -> None:
        res = shell.run_cell(cell, store_history=False, silent=True)
        if not res.success:
            raise RuntimeError(f"benchmark cell failed: {res.error_in_exec!r}")

    def timed_cell(cell: str, label: str = "") -> float:
        return timed(label, lambda: run_cell(cell))

    results: dict[str, dict[str, Any]] = {}
    for name, cell in cells.items():
        timed_cell(cell)  # warm-up: first-call costs (kernels, allocator) out of the way
        timed_cell("%%memtrace --quiet\n" + cell)
        wall.clear()
        times: dict[str, list[float]] = {"plain": [], "memtrace": [], "memory_profiler": []}
        for _ in range(repeats):
            times["plain"].append(timed_cell(cell, "plain"))
            times["memtrace"].append(timed_cell("%%memtrace --quiet\n" + cell, "memtrace"))
            if have_mprof:
                times["memory_profiler"].append(timed("memory_profiler", mprof_funcs[name]))
        med: dict[str, Any] = {k: statistics.median(v) for k, v in times.items() if v}
        # ratio of each adjacent pair, then the median: a burst of load from another
        # process hits one pair, not the estimate
        pairs = {
            "memtrace": [m / p for m, p in zip(times["memtrace"], times["plain"])],
            "memtrace_wall": [m / p for m, p in zip(wall["memtrace"], wall["plain"])],
        }
        if times["memory_profiler"]:
            pairs["memory_profiler"] = [
                m / p for m, p in zip(times["memory_profiler"], times["plain"])
            ]
        for key, ratios in pairs.items():
            med[f"{key}_ratio"] = statistics.median(ratios)
        med["pairs"] = pairs
        results[name] = med
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    results = run(args.repeats, args.steps)
    print(
        f"%%memtrace overhead: main-thread CPU seconds (medians), ratios the median of "
        f"{args.repeats} adjacent pairs, same process; wall-clock ratio last"
    )
    print(f"{'workload':<8} {'plain':>9} {'memtrace':>9} {'ratio':>7} {'mem_prof':>9} {'ratio':>8} {'wall':>8}")
    for name, med in results.items():
        plain = med["plain"]
        mt = med["memtrace_ratio"]
        mp = med.get("memory_profiler")
        mp_text = f"{mp:9.3f} {med['memory_profiler_ratio']:7.2f}x" if mp else f"{'n/a':>9} {'':>8}"
        print(f"{name:<8} {plain:9.3f} {med['memtrace']:9.3f} {mt:6.3f}x {mp_text} {med['memtrace_wall_ratio']:7.3f}x")
    print("spread of the pair ratios:")
    for name, med in results.items():
        for key, label in (("memtrace", "memtrace CPU"), ("memtrace_wall", "memtrace wall")):
            print(f"  {name:<6} {label:<14} {describe(med['pairs'][key])}")
    if "memory_profiler" not in results["cnn"]:
        print("memory_profiler not installed: pip install memory_profiler (the 'bench' extra)")
    failed, text = verdict(results["cnn"]["pairs"]["memtrace"], TARGET_RATIO)
    print(f"cnn memtrace CPU ratio, {text}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
