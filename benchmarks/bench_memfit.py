"""%%memfit's dry run against the real step it predicts, as a ratio in one run.

Workload: a CNN training step (Conv-BN-ReLU x3, pooling, a linear head; Adam) at batch 64
on 3x96x96 images, on the CPU, torch single-threaded.
Runners:
  dry run - gpumagic.memory.fit.dry_run.dry_run of the cell: the shadow namespace, fake
            tensors, the accounting; nothing allocated
  real    - the same cell executed for real in the namespace (no accounting)
Runs alternate (dry, real, dry, ...) and each adjacent pair gives dry / real; the target
(dry <= 0.3x real, the issue's bar) holds against the median, printed with the spread and
the median's 95% CI (ratios.py). Time is the main thread's CPU time (a fake run and a real
step both run on it), with wall-clock ratios beside it.

    python benchmarks/bench_memfit.py [--repeats 7] [--batch 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ratios import describe, verdict  # the benchmarks' shared helper, beside this file

TARGET_RATIO = 0.3

CELL = """\
x = torch.randn(B, 3, 96, 96)
y = torch.randint(0, 10, (B,))
loss = torch.nn.functional.cross_entropy(model(x), y)
loss.backward()
optimizer.step()
optimizer.zero_grad()
"""


def namespace(batch: int) -> dict[str, Any]:
    import torch
    from torch import nn

    torch.manual_seed(0)

    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    model = nn.Sequential(
        *block(3, 32), nn.MaxPool2d(2), *block(32, 64), nn.MaxPool2d(2), *block(64, 64),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )
    return {"torch": torch, "model": model, "optimizer": torch.optim.Adam(model.parameters()), "B": batch}


def _timed(fn: Any) -> tuple[float, float]:
    cpu, wall = time.thread_time(), time.perf_counter()
    fn()
    return time.thread_time() - cpu, time.perf_counter() - wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import torch

    from gpumagic.cell import PythonCompiler, execute, prepare
    from gpumagic.memory.fit.dry_run import dry_run

    torch.set_num_threads(1)
    prepared = prepare(PythonCompiler(), CELL, None, instrument=True)
    ns = namespace(args.batch)

    class Probe:
        def enter(self, index: int) -> None:
            pass

    def fake() -> None:
        run = dry_run(prepared, ns)
        assert run.error is None, run.error

    def real() -> None:
        execute(ns, prepared, Probe())  # the step itself: it trains the model, as a real cell does

    fake()  # first-call costs (imports, fake kernels' caches) outside the timings
    real()
    peak = dry_run(prepared, ns).accounting.peak_bytes
    cpu_ratios, wall_ratios = [], []
    for _ in range(args.repeats):
        fake_cpu, fake_wall = _timed(fake)
        real_cpu, real_wall = _timed(real)
        cpu_ratios.append(fake_cpu / real_cpu)
        wall_ratios.append(fake_wall / real_wall)
    failed, text = verdict(cpu_ratios, TARGET_RATIO)
    print(f"CNN training step, batch {args.batch}, predicted peak {peak / 2**20:.1f} MiB")
    print(f"dry run / real step (CPU time): {describe(cpu_ratios)}")
    print(f"dry run / real step (wall):     {describe(wall_ratios)}")
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "cpu_ratios": cpu_ratios, "wall_ratios": wall_ratios,
            "median": statistics.median(cpu_ratios), "target": TARGET_RATIO,
        }), encoding="utf-8")  # fmt: skip
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
