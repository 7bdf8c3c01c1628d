"""Many rank traces: gpumagic's ``load_trace(dir)`` (default pool) against Holistic Trace
Analysis on the same folder, in wall time and in the memory of the notebook's process.

The job is written at run time (tests/job_traces.py, never committed): ``--ranks`` files,
rank N a copy of the real ``two_ranks/rank-(N % 2)`` with its times shifted, and rank
``--straggler``'s compute kernels stretched 1.6x (later work on each stream pushed back).

Each run is a fresh process, so its peak RSS (VmHWM) is its own:

* gpumagic: ``load_trace(dir)`` with the default executor (a process pool sized to the
  usable CPUs), the per-rank table, the slow ranks and the HTML report (which reads the
  slowest rank again in full);
* one rank: ``load_trace`` of the largest rank file and its HTML report: the memory the
  notebook needs for one rank, the yardstick of the target;
* HTA: ``TraceAnalysis(trace_dir=dir)`` (it parses the ranks in its own pool and keeps
  them all), ``get_temporal_breakdown`` and ``get_comm_comp_overlap``.

Runs alternate (ours, ours with the ranks read one at a time in the process itself, HTA)
``--repeats`` times; reported: the pair ratios of wall time (HTA
over ours), the notebook process's peak RSS against the largest single rank's (target:
<= 2x, whatever the number of ranks) and against the sum of the rank files' sizes, HTA's
peak RSS, and whether the straggler was named.

    python benchmarks/bench_ranks.py [--ranks 64] [--straggler 17] [--repeats 3] [--hta-python PATH]
"""

from __future__ import annotations

import argparse
import gzip
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
from bench_profile import HTA_INSTALL, _hta_python
from ratios import describe, verdict

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from job_traces import write_job  # noqa: E402
from trace_data import TraceUnavailable  # noqa: E402

TARGET_RSS = 2.0

_STATUS = r"""
def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None
"""

# gpumagic in a fresh process: the notebook's side of load_trace(dir).
_OURS = (
    r"""
import json, resource, sys, time
from concurrent.futures import Executor, Future
import numpy, pandas, msgspec  # noqa: F401 - imported before the baseline reading
from gpumagic.profile.load import load_trace
from gpumagic.profile.rules import registry  # noqa: F401
from gpumagic.render import profile  # noqa: F401
"""
    + _STATUS
    + r"""
class InThisProcess(Executor):
    # each task run at submit, in this process: the pool's work without the pool

    def submit(self, fn, /, *args, **kwargs):
        future = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def main():
    baseline = status("VmRSS")
    t = time.perf_counter()
    r = load_trace(sys.argv[1], executor=InThisProcess() if sys.argv[2:] == ["inline"] else None)
    r.per_rank, r.slow_ranks
    html = r.to_html()
    seconds = time.perf_counter() - t
    print(json.dumps({
        "seconds": seconds,
        "baseline_rss": baseline,
        "peak_rss": status("VmHWM"),
        "worker_peak_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
        "reduced_by": r.reduced_by,
        "ranks": len(r.ranks),
        "slowest_rank": r.slowest_rank,
        "slow_ranks": [[int(x.rank), x.reason] for x in r.slow_ranks.itertuples()],
        "html_bytes": len(html),
    }))

if __name__ == "__main__":  # the pool's spawned workers import this module again
    main()
"""
)

# HTA in a fresh process, on the same folder.
_HTA = (
    r"""
import json, logging, resource, sys, time, warnings
logging.disable(logging.CRITICAL)
warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
"""
    + _STATUS
    + r"""
def main():
    baseline = status("VmRSS")
    t = time.perf_counter()
    analysis = TraceAnalysis(trace_dir=sys.argv[1])
    analysis.get_temporal_breakdown(visualize=False)
    analysis.get_comm_comp_overlap(visualize=False)
    seconds = time.perf_counter() - t
    print(json.dumps({
        "seconds": seconds,
        "baseline_rss": baseline,
        "peak_rss": status("VmHWM"),
        "worker_peak_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
    }))

if __name__ == "__main__":
    main()
"""
)


def _run(python: str, script: str, path: Path, cwd: Path, *extra: str) -> dict[str, Any]:
    # The script is a file, not ``-c``: spawned pool workers re-import the main module.
    main = cwd / f"run_{abs(hash(script))}.py"
    main.write_text(script)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [python, str(main), str(path), *extra], capture_output=True, text=True, env=env, cwd=cwd
    )
    if out.returncode != 0:
        raise RuntimeError(f"{main.name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--straggler", type=int, default=17)
    p.add_argument("--repeats", type=int, default=3, help="alternating pairs (ours, HTA)")
    p.add_argument("--hta-python", help="an interpreter with HolisticTraceAnalysis installed")
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="gpumagic-bench-ranks-"))
    status = 0
    try:
        job = work / "traces"
        t = time.perf_counter()
        try:
            files = write_job(job, args.ranks, args.straggler)
        except TraceUnavailable as exc:
            print(f"  skipped: {exc}")
            return 0
        gz = sum(f.stat().st_size for f in files)
        json_bytes = sum(len(gzip.decompress(f.read_bytes())) for f in files)
        largest = max(files, key=lambda f: f.stat().st_size)
        print(
            f"{args.ranks} ranks written from two_ranks in {time.perf_counter() - t:.1f} s: "
            f"{_mib(gz)} of .json.gz, {_mib(json_bytes)} of JSON (largest file "
            f"{largest.stat().st_size / 2**10:,.0f} KiB), "
            f"straggler rank {args.straggler}"
        )
        one = _run(sys.executable, _OURS, largest, work)
        python = _hta_python(args.hta_python)
        if python is None:
            print(
                f"  HTA not found (this interpreter, --hta-python, GPUMAGIC_HTA_PYTHON): {HTA_INSTALL}"
            )
        ours: list[dict[str, Any]] = []
        inline: list[dict[str, Any]] = []
        theirs: list[dict[str, Any]] = []
        for _ in range(args.repeats):
            ours.append(_run(sys.executable, _OURS, job, work))
            inline.append(_run(sys.executable, _OURS, job, work, "inline"))
            if python is not None:
                theirs.append(_run(python, _HTA, job, work))

        first = ours[0]
        seconds = [o["seconds"] for o in ours]
        print(
            f"  gpumagic ({first['reduced_by']}): median {statistics.median(seconds):.2f} s "
            f"(load, per-rank table, slow ranks, HTML report); the same one rank at a time in "
            f"this process: median {statistics.median(o['seconds'] for o in inline):.2f} s"
        )
        named = first["slowest_rank"] == args.straggler and bool(
            first["slow_ranks"] and first["slow_ranks"][0][0] == args.straggler
        )
        print(f"  slowest rank: {first['slowest_rank']}; slow ranks named: {first['slow_ranks']}")
        print(f"  straggler named: {'yes' if named else 'NO'}")
        status |= 0 if named else 1
        if theirs:
            hta_s = [h["seconds"] for h in theirs]
            ratios = [h / o for h, o in zip(hta_s, seconds)]
            failed, text = verdict(ratios, 1.0, higher_is_better=True)
            print(
                f"  HTA: median {statistics.median(hta_s):.2f} s (parse, temporal breakdown, "
                f"comm/comp overlap)\n    pair ratios (HTA / gpumagic): {describe(ratios, 1)}\n"
                f"    {text} (faster than HTA)"
            )
            status |= 1 if failed else 0

        peak = max(o["peak_rss"] for o in ours)
        ratio = peak / one["peak_rss"]
        print(
            f"  notebook process peak RSS {_mib(peak)} (after imports {_mib(first['baseline_rss'])}, "
            f"+{_mib(peak - first['baseline_rss'])}); "
            f"one rank alone {_mib(one['peak_rss'])}: {ratio:.2f}x (target <= {TARGET_RSS:g}x) -> "
            f"{'met' if ratio <= TARGET_RSS else 'NOT met'}"
        )
        print(
            f"    = {peak / gz:.1f}x the {_mib(gz)} sum of the rank files; "
            f"largest pool worker {_mib(max(o['worker_peak_rss'] for o in ours))}"
        )
        status |= 0 if ratio <= TARGET_RSS else 1
        if theirs:
            hta_peak = max(h["peak_rss"] for h in theirs)
            print(
                f"  HTA process peak RSS {_mib(hta_peak)} = {hta_peak / one['peak_rss']:.2f}x one "
                f"rank in gpumagic, {hta_peak / gz:.1f}x the rank files "
                f"(its pool workers up to {_mib(max(h['worker_peak_rss'] for h in theirs))})"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
