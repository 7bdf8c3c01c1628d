"""Trace analysis speed and memory, as ratios against Holistic Trace Analysis in the same run.

Issue 27, item 2. The trace is ``a100_training_control.json.gz`` (109k events, the largest
of the shared traces; ``--traces`` names others), the analyses on each side the same:

1. Warm: in a long-lived interpreter with its imports done, our ``load_trace`` and then
   ``breakdown``, ``findings``, ``ops``, ``kernels`` and ``idle``, against HTA's
   ``TraceAnalysis(trace_dir)`` and then ``get_temporal_breakdown``,
   ``get_idle_time_breakdown`` (every rank the trace holds) and ``get_gpu_kernel_breakdown``.
   Each side in its own worker process, runs alternating (which goes first alternates
   too); the ratio of each pair (HTA's time over ours), their spread, and the median with
   its 95% interval (ratios.py). Target: median >= 10.
2. Whole process: ``python -m gpumagic analyze TRACE`` (the full text report) against a
   fresh interpreter that imports HTA and runs the same three analyses, interpreter start
   and imports included, wall time of each, alternating as above. Both run with bytecode
   caching on (in a temporary ``PYTHONPYCACHEPREFIX``, filled by a warm-up run of each),
   as an installed package has its ``.pyc`` files. Target: median >= 5.
3. A synthetic trace of 2 million events (Kineto's new schema: operators, launches,
   kernels, flow arrows) written to a temporary directory, loaded and analysed in a
   fresh subprocess: time, peak RSS (the child's VmHWM), and peak RSS / file size.

The machine's load average is printed before and after each comparison: on a shared
machine the pairs' spread, not one timing, says how much to trust a ratio.

HTA is looked for in this interpreter first, then in the interpreter named by
``--hta-python`` or ``GPUMAGIC_HTA_PYTHON`` (a separate venv, so its pins never touch
ours). Without it our numbers are still printed, with how to install it.

    python benchmarks/bench_profile.py [--pairs 25] [--process-pairs 15] [--events 2000000]
                                       [--traces NAME ...] [--hta-python PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ratios import TimingWorker, describe, load_average, verdict  # the benchmarks' shared helper

REPO = Path(__file__).resolve().parents[1]
# The real traces come the tests' way (../shared/traces, the cache, a mirror or the origin,
# each checked by sha256): one registry, in tests/trace_data.py.
sys.path.insert(0, str(REPO / "tests"))
from trace_data import TraceUnavailable, fetch  # noqa: E402

TRACES = ["a100_training_control.json.gz"]
TARGET_WARM = 10.0
TARGET_PROCESS = 5.0
HTA_INSTALL = "pip install HolisticTraceAnalysis  (the 'bench' extra carries it)"

# HTA's side, as a script: the analyses of a directory of rank traces (HTA reads a
# directory). Logging off: HTA logs each parse at INFO.
_HTA_ANALYSES = r"""
import logging, sys, warnings
logging.disable(logging.CRITICAL)
warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis

def analyse(directory):
    analysis = TraceAnalysis(trace_dir=directory)
    analysis.get_temporal_breakdown(visualize=False)
    analysis.get_idle_time_breakdown(ranks=list(analysis.t.traces), visualize=False)
    analysis.get_gpu_kernel_breakdown(visualize=False)
"""

# A long-lived HTA worker: times the analyses of each path read from stdin (copied into a
# directory of its own first, outside the timing).
_HTA_WORKER = (
    _HTA_ANALYSES
    + r"""
import json, shutil, tempfile, time
for line in sys.stdin:
    directory = tempfile.mkdtemp()
    shutil.copy(line.strip(), directory)
    t = time.perf_counter()
    analyse(directory)
    seconds = time.perf_counter() - t
    shutil.rmtree(directory)
    print(json.dumps({"seconds": seconds}), flush=True)
"""
)

_HTA_PROCESS = _HTA_ANALYSES + "analyse(sys.argv[1])\n"

# Our long-lived worker: load + the same analyses, for each path read from stdin.
_OURS_WORKER = r"""
import json, sys, time
from gpumagic.profile.load import load_trace
for line in sys.stdin:
    t = time.perf_counter()
    r = load_trace(line.strip())
    r.breakdown, r.findings, r.ops, r.kernels, r.idle
    print(json.dumps({"seconds": time.perf_counter() - t}), flush=True)
"""


def _env(pycache: Path) -> dict[str, str]:
    """This checkout first on the path; bytecode written to and read from ``pycache``."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def alternate(
    first: Callable[[], float], second: Callable[[], float], pairs: int
) -> tuple[list[float], list[float]]:
    """``pairs`` timings of each callable, alternating, and which goes first alternating
    too, so that a drift in the machine's load favours neither (pair i: a[i], b[i])."""
    a: list[float] = []
    b: list[float] = []
    for i in range(pairs):
        if i % 2:
            b.append(second())
            a.append(first())
        else:
            a.append(first())
            b.append(second())
    return a, b


def _report(label: str, ours: list[float], theirs: list[float], target: float) -> bool:
    """Print the pair ratios (HTA / ours) and the verdict; True when the target is missed."""
    ratios = [t / o for t, o in zip(theirs, ours)]
    failed, text = verdict(ratios, target, higher_is_better=True)
    print(
        f"  {label}: gpumagic median {statistics.median(ours) * 1000:,.0f} ms, "
        f"HTA median {statistics.median(theirs) * 1000:,.0f} ms\n"
        f"    pair ratios (HTA / gpumagic): {describe(ratios, 2)}\n    {text}",
        flush=True,
    )
    return failed


def compare_warm(paths: list[Path], pairs: int, python: str | None, env: dict[str, str]) -> int:
    print(
        "Warm (imports done): gpumagic load_trace + breakdown, findings, ops, kernels, idle vs "
        "HTA TraceAnalysis + temporal, idle and kernel breakdowns"
    )
    print(f"  {load_average()}")
    ours = TimingWorker([sys.executable, "-c", _OURS_WORKER], "gpumagic worker", env=env)
    hta = (
        TimingWorker([python, "-c", _HTA_WORKER], "HTA worker", env=env, stderr=subprocess.DEVNULL)
        if python is not None
        else None
    )
    status = 0
    try:
        for path in paths:
            ours.time(path)  # warm-up: first calls, caches
            if hta is None:
                times = [ours.time(path) for _ in range(pairs)]
                print(f"  {path.name}: gpumagic median {statistics.median(times) * 1000:,.0f} ms")
                continue
            hta.time(path)
            a, b = alternate(partial(ours.time, path), partial(hta.time, path), pairs)
            status |= _report(path.name, a, b, TARGET_WARM)
    finally:
        ours.close()
        if hta is not None:
            hta.close()
    print(f"  {load_average()}")
    return status


def _timed_run(argv: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def compare_process(paths: list[Path], pairs: int, python: str | None, env: dict[str, str]) -> int:
    print(
        "Whole process (interpreter start and imports included): `python -m gpumagic analyze "
        "TRACE` vs a fresh interpreter running HTA's three analyses"
    )
    if python is None:
        print(f"  HTA not found: {HTA_INSTALL}")
        return 0
    print(f"  {load_average()}")
    status = 0
    for path in paths:
        directory = Path(tempfile.mkdtemp(prefix="gpumagic-bench-hta-"))
        try:
            shutil.copy(path, directory)
            ours = [sys.executable, "-m", "gpumagic", "analyze", str(path)]
            theirs = [python, "-c", _HTA_PROCESS, str(directory)]
            _timed_run(ours, env), _timed_run(theirs, env)  # warm-up: bytecode, page cache
            a, b = alternate(
                partial(_timed_run, ours, env), partial(_timed_run, theirs, env), pairs
            )
            status |= _report(path.name, a, b, TARGET_PROCESS)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    print(f"  {load_average()}")
    return status


def _hta_python(explicit: str | None) -> str | None:
    if importlib.util.find_spec("hta") is not None:
        return sys.executable
    candidate = explicit or os.environ.get("GPUMAGIC_HTA_PYTHON")
    if candidate and Path(candidate).exists():
        probe = subprocess.run([candidate, "-c", "import hta"], capture_output=True)
        if probe.returncode == 0:
            return candidate
    return None


# Run in a fresh interpreter: load + analyse one trace, report time and memory.
_OURS_SCRIPT = r"""
import json, resource, sys, time
import numpy, pandas, msgspec  # noqa: F401 - imported before the baseline reading
from gpumagic.profile.analysis import trace_analysis  # noqa: F401
from gpumagic.profile.rules import registry  # noqa: F401
from gpumagic.profile.load import load_trace

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None

baseline = status("VmRSS")
t = time.perf_counter()
r = load_trace(sys.argv[1])
r.summary, r.breakdown, r.steps, r.ops, r.kernels, r.idle, r.findings
seconds = time.perf_counter() - t
print(json.dumps({
    "seconds": seconds,
    "baseline_rss": baseline,
    "peak_rss": status("VmHWM"),
    "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "events": r.summary.events,
    "steps": r.summary.steps,
}))
"""


# --- the synthetic trace -------------------------------------------------------------------

_KERNELS = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
    "ampere_sgemm_128x64_nn",
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float> > >"
    "(at::native::ReduceOp<float, at::native::MeanOps<float, float> >)",
]
_OPS = ["aten::add", "aten::mm", "aten::addmm", "aten::mean"]


def write_synthetic(path: Path, events: int, ops_per_step: int = 2000) -> int:
    """Write a new-schema Kineto trace of about ``events`` events; returns how many.

    Each operator contributes five events, as in real traces: the ``cpu_op``, its
    ``cudaLaunchKernel``, the kernel, and the two ends of the launch flow arrow.
    """
    n_ops = max(events // 5, 1)
    steps = max(n_ops // ops_per_step, 1)
    written = 0
    corr = 0
    t = 1_000_000.0
    with path.open("w") as f:
        f.write(
            '{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", '
            '"totalGlobalMem": 85198045184, "computeMajor": 8, "computeMinor": 0, "numSms": 108}], '
            '"traceEvents": [\n'
        )
        first = True
        for step in range(steps):
            step_start = t
            lines = []
            for i in range(ops_per_step):
                corr += 1
                k = i % 4
                op_ts, rt_ts, k_ts = t, t + 2.0, t + 6.0
                lines.append(
                    f'{{"ph": "X", "cat": "cpu_op", "name": "{_OPS[k]}", "pid": 11, "tid": 11, "ts": {op_ts:.3f}, '
                    f'"dur": 9.0, "args": {{"External id": {corr}, "Ev Idx": {corr}, '
                    f'"Input Dims": [[64, 128], [128, 64]], "Input type": ["float", "float"]}}}}'
                )
                lines.append(
                    f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 11, "tid": 11, '
                    f'"ts": {rt_ts:.3f}, "dur": 5.0, "args": {{"External id": {corr}, "cbid": 211, "correlation": {corr}}}}}'
                )
                lines.append(
                    f'{{"ph": "X", "cat": "kernel", "name": "{_KERNELS[k]}", "pid": 0, "tid": 7, "ts": {k_ts:.3f}, '
                    f'"dur": 7.5, "args": {{"External id": {corr}, "queued": 0, "device": 0, "context": 1, '
                    f'"stream": 7, "correlation": {corr}, "registers per thread": 32, "shared memory": 0, '
                    f'"blocks per SM": 1.2, "warps per SM": 4.8, "grid": [128, 1, 1], "block": [128, 1, 1], '
                    f'"est. achieved occupancy %": 40}}}}'
                )
                lines.append(
                    f'{{"ph": "s", "id": {corr}, "pid": 11, "tid": 11, "ts": {rt_ts:.3f}, "cat": "ac2g", "name": "ac2g"}}'
                )
                lines.append(
                    f'{{"ph": "f", "id": {corr}, "pid": 0, "tid": 7, "ts": {k_ts:.3f}, "cat": "ac2g", '
                    f'"name": "ac2g", "bp": "e"}}'
                )
                t += 10.0
            lines.append(
                f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": 11, "tid": 11, '
                f'"ts": {step_start:.3f}, "dur": {t - step_start - 1.0:.3f}, "args": {{"External id": 0}}}}'
            )
            f.write(("" if first else ",\n") + ",\n".join(lines))
            first = False
            written += len(lines)
        f.write("\n]}\n")
    return written


def run_synthetic(events: int, keep: Path | None = None) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix="gpumagic-bench-"))
    try:
        path = directory / "synthetic.json"
        t = time.perf_counter()
        written = write_synthetic(path, events)
        generated = time.perf_counter() - t
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        out = subprocess.run(
            [sys.executable, "-c", _OURS_SCRIPT, str(path)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result.update(
            file_bytes=path.stat().st_size, events_written=written, generate_seconds=generated
        )
        if keep is not None:
            shutil.copy(path, keep)
        return result
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=25, help="timed pairs in a warm process")
    p.add_argument("--process-pairs", type=int, default=15, help="timed pairs of whole processes")
    p.add_argument(
        "--events", type=int, default=2_000_000, help="size of the synthetic trace (0: skip)"
    )
    p.add_argument("--traces", nargs="+", default=TRACES, metavar="NAME", help="shared traces")
    p.add_argument("--hta-python", help="an interpreter with HolisticTraceAnalysis installed")
    args = p.parse_args(argv)

    paths = []
    for name in args.traces:
        try:
            paths.append(fetch(name))
        except TraceUnavailable as exc:
            print(f"  skipped: {exc}")
    python = _hta_python(args.hta_python)
    if python is None:
        print(f"HTA not found (this interpreter, --hta-python, GPUMAGIC_HTA_PYTHON): {HTA_INSTALL}")
    status = 0
    with tempfile.TemporaryDirectory(prefix="gpumagic-bench-pycache-") as pycache:
        env = _env(Path(pycache))
        if args.pairs > 0:
            status |= compare_warm(paths, args.pairs, python, env)
        if args.process_pairs > 0:
            status |= compare_process(paths, args.process_pairs, python, env)

    if args.events > 0:
        print(f"Synthetic trace of {args.events:,} events (fresh process)")
        r = run_synthetic(args.events)
        size = r["file_bytes"]
        peak = r["peak_rss"] or r["ru_maxrss"]
        print(
            f"  file {_mib(size)} ({r['events_written']:,} events, {r['steps']} steps, written in "
            f"{r['generate_seconds']:.1f} s); load + analysis {r['seconds']:.2f} s"
        )
        grown = peak - r["baseline_rss"]
        print(
            f"  peak RSS {_mib(peak)} = {peak / size:.2f}x the file; {_mib(grown)} = {grown / size:.2f}x "
            f"above the {_mib(r['baseline_rss'])} of a process with the imports (target: under 8x)"
        )
        status |= 0 if grown < 8 * size else 1
    return status


if __name__ == "__main__":
    sys.exit(main())
