"""Run every benchmark of the project in one go (``make bench``); each prints its own ratios."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

BENCHMARKS = [
    "bench_memtrace",
    "bench_memfit",
    "bench_profile",
    "bench_watch",
    "bench_lines",
    "bench_ranks",
    "bench_noise",
]


def main() -> int:
    status = 0
    for name in BENCHMARKS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        print(f"\n=== {name} ===", flush=True)
        rc = module.main([])
        if isinstance(rc, int):  # some benchmarks return their numbers instead of a status
            status |= rc
    return status


if __name__ == "__main__":
    sys.exit(main())
