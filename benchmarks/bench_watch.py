"""What %gpuwatch costs the code it watches.

1. Slowdown: a CPU-bound PyTorch training loop (small MLP, one torch thread) timed with
   and without the watcher sampling at 1 s, in alternating pairs so drift and neighbours'
   load hit both sides alike. Time is CPU time, as in bench_memtrace: the main thread's
   (``time.thread_time``) plus, in watched runs, what the sampler thread spent sampling
   meanwhile, which is what the watcher takes from the loop even where a second core
   hides it from the wall clock. Other processes on a shared 2-core machine disturb CPU
   time far less than wall time, which is printed beside it. The cost is the median of
   the pair ratios (target <= 1.01), with its spread (min / median / max) and the median's
   95% CI (see ratios.py for why the verdict needs it).
2. CPU per sample: the sampler thread's own CPU time (``time.thread_time`` around each
   sample), as the watcher measures it.
3. Live frame: one uncached ``render_live`` frame (snapshot copy + HTML/SVG) with a full
   default window (300 samples at 1 s), which the live view draws at most once a second.

On a machine without an NVIDIA driver the watcher samples the host (psutil) and that is
what is measured; on a GPU machine the same script measures the NVML path.
``--sample-cost-only`` measures 2. alone (a few seconds; what ``make gpu-check`` runs), with
the wall time of one ``sample_now()`` beside it; ``--json PATH`` writes the numbers.

    python benchmarks/bench_watch.py [--pairs N] [--seconds S] [--sample-cost-only] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from gpumagic.monitor import Watcher, watch
from gpumagic.monitor.ring import capacity_for
from gpumagic.render.watch_views import live_html

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ratios import describe, verdict  # the benchmarks' shared helper, beside this file


def make_step() -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128, 256)
    y = torch.randint(0, 10, (128,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return step


def timed_loop(step: Any, steps: int) -> tuple[float, float]:
    """Wall seconds and main-thread CPU seconds of ``steps`` steps."""
    w0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        step()
    return time.perf_counter() - w0, time.thread_time() - c0


def calibrate(step: Any, seconds: float) -> int:
    """Steps that take ``seconds`` undisturbed: the fastest of three timings, because
    neighbours' load only ever adds time."""
    for _ in range(20):  # warm up allocator and kernels
        step()
    n = 50
    while True:
        dt = min(timed_loop(step, n)[1] for _ in range(3))
        if dt > 0.3:
            return max(1, int(n * seconds / dt))
        n *= 2


def bench_slowdown(
    pairs: int, seconds: float, interval: float, step: Any, steps: int
) -> dict[str, Any]:
    base_wall: list[float] = []
    base_cpu: list[float] = []
    watched_wall: list[float] = []
    watched_cpu: list[float] = []
    sampler_cpu: list[float] = []  # the sampler thread's CPU during each watched run
    samples = 0
    cpu_s = 0.0
    for i in range(pairs):
        # Alternate which side goes first so a trend in background load favours neither.
        order = ("base", "watch") if i % 2 == 0 else ("watch", "base")
        for side in order:
            if side == "base":
                wall, cpu = timed_loop(step, steps)
                base_wall.append(wall)
                base_cpu.append(cpu)
                continue
            w = watch(interval=interval, cells=False)  # its first sample is taken here
            before = w.sample_cpu_s
            wall, cpu = timed_loop(step, steps)
            sampler_cpu.append(w.sample_cpu_s - before)
            w.stop()
            watched_wall.append(wall)
            watched_cpu.append(cpu)
            samples += w.samples_taken
            cpu_s += w.sample_cpu_s
    # Each pair ran back to back, so the neighbours' load is most alike within a pair: the
    # median of the pair ratios is the headline, its min and max the spread.
    cpu_ratios = [(c + sc) / b for c, sc, b in zip(watched_cpu, sampler_cpu, base_cpu)]
    main_ratios = [c / b for c, b in zip(watched_cpu, base_cpu)]
    wall_ratios = [w / b for w, b in zip(watched_wall, base_wall)]
    return {
        "interval": interval,
        "steps_per_run": steps,
        "base_cpu_median_s": statistics.median(base_cpu),
        "watched_cpu_median_s": statistics.median(watched_cpu),
        "sampler_cpu_median_s": statistics.median(sampler_cpu),
        "ratio": statistics.median(cpu_ratios),
        "cpu_ratios": cpu_ratios,
        "main_thread_ratios": main_ratios,
        "wall_ratios": wall_ratios,
        "base_cpu_runs": base_cpu,
        "watched_cpu_runs": watched_cpu,
        "base_wall_median_s": statistics.median(base_wall),
        "watched_wall_median_s": statistics.median(watched_wall),
        "samples_during_runs": samples,
        "cpu_per_sample_in_runs_s": cpu_s / samples if samples else float("nan"),
        "reason": Watcher(cells=False).reason,
    }


def bench_sample_cost(seconds: float = 3.0) -> dict[str, Any]:
    """Steady-state CPU per sample: the thread sampling every 0.1 s on an idle process."""
    w = watch(interval=0.1, cells=False)
    time.sleep(0.5)  # leave out the first, cold samples
    n0, c0 = w.samples_taken, w.sample_cpu_s
    time.sleep(seconds)
    n1, c1 = w.samples_taken, w.sample_cpu_s
    w.stop()
    return {"samples": n1 - n0, "cpu_per_sample_s": (c1 - c0) / max(1, n1 - n0)}


def bench_sample_wall(samples: int = 50) -> dict[str, Any]:
    """Wall time of one ``sample_now()`` on the calling thread, after a warm-up sample."""
    w = Watcher(interval=1.0, cells=False)
    w.sample_now()
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        w.sample_now()
        times.append(time.perf_counter() - t)
    w.stop()
    return {"wall_per_sample_s": statistics.median(times), "wall_samples": samples, "reason": w.reason}


def render_time(watcher: Watcher, repeat: int = 20) -> float:
    """Seconds one uncached frame (snapshot copy + ``live_html``) takes for ``watcher`` now."""
    t0 = time.perf_counter()
    for _ in range(repeat):
        live_html(watcher.snapshot())
    return (time.perf_counter() - t0) / repeat


def bench_render() -> dict[str, Any]:
    w = Watcher(interval=1.0, window=300.0, cells=False)
    for _ in range(capacity_for(300.0, 1.0)):
        w.sample_now()  # real samples, taken back to back to fill the window
    per_frame = render_time(w, repeat=20)
    w.stop()
    day = Watcher(interval=1.0, window=86_400.0, cells=False)
    return {
        "devices": len(w.devices),
        "points_per_series": len(w.snapshot().times),
        "render_live_s": per_frame,
        "ring_bytes_default": w._ring.nbytes,
        "ring_bytes_one_day": day._ring.nbytes,
    }


TARGET_RATIO = 1.01  # at 1 s sampling, against the median of the pair ratios


def _print_slowdown(n: int, slow: dict[str, Any], pairs: int) -> None:
    print(
        f"\n{n}. training-loop slowdown, watcher every {slow['interval']:g} s ({pairs} alternating pairs, "
        f"{slow['steps_per_run']} steps per run)"
    )
    print(
        f"   CPU s, without watcher: median {slow['base_cpu_median_s']:.3f}  "
        f"runs {', '.join(f'{t:.3f}' for t in slow['base_cpu_runs'])}"
    )
    print(
        f"   CPU s, with watcher:    median {slow['watched_cpu_median_s']:.3f}  "
        f"runs {', '.join(f'{t:.3f}' for t in slow['watched_cpu_runs'])}"
    )
    print(f"   sampler thread meanwhile: median {slow['sampler_cpu_median_s'] * 1e3:.2f} ms CPU per run")
    print(f"   pair ratios, CPU (main + sampler): {', '.join(f'{r:.3f}' for r in slow['cpu_ratios'])}")
    share = slow["sampler_cpu_median_s"] / slow["base_cpu_median_s"]
    print(f"   sampler CPU over the loop's CPU: {share:.3%} (the cost with no second core to hide it)")
    print(f"   CPU ratio with/without: {describe(slow['cpu_ratios'], 4)}")
    if slow["interval"] == 1.0:
        print(f"   {verdict(slow['cpu_ratios'], TARGET_RATIO)[1]}")
    print(f"   main thread alone:      {describe(slow['main_thread_ratios'], 4)}")
    print(f"   wall clock:             {describe(slow['wall_ratios'], 4)}")
    print(f"   (wall medians {slow['base_wall_median_s']:.3f} s without, {slow['watched_wall_median_s']:.3f} s with)")


def main(argv: list[str] | None = None) -> int:
    """Print the figures; the exit status is 1 when the 1 s slowdown target is not met."""
    results = run(argv)
    if "slowdown" not in results:  # --sample-cost-only: figures, no target
        return 0
    failed, _ = verdict(results["slowdown"]["cpu_ratios"], TARGET_RATIO)
    return 1 if failed else 0


def run(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--pairs", type=int, default=15, help="with/without run pairs per interval (default 15)"
    )
    parser.add_argument(
        "--seconds", type=float, default=2.0, help="seconds per training run (default 2)"
    )
    # One torch thread by default: on this 2-core VM a loop on both cores swings +-10% from
    # run to run for reasons of its own (pairs from 0.85 to 1.54 were seen), which buries a
    # 1% target; a single-threaded CPU-bound loop leaves the second core to the OS, and the
    # pairs then agree within a few percent. 0 = torch's own choice.
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1; 0: torch's choice)")
    parser.add_argument(
        "--sample-cost-only", action="store_true", help="only the CPU and wall time per sample"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    args = parser.parse_args(argv)
    if args.sample_cost_only:
        return _sample_cost_only(args.json)
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    step = make_step()
    steps = calibrate(step, args.seconds)
    slow = bench_slowdown(args.pairs, args.seconds, 1.0, step, steps)
    # The same at 10x the sampling rate: the watcher's cost scales with samples per second,
    # so this bounds the 1 s cost at a tenth of what it shows, above this machine's noise.
    fast = bench_slowdown(args.pairs, args.seconds, 0.1, step, steps)
    cost = bench_sample_cost()
    render = bench_render()

    print("gpumagic %gpuwatch benchmark")
    print(
        f"  sampling: {'GPU (NVML)' if slow['reason'] is None else 'host only: ' + slow['reason']}"
    )
    print(f"  torch {torch.__version__}, {torch.get_num_threads()} threads")
    for n, res in ((1, slow), (2, fast)):
        _print_slowdown(n, res, args.pairs)
    print("\n3. CPU time per sample (sampler thread, time.thread_time)")
    print(
        f"   during the training runs: {slow['cpu_per_sample_in_runs_s'] * 1e6:.0f} µs "
        f"({slow['samples_during_runs']} samples, incl. the start/stop samples)"
    )
    print(
        f"   steady state, idle process: {cost['cpu_per_sample_s'] * 1e6:.0f} µs ({cost['samples']} samples)"
    )
    print("\n4. live frame (render_live, uncached: snapshot + HTML/SVG)")
    print(
        f"   {render['devices']} device row(s), {render['points_per_series']} points per series: "
        f"{render['render_live_s'] * 1e3:.2f} ms per frame"
    )
    print(
        f"   ring buffer: {render['ring_bytes_default'] / 1024:.0f} KiB for the default 300 s window, "
        f"{render['ring_bytes_one_day'] / 2**20:.1f} MiB for a one-day window (fixed, preallocated)"
    )
    return {"slowdown": slow, "slowdown_fast": fast, "sample_cost": cost, "render": render}


def _sample_cost_only(json_path: str | None) -> dict[str, Any]:
    cost = bench_sample_cost()
    cost.update(bench_sample_wall())
    reason = cost.pop("reason")
    print("gpumagic %gpuwatch: cost of one sample")
    print(f"  sampling: {'GPU (NVML)' if reason is None else 'host only: ' + reason}")
    print(
        f"  CPU per sample (sampler thread, steady state): {cost['cpu_per_sample_s'] * 1e6:.0f} µs "
        f"({cost['samples']} samples)"
    )
    print(
        f"  wall per sample_now(): {cost['wall_per_sample_s'] * 1e6:.0f} µs "
        f"(median of {cost['wall_samples']})"
    )
    out = {"reason": reason, "sample_cost": cost}
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    sys.exit(main())
