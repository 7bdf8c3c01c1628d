"""Trace analysis speed and memory, as ratios against Holistic Trace Analysis in the same run.

1. The two ResNet-50 traces (~75k events each): our load + full analysis (summary,
   breakdown, steps, operators, kernels, idle time, findings) against HTA's
   ``TraceAnalysis(trace_dir)`` + ``get_temporal_breakdown`` + ``get_idle_time_breakdown``
   on the same file. Both warm (imports done), runs alternating between the two; the ratio
   of each pair (HTA's time over ours), its spread (min / median / max) over ``--repeats``
   pairs, and the target against the median: >= 10.
2. A synthetic trace of 2 million events (Kineto's new schema: operators, launches,
   kernels, flow arrows) written to a temporary directory, loaded and analysed in a
   fresh subprocess: time, peak RSS (the child's VmHWM), and peak RSS / file size.

HTA is looked for in this interpreter first, then in the interpreter named by
``--hta-python`` or ``GPUMAGIC_HTA_PYTHON`` (a separate venv, so its pins never touch
ours). Without it our numbers are still printed, with how to install it.

    python benchmarks/bench_profile.py [--repeats 7] [--events 2000000] [--hta-python PATH]
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ratios import TimingWorker, describe, verdict  # the benchmarks' shared helper

REPO = Path(__file__).resolve().parents[1]
# The real traces come the tests' way (../shared/traces, the cache, a mirror or the origin,
# each checked by sha256): one registry, in tests/trace_data.py.
sys.path.insert(0, str(REPO / "tests"))
from trace_data import TraceUnavailable, fetch  # noqa: E402

RESNET = ["resnet50_v100_num_workers_0.json.gz", "resnet50_v100_num_workers_4.json.gz"]
TARGET_RATIO = 10.0
HTA_INSTALL = "pip install HolisticTraceAnalysis  (the 'bench' extra will carry it)"

# Run by an interpreter that has HTA: a worker that times load + temporal + idle breakdown
# for each path read from stdin, so its runs can alternate with ours.
_HTA_WORKER = r"""
import json, logging, shutil, sys, tempfile, time, warnings
logging.disable(logging.CRITICAL)
warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
for line in sys.stdin:
    path = line.strip()
    directory = tempfile.mkdtemp()
    shutil.copy(path, directory)  # HTA reads a directory of per-rank traces
    t = time.perf_counter()
    analysis = TraceAnalysis(trace_dir=directory)
    analysis.get_temporal_breakdown(visualize=False)
    analysis.get_idle_time_breakdown(visualize=False)
    seconds = time.perf_counter() - t
    shutil.rmtree(directory)
    print(json.dumps({"seconds": seconds}), flush=True)
"""


def hta_worker(python: str) -> TimingWorker:
    """A long-lived HTA process (its own interpreter), timed one run at a time."""
    return TimingWorker([python, "-c", _HTA_WORKER], "HTA worker", stderr=subprocess.DEVNULL)


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


def _analyse(path: Path) -> Any:
    from gpumagic.profile.load import load_trace

    r = load_trace(path)
    # everything the report shows, so nothing is left lazy
    r.summary, r.breakdown, r.steps, r.ops, r.kernels, r.idle, r.findings  # noqa: B018
    return r


def time_ours_once(path: Path) -> float:
    t = time.perf_counter()
    _analyse(path)
    return time.perf_counter() - t


def compare_with_hta(
    path: Path, repeats: int, hta: TimingWorker | None
) -> tuple[list[float], list[float] | None]:
    """Seconds of ``repeats`` runs each for us and for HTA, alternating so that load from
    other processes on a shared machine hits both alike (pair i is ours[i], theirs[i]).
    Both are warmed up first."""
    _analyse(path)
    if hta is not None:
        hta.time(path)
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(repeats):
        ours.append(time_ours_once(path))
        if hta is not None:
            theirs.append(hta.time(path))
    return ours, (theirs if hta is not None else None)


def _hta_python(explicit: str | None) -> str | None:
    if importlib.util.find_spec("hta") is not None:
        return sys.executable
    candidate = explicit or os.environ.get("GPUMAGIC_HTA_PYTHON")
    if candidate and Path(candidate).exists():
        probe = subprocess.run([candidate, "-c", "import hta"], capture_output=True)
        if probe.returncode == 0:
            return candidate
    return None


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
    p.add_argument("--repeats", type=int, default=7, help="timed pairs of runs (ours, HTA)")
    p.add_argument(
        "--events", type=int, default=2_000_000, help="size of the synthetic trace (0: skip)"
    )
    p.add_argument("--hta-python", help="an interpreter with HolisticTraceAnalysis installed")
    args = p.parse_args(argv)

    status = 0
    print("Trace analysis: gpumagic load + full analysis vs HTA load + temporal + idle breakdown")
    python = _hta_python(args.hta_python)
    hta = hta_worker(python) if python is not None else None
    if hta is None:
        print(
            f"  HTA not found (this interpreter, --hta-python, GPUMAGIC_HTA_PYTHON): {HTA_INSTALL}"
        )
    try:
        for name in RESNET:
            try:
                path = fetch(name)
            except TraceUnavailable as exc:
                print(f"  skipped: {exc}")
                continue
            ours, theirs = compare_with_hta(path, args.repeats, hta)
            line = f"  {name}: gpumagic median {statistics.median(ours) * 1000:,.0f} ms"
            if theirs is not None:
                ratios = [t / o for t, o in zip(theirs, ours)]
                failed, text = verdict(ratios, TARGET_RATIO, higher_is_better=True)
                status |= 1 if failed else 0
                line += (
                    f", HTA median {statistics.median(theirs) * 1000:,.0f} ms\n"
                    f"    pair ratios (HTA / gpumagic): {describe(ratios, 1)}\n    {text}"
                )
            print(line, flush=True)
    finally:
        if hta is not None:
            hta.close()

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
