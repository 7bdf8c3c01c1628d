"""%%memtrace overhead, as ratios against the same cell run plainly in the same process.

Workloads (the same code for every runner):
  cnn   - a small CNN training cell, 40 steps on the CPU (target: memtrace <= 1.03x)
  tight - a tight Python loop of 20,000 cheap statements (reported, no target): what the
          probe costs per statement, in µs
With ``--device cuda`` the cnn cell trains a CIFAR ResNet-18 (batch 128) on the GPU and
ends in ``loss.item()``, so each run includes the GPU's work; the target is then
memtrace <= 1.02x in wall-clock time (the main thread's CPU time is printed beside it;
a thread waiting for the GPU spins, so CPU time would count the GPU's work as the host's).
The tight loop then measures the CUDA probe (the allocator's counters read and its peak
reset at every statement boundary).
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

    python benchmarks/bench_memtrace.py [--repeats 5] [--steps 40] [--device cuda] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
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
CUDA_TARGET_RATIO = 1.02  # cnn on the GPU: %%memtrace against plain, wall-clock time

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

# The GPU's training cell: notebooks/02_case_study's full-size ResNet-18 (CIFAR variant)
CUDA_SETUP = """\
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.short(x))


layers, cin = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()], 64
for stage, cout in enumerate((64, 128, 256, 512)):
    for i in range(2):
        layers.append(Block(cin, cout, 2 if stage > 0 and i == 0 else 1))
        cin = cout
model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
data = torch.randn(128, 3, 32, 32, device="cuda")
target = torch.randint(0, 10, (128,), device="cuda")
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


def run(repeats: int, steps: int, device: str = "cpu") -> dict[str, dict[str, Any]]:
    from IPython.core.interactiveshell import InteractiveShell

    os.environ.setdefault("GPUMAGIC_LIVE", "off")
    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext gpumagic", store_history=False)
    setup = CUDA_SETUP if device == "cuda" else SETUP
    res = shell.run_cell(setup, store_history=False)
    if not res.success:
        raise RuntimeError(f"benchmark setup failed: {res.error_in_exec!r}")
    cells = {"cnn": CNN_CELL.replace("STEPS", str(steps)), "tight": TIGHT_CELL}

    # memory_profiler measures the host only: no anchor for the GPU's cell
    have_mprof = device == "cpu" and importlib.util.find_spec("memory_profiler") is not None
    mprof_funcs = {}
    if have_mprof:
        from memory_profiler import LineProfiler

        # memory_profiler needs the code in a real file to profile it line by line
        tmp = Path(tempfile.mkdtemp()) / "mprof_workloads.py"
        tmp.write_text(
            setup + "\n" + "\n".join(_as_function(body, f"work_{k}") for k, body in cells.items())
        )
        spec = importlib.util.spec_from_file_location("mprof_workloads", tmp)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for k in cells:
            lp = LineProfiler(backend="psutil")
            mprof_funcs[k] = lp(getattr(module, f"work_{k}"))

    wall: dict[str, list[float]] = {}
    cpu_s: dict[str, list[float]] = {}

    def timed(label: str, fn: object) -> float:
        """The run's time on the clock the verdict uses (CPU here, wall on the GPU); the
        other clock is kept beside it."""
        w0, c0 = time.perf_counter(), time.thread_time()
        fn()  # type: ignore[operator]
        cpu, dt = time.thread_time() - c0, time.perf_counter() - w0
        wall.setdefault(label, []).append(dt)
        cpu_s.setdefault(label, []).append(cpu)
        return dt if device == "cuda" else cpu

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
        traced = shell.user_ns["_memtrace"]
        statements = int(traced.lines["hits"].sum())  # probe calls per traced run
        wall.clear()
        cpu_s.clear()
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
            "memtrace_cpu": [m / p for m, p in zip(cpu_s["memtrace"], cpu_s["plain"])],
        }
        if times["memory_profiler"]:
            pairs["memory_profiler"] = [
                m / p for m, p in zip(times["memory_profiler"], times["plain"])
            ]
        for key, ratios in pairs.items():
            med[f"{key}_ratio"] = statistics.median(ratios)
        med["pairs"] = pairs
        # what the probe adds per statement it runs before, on the verdict's clock
        med["us_per_statement"] = [
            (m - p) / statements * 1e6 for m, p in zip(times["memtrace"], times["plain"])
        ]
        med["statements"] = statements
        med["traced_device"] = traced.device.label
        results[name] = med
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="where the cnn cell trains (default cpu)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print(f"--device cuda: no CUDA here (torch {torch.__version__}); nothing measured")
            _write_json(args.json, {"error": "no CUDA: torch.cuda.is_available() is False", "cuda": False})
            return 2
    results = run(args.repeats, args.steps, args.device)
    clock = "wall-clock" if args.device == "cuda" else "main-thread CPU"
    print(
        f"%%memtrace overhead ({args.device}): {clock} seconds (medians), ratios the median of "
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
        for key, label in (("memtrace_cpu", "memtrace CPU"), ("memtrace_wall", "memtrace wall")):
            print(f"  {name:<6} {label:<14} {describe(med['pairs'][key])}")
    print("probe cost per statement (memtrace minus plain, over the statements it ran):")
    for name, med in results.items():
        if name != "tight":  # a training cell's statements take milliseconds: noise, not probe
            continue
        print(
            f"  {name:<6} {statistics.median(med['us_per_statement']):.2f} µs "
            f"({med['statements']} statements per run on {med['traced_device']}; "
            f"{describe(med['us_per_statement'], 2).replace(' pairs', ' runs')})"
        )
    if args.device == "cpu" and "memory_profiler" not in results["cnn"]:
        print("memory_profiler not installed: pip install memory_profiler (the 'bench' extra)")
    target = CUDA_TARGET_RATIO if args.device == "cuda" else TARGET_RATIO
    failed, text = verdict(results["cnn"]["pairs"]["memtrace"], target)
    print(f"cnn memtrace {'wall' if args.device == 'cuda' else 'CPU'} ratio, {text}")
    if args.json:
        _write_json(args.json, _as_json(results, args.device, target, failed, text))
    return 1 if failed else 0


def _as_json(
    results: dict[str, dict[str, Any]], device: str, target: float, failed: bool, text: str
) -> dict[str, Any]:
    out: dict[str, Any] = {"device": device, "cuda": device == "cuda", "target": target, "workloads": {}}
    for name, med in results.items():
        out["workloads"][name] = {
            "clock": "wall" if device == "cuda" else "cpu",
            "ratio": med["memtrace_ratio"],
            "pairs": med["pairs"]["memtrace"],
            "spread": describe(med["pairs"]["memtrace"]),
            "wall_ratio": med["memtrace_wall_ratio"],
            "plain_s": med["plain"],
            "memtrace_s": med["memtrace"],
            "us_per_statement": statistics.median(med["us_per_statement"]),
            "us_spread": describe(med["us_per_statement"], 2).replace(" pairs", " runs"),
            "statements": med["statements"],
            "device": med["traced_device"],
        }
    out["workloads"]["cnn"].update(failed=failed, verdict=text)
    return out


def _write_json(path: str | None, data: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    sys.exit(main())
