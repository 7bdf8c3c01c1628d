"""One command that verifies gpumagic's CUDA and NVML paths on a GPU machine (issue 9).

    make gpu-check                 # on the GPU machine; or, where make is missing:
    bash tools/gpu-check.sh        # the same, run by python3 from PATH

Without CUDA it says so and exits with status 2 before doing anything else. With CUDA it
runs five parts, each in child processes with its own time budget and timeout; a part that
fails or runs out of time is reported and the rest still runs:

  wheels     installs the wheels of ``.gpu-wheels`` (``make gpu-wheels``, here) into a
             temporary site directory and checks the installed set (tools/check_wheels.py)
  pytest     ``pytest -m gpu`` with JUnit XML
  cells      each magic's CUDA path as real IPython cells, asserting on the results
             (tools/gpu_cells.py): %%memtrace on a ResNet training step, a real CUDA
             out-of-memory error and the memory coming back, %%gpuprofile on a slow loop
             whose findings must fire, %gpuwatch with NVML, %gpuenv, %%memfit's
             prediction against the real step's max_memory_allocated (within 10%),
             %gpucheck's figures within a plausible range of the card's specification
  bench      %%memtrace overhead on a CUDA training cell (the tensor census on: target
             <= 1.10; --no-tensors, the counters alone: <= 1.02), the probe's cost per
             statement, NVML's cost per sample (benchmarks/)
  notebooks  the tutorials in notebooks/ at their GPU size, with nbclient, HTML copies

The site directory and the repository root are exported in PYTHONPATH (the repository
first), so every child sees them: the tests' own subprocesses, the notebooks' kernels and
their torchrun workers. It writes under ``$OUT`` (else ``out/gpu-check``), at most 8 files:
``gpu-check.log`` (everything every child printed), ``junit.xml`` (pytest's cases and one
case per check of this script), ``summary.json`` and one ``NN_name.html`` per notebook. It
finishes within ``--budget`` seconds (default 470: the 8 minutes the issue allows, less a
margin), prints a summary table, and exits 1 if any check failed or timed out.

Self-test (``GPUMAGIC_GPU_CHECK_SELFTEST=1`` or ``--self-test``): the same plumbing on a
CPU machine (child processes, timeouts, the log, JUnit, the HTML copies, the summary) with
every GPU assertion reported as "not on a GPU". It never reports a GPU result.
``GPUMAGIC_GPU_CHECK_INJECT=fail,timeout`` adds a part that fails and one that runs past
its budget, to show both are reported and the rest still runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib.util
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
import zipfile
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tools"

PASSED, FAILED, TIMEOUT, NO_GPU, SKIPPED = "passed", "failed", "timeout", "not on a GPU", "skipped"
BAD = (FAILED, TIMEOUT)

# Seconds each part may take at most; the notebooks take what is left, one at most
# NOTEBOOK_BUDGET; all of them together stop at --budget. Worst case (every part hangs),
# the notebooks still get 470 - 370 s; on a healthy run the parts before them take far less.
# (cells: 105 s since %gpucheck's figures joined them, about ten seconds on one card)
BUDGETS = {"wheels": 45.0, "pytest": 150.0, "cells": 105.0, "bench": 70.0, "notebooks": float("inf")}
NOTEBOOK_BUDGET = 150.0
GRACE = 10.0  # after SIGINT (pytest then still writes its JUnit XML), before SIGKILL
MAX_OUT_FILES = 8  # what the device tool brings back from $OUT
# what gpumagic, its tests and the notebooks import that the GPU machine lacks
NEEDED = ["IPython", "ipywidgets", "msgspec", "ipykernel", "nbclient", "nbformat", "nbconvert", "zmq"]
SELFTEST_ENV = "GPUMAGIC_GPU_CHECK_SELFTEST"
INJECT_ENV = "GPUMAGIC_GPU_CHECK_INJECT"


@dataclass
class Check:
    part: str
    name: str
    status: str
    seconds: float = 0.0
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class ChildResult:
    returncode: int | None  # None: killed at its timeout
    seconds: float
    tail: str  # the last lines it printed

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


class Log:
    """The log file (everything) and stdout (what the runner itself says)."""

    def __init__(self, path: Path) -> None:
        self._file: TextIO = path.open("w", encoding="utf-8", errors="replace")
        self._lock = threading.Lock()

    def child(self, prefix: str, line: str) -> None:
        with self._lock:
            self._file.write(f"[{prefix}] {line}")
            if not line.endswith("\n"):
                self._file.write("\n")
            self._file.flush()

    def say(self, text: str = "") -> None:
        with self._lock:
            print(text, flush=True)
            self._file.write(text + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


def run_child(
    cmd: list[str],
    timeout: float,
    log: Log,
    prefix: str,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
    grace: float = GRACE,
) -> ChildResult:
    """Run ``cmd`` in its own session, every line it prints into the log; at ``timeout``
    SIGINT it (pytest and nbclient clean up on KeyboardInterrupt), then SIGKILL its group."""
    log.child(prefix, "$ " + " ".join(shlex.quote(c) for c in cmd))
    start = time.monotonic()
    tail: deque[str] = deque(maxlen=60)
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
    except OSError as exc:
        log.child(prefix, f"could not start: {exc}")
        return ChildResult(127, 0.0, f"could not start {cmd[0]}: {exc}")

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            log.child(prefix, line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=max(timeout, 0.1))
    except subprocess.TimeoutExpired:
        timed_out = True
        log.child(prefix, f"-- timeout after {timeout:.0f} s: SIGINT, then SIGKILL after {grace:.0f} s")
        _signal_group(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    _signal_group(proc.pid, signal.SIGKILL)  # whatever it left behind in its session
    reader.join(timeout=5)
    seconds = time.monotonic() - start
    rc = None if timed_out else proc.returncode
    log.child(prefix, f"-- exit {'timeout' if rc is None else rc} after {seconds:.1f} s")
    return ChildResult(rc, seconds, "\n".join(tail))


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _last_lines(text: str, n: int = 3, width: int = 300) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-width:]


class Context:
    """What every part shares: where to write, the deadline, the children's environment."""

    def __init__(self, args: argparse.Namespace, log: Log, out: Path, tmp: Path) -> None:
        self.args = args
        self.log = log
        self.out = out
        self.tmp = tmp
        self.self_test: bool = args.self_test
        self.python = sys.executable
        self.deadline = time.monotonic() + args.budget
        self.part_deadline = self.deadline
        self.cuda = False
        self.site: Path | None = None
        self.env = dict(os.environ)
        self.env.update(
            PYTHONUNBUFFERED="1",
            MPLBACKEND="Agg",
            JUPYTER_PLATFORM_DIRS="1",  # jupyter_core's paths without its deprecation warning
            PYTHONPATH=self._pythonpath(),
        )
        self.checks: list[Check] = []

    def _pythonpath(self) -> str:
        # the repository first: the notebooks' kernels import gpumagic from the environment
        parts = [str(REPO)] + ([str(self.site)] if self.site else [])
        old = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        return os.pathsep.join(dict.fromkeys(parts + old))

    def set_site(self, site: Path) -> None:
        self.site = site
        # exported: children of children (the tests' subprocesses, kernels, torchrun) too
        os.environ["PYTHONPATH"] = self.env["PYTHONPATH"] = self._pythonpath()
        # data files the wheels put under SITE/share/jupyter (nbconvert's HTML templates,
        # ipykernel's kernel spec) are found through JUPYTER_PATH, not sys.path
        data = [str(site / "share" / "jupyter")] + [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
        os.environ["JUPYTER_PATH"] = self.env["JUPYTER_PATH"] = os.pathsep.join(data)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def start_part(self, name: str) -> None:
        self.part_deadline = min(self.deadline, time.monotonic() + BUDGETS[name])

    def timeout(self, budget: float) -> float:
        """A child's timeout: its budget, cut to what the part's budget and the deadline
        leave after the grace."""
        now = time.monotonic()
        return max(0.0, min(budget, self.part_deadline - now, self.deadline - now - GRACE - 2.0))

    def child(self, cmd: list[str], budget: float, prefix: str) -> ChildResult:
        timeout = self.timeout(budget)
        if timeout < 1:
            self.log.child(prefix, f"not started, no time left: {' '.join(cmd)[:200]}")
            return ChildResult(None, 0.0, "not started: the part's time budget was spent")
        return run_child(cmd, timeout, self.log, prefix, env=self.env)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        mark = {PASSED: "ok", FAILED: "FAIL", TIMEOUT: "TIMEOUT"}.get(check.status, check.status)
        self.log.say(f"  {check.part}/{check.name}: {mark} ({check.seconds:.0f} s) {check.detail}")
        return check

    def out_of_time(self, part: str, name: str) -> Check:
        return self.add(Check(part, name, TIMEOUT, 0.0, "not started: the check's time budget was spent"))


# -- parts ------------------------------------------------------------------------------------


def part_wheels(ctx: Context) -> None:
    folder = Path(ctx.args.wheels)
    wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if wheels:
        site = Path(tempfile.mkdtemp(prefix="site-", dir=ctx.tmp))
        cmd = [ctx.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--upgrade", "--disable-pip-version-check", "--target", str(site),
               *map(str, wheels)]  # fmt: skip
        res = ctx.child(cmd, 40, "wheels")
        if res.returncode != 0:
            status = TIMEOUT if res.timed_out else FAILED
            ctx.add(Check("wheels", "install", status, res.seconds, _last_lines(res.tail)))
            return
        ctx.set_site(site)
        ctx.add(Check("wheels", "install", PASSED, res.seconds,
                      f"{len(wheels)} wheels from {folder} into {site}", {"site": str(site)}))  # fmt: skip
        res = ctx.child([ctx.python, str(TOOLS / "check_wheels.py"), "--installed", str(site)], 20, "wheels")
        ctx.add(Check("wheels", "requirements", PASSED if res.returncode == 0 else FAILED,
                      res.seconds, _last_lines(res.tail, 4, 600)))  # fmt: skip
    code = (
        "import importlib, json\n"
        f"names = {[*NEEDED, 'gpumagic']!r}\n"
        "seen = {}\n"
        "for n in names:\n"
        "    try:\n"
        "        m = importlib.import_module(n)\n"
        "        seen[n] = getattr(m, '__version__', '?')\n"
        "    except Exception as exc:\n"
        "        seen[n] = 'MISSING: ' + type(exc).__name__ + ': ' + str(exc)[:200]\n"
        "print(json.dumps(seen))\n"
    )
    res = ctx.child([ctx.python, "-c", code], 30, "wheels")
    seen = _json_line(res.tail) or {}
    missing = {k: v for k, v in seen.items() if str(v).startswith("MISSING")}
    if res.returncode != 0 or missing or not seen:
        hint = "" if wheels else f" (no wheels in {folder}: run `make gpu-wheels` here and carry the folder)"
        detail = "; ".join(f"{k}: {v}" for k, v in missing.items()) or _last_lines(res.tail)
        ctx.add(Check("wheels", "imports", TIMEOUT if res.timed_out else FAILED, res.seconds, detail + hint))
        return
    versions = ", ".join(f"{k} {v}" for k, v in seen.items())
    note = "" if wheels else f" (nothing to install: no wheels in {folder}, all importable)"
    ctx.add(Check("wheels", "imports", PASSED, res.seconds, versions + note, {"versions": seen}))


def _json_line(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                value = json.loads(line)
                if isinstance(value, dict):
                    return value
    return None


def part_pytest(ctx: Context) -> None:
    xml = ctx.tmp / "pytest-junit.xml"
    cmd = [ctx.python, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", "-rfEs",
           f"--junitxml={xml}", "-o", "junit_suite_name=pytest-gpu"]  # fmt: skip
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd.append("--timeout=120")  # one hung test fails alone instead of eating the part
    cmd += shlex.split(ctx.args.pytest_args) if ctx.args.pytest_args else ["tests"]
    res = ctx.child(cmd, BUDGETS["pytest"], "pytest")
    counts, failures = parse_junit(xml)
    if counts is None:
        status = TIMEOUT if res.timed_out else FAILED
        ctx.add(Check("pytest", "pytest -m gpu", status, res.seconds, "no JUnit XML: " + _last_lines(res.tail)))
        return
    ran = counts["tests"] - counts["skipped"]
    detail = (
        f"{ran - counts['failures'] - counts['errors']} passed, {counts['failures']} failed, "
        f"{counts['errors']} errors, {counts['skipped']} skipped of {counts['tests']}"
    )
    if res.timed_out:
        status = TIMEOUT
    elif counts["failures"] or counts["errors"] or res.returncode not in (0, 5):
        status = FAILED
    elif ran == 0:
        # every gpu test skipped: on a CPU that is the truth; on a GPU something is wrong
        status = FAILED if ctx.cuda else NO_GPU
        detail += "" if ctx.cuda else " (skipped without CUDA)"
    else:
        status = PASSED
    ctx.add(Check("pytest", "pytest -m gpu", status, res.seconds, detail, {"counts": counts, "failures": failures}))
    for f in failures[:15]:
        ctx.log.say(f"    {f['kind']}: {f['test']}: {f['message'][:200]}")


def parse_junit(path: Path) -> tuple[dict[str, int] | None, list[dict[str, str]]]:
    """pytest's JUnit XML -> ({tests, failures, errors, skipped}, [failed cases])."""
    if not path.is_file():
        return None, []
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return None, []
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failures = []
    for case in root.iter("testcase"):
        for kind in ("failure", "error"):
            el = case.find(kind)
            if el is not None:
                failures.append({
                    "kind": kind,
                    "test": f"{case.get('classname', '')}::{case.get('name', '')}",
                    "message": (el.get("message") or el.text or "").strip()[:2000],
                })  # fmt: skip
    return counts, failures


CELL_CHECKS = ["shell", "gpuenv", "gpuwatch", "memtrace_resnet", "gpuprofile_slow_loop", "memtrace_oom", "memfit_resnet", "gpucheck"]


def part_cells(ctx: Context) -> None:
    jsonl = ctx.tmp / "cells.jsonl"
    budget = ctx.timeout(BUDGETS["cells"])
    cmd = [ctx.python, str(TOOLS / "gpu_cells.py"), "--json", str(jsonl), "--budget", f"{max(budget - 5, 1):.0f}"]
    res = ctx.child(cmd, BUDGETS["cells"], "cells")
    seen = set()
    if jsonl.is_file():
        for line in jsonl.read_text().splitlines():
            with contextlib.suppress(ValueError, TypeError):
                c = Check(**{"part": "cells", **json.loads(line)})
                seen.add(c.name)
                ctx.add(c)
    for name in CELL_CHECKS:
        if name not in seen:
            status = TIMEOUT if res.timed_out else FAILED
            why = "the cells' process ran out of time" if res.timed_out else f"not reported (exit {res.returncode})"
            ctx.add(Check("cells", name, status, 0.0, f"{why}: {_last_lines(res.tail)}"))


def part_bench(ctx: Context) -> None:
    out = ctx.tmp / "bench_memtrace.json"
    cmd = [ctx.python, str(REPO / "benchmarks" / "bench_memtrace.py"), "--device", "cuda",
           "--repeats", str(ctx.args.bench_repeats), "--json", str(out)]  # fmt: skip
    res = ctx.child(cmd, 50, "bench")
    for c in memtrace_bench_checks(_read_json(out), res, ctx.cuda):
        ctx.add(c)
    out = ctx.tmp / "bench_watch.json"
    cmd = [ctx.python, str(REPO / "benchmarks" / "bench_watch.py"), "--sample-cost-only", "--json", str(out)]
    res = ctx.child(cmd, 25, "bench")
    for c in watch_bench_checks(_read_json(out), res, ctx.cuda):
        ctx.add(c)


MEMTRACE_BENCH = ("memtrace overhead, CUDA training cell", "probe cost per statement")


def memtrace_bench_checks(data: dict[str, Any] | None, res: ChildResult, cuda: bool) -> list[Check]:
    """benchmarks/bench_memtrace.py --device cuda --json -> the two bench checks."""
    if data is None or "error" in data:
        why = (data or {}).get("error") or _last_lines(res.tail)
        if data is not None and data.get("cuda") is False and not cuda:
            status = NO_GPU
        else:
            status = TIMEOUT if res.timed_out else FAILED
        return [Check("bench", name, status, res.seconds, why) for name in MEMTRACE_BENCH]
    train, probe = data["workloads"]["cnn"], data["workloads"]["tight"]
    # the census on (categories) against its target, and --no-tensors (the counters alone)
    # against the counters' own, both in the one check
    ok = not train["failed"] and not train.get("counters_failed", False) and res.returncode == 0
    on = f"{train['clock']} time, {data['device']}"
    counters = (
        f"; --no-tensors ratio {train['counters_ratio']:.3f} ({train['counters_verdict']})"
        if "counters_verdict" in train
        else ""
    )
    checks = [
        Check("bench", MEMTRACE_BENCH[0], PASSED if ok else FAILED, res.seconds,
              f"ratio {train['ratio']:.3f} ({on}; {train['verdict']}){counters}; {train['spread']}", train),
    ]  # fmt: skip
    probed = str(probe["device"])
    status = PASSED if probed.startswith("cuda") or not cuda else FAILED
    checks.append(Check("bench", MEMTRACE_BENCH[1], status, 0.0,
                        f"{probe['us_per_statement']:.1f} µs per statement, probing {probed} "
                        f"({probe['statements']} statements a run; {probe['us_spread']})", probe))  # fmt: skip
    return checks


def watch_bench_checks(data: dict[str, Any] | None, res: ChildResult, cuda: bool) -> list[Check]:
    """benchmarks/bench_watch.py --sample-cost-only --json -> the NVML check."""
    name = "NVML cost per sample"
    if data is None:
        return [Check("bench", name, TIMEOUT if res.timed_out else FAILED, res.seconds, _last_lines(res.tail))]
    per = data["sample_cost"]
    detail = (
        f"{per['cpu_per_sample_s'] * 1e6:.0f} µs CPU per sample in the sampler thread, "
        f"{per['wall_per_sample_s'] * 1e6:.0f} µs wall per sample_now() ({per['samples']} samples)"
    )
    if data["reason"] is None:
        return [Check("bench", name, PASSED if res.returncode == 0 else FAILED, res.seconds, detail, data)]
    status = FAILED if cuda else NO_GPU
    return [Check("bench", name, status, res.seconds, f"sampled the host, not NVML: {data['reason']}; {detail}", data)]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def part_notebooks(ctx: Context) -> None:
    paths = [Path(p) for p in ctx.args.notebooks] if ctx.args.notebooks else sorted(
        (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")
    )
    html_dir = ctx.out if len(paths) <= MAX_OUT_FILES - 3 else ctx.tmp / "html"
    html_dir.mkdir(parents=True, exist_ok=True)
    for path in paths:
        name = path.stem
        budget = min(NOTEBOOK_BUDGET, ctx.timeout(NOTEBOOK_BUDGET))
        if budget < 10:
            ctx.out_of_time("notebooks", name)
            continue
        result, pidfile = ctx.tmp / f"nb-{name}.json", ctx.tmp / f"nb-{name}.kernel"
        cmd = [ctx.python, str(TOOLS / "gpu_notebooks.py"), str(path), "--html", str(html_dir / f"{name}.html"),
               "--json", str(result), "--budget", f"{budget - 5:.0f}", "--pidfile", str(pidfile)]  # fmt: skip
        res = ctx.child(cmd, budget + 5, "notebooks")
        with contextlib.suppress(OSError, ValueError):  # a kernel its client left behind
            _signal_group(int(pidfile.read_text()), signal.SIGKILL)
        data = _read_json(result)
        if data is None:
            status = TIMEOUT if res.timed_out else FAILED
            ctx.add(Check("notebooks", name, status, res.seconds, _last_lines(res.tail)))
            continue
        status = PASSED if data["ok"] else (TIMEOUT if data.get("timed_out") else FAILED)
        where = "GPU size" if data.get("gpu_size") else "CPU size"
        if not ctx.cuda:
            where = "on the CPU (self-test): not a GPU result"
        elif not data.get("gpu_size"):
            where = "CPU size: its parameters cell chose so on this machine"
        detail = f"{where}; {data['detail']}; parameters: {data.get('parameters', '')[:160]}"
        ctx.add(Check("notebooks", name, status, res.seconds, detail, data))
    if html_dir != ctx.out:  # more notebooks than $OUT has room for: one archive
        with zipfile.ZipFile(ctx.out / "notebooks-html.zip", "w", zipfile.ZIP_DEFLATED) as z:
            for f in sorted(html_dir.glob("*.html")):
                z.write(f, f.name)


def part_inject(ctx: Context) -> None:
    """Self-test only: a part that fails and one that outlives its budget."""
    wanted = {w.strip() for w in os.environ.get(INJECT_ENV, "").split(",") if w.strip()}
    if "fail" in wanted:
        res = ctx.child([ctx.python, "-c", "import sys; print('a deliberate failure'); sys.exit(3)"], 30, "inject")
        ctx.add(Check("inject", "fail", PASSED if res.returncode == 0 else FAILED, res.seconds, _last_lines(res.tail)))
    if "timeout" in wanted:
        code = "import time; print('sleeping past the budget', flush=True); time.sleep(120)"
        res = run_child([ctx.python, "-c", code], 1.0, ctx.log, "inject", env=ctx.env, grace=1.0)
        status = TIMEOUT if res.timed_out else FAILED
        ctx.add(Check("inject", "timeout", status, res.seconds, f"budget 1 s: {_last_lines(res.tail)}"))


PARTS: dict[str, Callable[[Context], None]] = {
    "wheels": part_wheels,
    "pytest": part_pytest,
    "cells": part_cells,
    "bench": part_bench,
    "notebooks": part_notebooks,
}


# -- reporting --------------------------------------------------------------------------------


def write_junit(path: Path, checks: list[Check], pytest_xml: Path | None) -> None:
    """One file: pytest's own suite(s), then one case per check of this script."""
    root = ET.Element("testsuites", name="gpu-check")
    if pytest_xml is not None and pytest_xml.is_file():
        with contextlib.suppress(ET.ParseError):
            got = ET.parse(pytest_xml).getroot()
            for suite in [got] if got.tag == "testsuite" else list(got.iter("testsuite")):
                root.append(suite)
    suite = ET.SubElement(root, "testsuite", name="gpu-check", tests=str(len(checks)))
    counts = {"failures": 0, "errors": 0, "skipped": 0}
    total = 0.0
    for c in checks:
        case = ET.SubElement(suite, "testcase", classname=f"gpu_check.{c.part}", name=c.name, time=f"{c.seconds:.3f}")
        total += c.seconds
        if c.status in BAD:
            counts["failures"] += 1
            ET.SubElement(case, "failure", message=f"{c.status}: {c.detail}"[:2000]).text = c.detail
        elif c.status in (NO_GPU, SKIPPED):
            counts["skipped"] += 1
            ET.SubElement(case, "skipped", message=f"{c.status}: {c.detail}"[:2000])
        else:
            ET.SubElement(case, "system-out").text = c.detail
    for k, v in counts.items():
        suite.set(k, str(v))
    suite.set("time", f"{total:.3f}")
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def summary_table(checks: list[Check]) -> str:
    rows = [("part", "check", "status", "time", "detail")]
    for c in checks:
        rows.append((c.part, c.name, c.status.upper() if c.status in BAD else c.status, f"{c.seconds:.0f}s", c.detail))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for r in rows:
        detail = r[4] if len(r[4]) <= 150 else r[4][:147] + "..."
        lines.append(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]:>{w[3]}}  {detail}")
    return "\n".join(lines)


def cuda_state() -> tuple[bool, dict[str, Any]]:
    """(available, facts) without creating a CUDA context (no device is touched here)."""
    try:
        import torch
    except Exception as exc:  # a broken torch is as good as none for this check
        return False, {"torch": f"not importable: {type(exc).__name__}: {exc}"}
    facts: dict[str, Any] = {"torch": torch.__version__, "cuda_build": torch.version.cuda}
    try:
        available = bool(torch.cuda.is_available())
        facts["devices"] = torch.cuda.device_count() if available else 0
    except Exception as exc:
        available = False
        facts["error"] = f"{type(exc).__name__}: {exc}"
    return available, facts


def nvidia_smi() -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "nvidia-smi: not found"
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi: {exc}"
    return (out.stdout or out.stderr).strip()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "out" / "gpu-check"),
                        help="where the log, JUnit XML, summary and HTML go (default $OUT, else out/gpu-check)")  # fmt: skip
    parser.add_argument("--wheels", default=str(REPO / ".gpu-wheels"), help="wheel folder (make gpu-wheels)")
    parser.add_argument("--budget", type=float, default=470.0, help="seconds for everything (default 470)")
    parser.add_argument("--only", default="", help="comma-separated parts to run (default all)")
    parser.add_argument("--pytest-args", default="", help="instead of 'tests' (self-test: a smaller selection)")
    parser.add_argument("--notebooks", nargs="*", help="notebooks to run (default notebooks/NN_*.ipynb)")
    parser.add_argument("--bench-repeats", type=int, default=15, help="bench_memtrace pairs (default 15)")
    parser.add_argument("--self-test", action="store_true", default=os.environ.get(SELFTEST_ENV, "") not in ("", "0"),
                        help=f"the plumbing on a CPU, no GPU result (also {SELFTEST_ENV}=1)")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    cuda, facts = cuda_state()
    if not cuda and not args.self_test:
        # before anything else: no folder made, nothing installed, nothing run
        why = (
            f"torch {facts['torch']}"
            if str(facts.get("torch", "")).startswith("not importable")
            else f"torch {facts['torch']}: torch.cuda.is_available() is False"
        ) + (f"; {facts['error']}" if "error" in facts else "")
        print(
            f"gpu-check: no CUDA GPU here ({why}; python3 is {sys.executable}).\n"
            "It verifies gpumagic's CUDA and NVML paths, so it runs only on a machine with an NVIDIA GPU:\n"
            "prepare here with `make gpu-wheels`, then run `make gpu-check` (or `bash tools/gpu-check.sh`)\n"
            "there with the .gpu-wheels folder carried along. Nothing was run.\n"
            f"({SELFTEST_ENV}=1 runs the kit's plumbing on a CPU; it reports no GPU result.)",
            file=sys.stderr,
        )
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("gpu-check.log", "junit.xml", "summary.json", "notebooks-html.zip"):
        with contextlib.suppress(FileNotFoundError):
            (out / stale).unlink()
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    log = Log(out / "gpu-check.log")
    ctx = Context(args, log, out, tmp)
    ctx.cuda = cuda
    mode = "SELF-TEST on a machine without CUDA: no result below is a GPU result" if not cuda else "GPU"
    log.say(f"gpu-check ({mode}), {_dt.datetime.now().astimezone():%Y-%m-%d %H:%M:%S %Z}")
    log.say(f"  python {platform.python_version()} at {sys.executable}; {', '.join(f'{k} {v}' for k, v in facts.items())}")
    log.say(f"  {nvidia_smi()}")
    log.say(f"  out {out}; temporary {tmp}; budget {args.budget:.0f} s")
    only = [p.strip() for p in args.only.split(",") if p.strip()] or list(PARTS)
    unknown = [p for p in only if p not in PARTS]
    if unknown:
        log.say(f"unknown parts: {', '.join(unknown)} (parts: {', '.join(PARTS)})")
        return 2
    for name in only:
        budget = f"{BUDGETS[name]:.0f} s" if name != "notebooks" else f"what is left, {NOTEBOOK_BUDGET:.0f} s a notebook"
        log.say(f"\n== {name} (budget {budget}; {max(ctx.left(), 0):.0f} s left in all)")
        ctx.start_part(name)
        if ctx.left() < GRACE + 5:
            ctx.out_of_time(name, name)
            continue
        try:
            PARTS[name](ctx)
        except Exception as exc:  # a bug in the runner fails this part, not the rest
            ctx.add(Check(name, name, FAILED, 0.0, f"runner error: {type(exc).__name__}: {exc}"))
    if args.self_test and os.environ.get(INJECT_ENV):
        log.say("\n== inject (self-test)")
        part_inject(ctx)
    bad = [c for c in ctx.checks if c.status in BAD]
    rc = 1 if bad else 0
    seconds = time.monotonic() - started
    write_junit(out / "junit.xml", ctx.checks, tmp / "pytest-junit.xml")
    summary = {
        "mode": "gpu" if cuda else "self-test (no GPU)",
        "gpu_result": bool(cuda),
        "environment": {"python": platform.python_version(), **facts, "nvidia_smi": nvidia_smi() if cuda else None},
        "seconds": round(seconds, 1),
        "budget_s": args.budget,
        "exit_status": rc,
        "counts": {s: sum(c.status == s for c in ctx.checks) for s in (PASSED, FAILED, TIMEOUT, NO_GPU, SKIPPED)},
        "checks": [asdict(c) for c in ctx.checks],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    log.say("\n== summary")
    log.say(summary_table(ctx.checks))
    counts = ", ".join(f"{v} {k}" for k, v in summary["counts"].items() if v)
    verdict = "FAILED" if bad else "ok"
    if not cuda:
        verdict += " (self-test: plumbing only, no GPU result)"
    log.say(f"\ngpu-check {verdict}: {counts}; {seconds:.0f} s; files in {out}: "
            f"{', '.join(sorted(p.name for p in out.iterdir() if p.is_file()))}")  # fmt: skip
    log.close()
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
