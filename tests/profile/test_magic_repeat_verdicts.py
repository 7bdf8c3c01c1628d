"""Issue 18 through a real shell on real torch (CPU): ``%%gpuprofile --repeat N``, comparisons
with their verdict, and no Kineto ``USDT`` lines on stderr.

The A/A and A/B counts (20 comparisons each, with and without a CPU hog beside) are a
benchmark, ``benchmarks/bench_noise.py``: here, only differences no busy machine can hide.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cell_outputs import run_showing
from IPython.core.error import UsageError

REPO = Path(__file__).resolve().parents[2]

LOOP = (
    "%%gpuprofile -q -n {name} {options}\n"
    "import time, torch, gpumagic\n"
    "for _ in range({steps}):\n"
    "    torch.ones(8, 8).sum()\n"
    "    time.sleep({sleep})\n"
    "    runs_done.append(1)\n"
    "    gpumagic.step()\n"
)


@pytest.fixture
def show(ip, run):
    """show(cell) -> Outputs: the cell's display() bundles and its Out[] bundle."""
    return lambda cell: run_showing(ip, run, cell)


def test_repeat_runs_the_cell_n_times_and_keeps_every_run_as_samples(ip, run):
    ip.user_ns["runs_done"] = []
    r = run(LOOP.format(name="rep", options="--repeat 3", steps=5, sleep=0.005))
    assert r.result.success, r.stdout
    assert len(ip.user_ns["runs_done"]) == 15  # the cell ran three times
    p = ip.user_ns["_gpuprofile"]
    assert len(p.runs) == 3 and p.runs[-1] is p
    # each run's steps, the first (setup) left out of each
    assert [len(s) for s in p.step_samples] == [4, 4, 4]
    s = p.summary
    assert s.runs == 3 and s.steps == 4
    assert s.step_time_median_interval_us is not None
    text = p.to_text()
    assert "over 3 runs" in text and "95% CI" in text


def test_repeat_must_be_at_least_one(run):
    r = run(LOOP.format(name="none", options="--repeat 0", steps=2, sleep=0))
    assert isinstance(r.result.error_in_exec, UsageError)
    assert "--repeat must be at least 1" in str(r.result.error_in_exec)


def test_a_failing_run_ends_the_repeats_and_shows_what_ran(ip, run):
    ip.user_ns["runs_done"] = []
    r = run(
        "%%gpuprofile -n broken --repeat 3\n"
        "import torch, gpumagic\n"
        "for _ in range(3):\n"
        "    torch.ones(4).sum()\n"
        "    runs_done.append(1)\n"
        "    gpumagic.step()\n"
        "if len(runs_done) >= 6:\n"
        "    raise ValueError('second run fails')\n"
    )
    assert isinstance(r.result.error_in_exec, ValueError)
    assert len(ip.user_ns["runs_done"]) == 6  # the third run never started
    p = ip.user_ns["_gpuprofile"]
    assert len(p.runs) == 2  # the first run's steps are kept with the failed one's
    assert "The cell failed (ValueError: second run fails)" in r.html() + "".join(
        b.get("text/plain", "") for b in r.bundles
    )


def test_compare_says_slower_with_its_interval_for_a_step_twice_as_long(ip, run, show):
    ip.user_ns["runs_done"] = []
    for name, sleep in (("quick", 0.01), ("slow", 0.02)):
        r = run(LOOP.format(name=name, options="", steps=12, sleep=sleep))
        assert r.result.success, r.stdout
    r = show("%gpuprofile --compare quick slow")
    assert r.result.success
    c = ip.user_ns["_gpuprofile_compare"]
    assert c.verdict == "slower"
    lo, hi = c.interval
    assert 30 < lo <= hi  # well beyond any noise: the sleep alone doubled
    plain = r.plain()
    assert c.headline in plain and "95% CI" in plain
    assert "hierarchical percentile bootstrap" in plain


def test_no_usdt_line_reaches_stderr_even_after_torch_profiler_ran_first(tmp_path):
    # torch.profiler used directly first: Kineto then keeps its default log level, which
    # writes "USDT: ... profiler_start/stop" to fd 2 at every start and stop
    code = textwrap.dedent(
        """
        import os, torch
        from torch.profiler import profile
        with profile():
            torch.ones(3) + 1
        os.write(2, b"--- gpumagic from here ---\\n")
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "gpumagic")
        for options in ("", "--wait 1 --warmup 1 --active 2"):
            r = ip.run_cell(
                f"%%gpuprofile -q {options}\\n"
                "import gpumagic, torch\\n"
                "for _ in range(5):\\n"
                "    torch.ones(3).sum()\\n"
                "    gpumagic.step()\\n"
            )
            assert r.success, r.error_in_exec
        os.write(2, b"--- end ---\\n")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MPLBACKEND": "Agg"},
    )
    assert done.returncode == 0, done.stderr
    before, _, after = done.stderr.partition("--- gpumagic from here ---")
    assert "USDT" in before  # the check can see them: torch.profiler alone prints them
    assert "--- end ---" in after and "USDT" not in after, after


@pytest.mark.parametrize("line", ["%gpuprofile --compare quick", "%gpuprofile --repeat 2"])
def test_line_forms_still_refuse_what_they_cannot_do(run, line):
    r = run(line)
    assert isinstance(r.result.error_in_exec, UsageError)


def test_lines_modules_and_operators_count_the_steps_the_statistics_count(ip, run):
    import torch

    ip.user_ns["net"] = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
    r = run(
        "%%gpuprofile -q\n"
        "import torch, gpumagic\n"
        "x = torch.randn(8, 16)\n"
        "for _ in range(5):\n"
        "    loss = net(x).sum()\n"
        "    loss.backward()\n"
        "    gpumagic.step()\n"
    )
    assert r.result.success, r.stdout
    p = ip.user_ns["_gpuprofile"]
    steps = p.summary.steps
    assert steps == 4 and p.summary.first_step_left_out  # the setup step is out...
    lines = p.lines.set_index("line")
    assert list(lines.loc[[5, 6, 7], "hits"]) == [steps] * 3  # ...of the lines
    assert 3 not in lines.index  # code before the loop is outside every step
    assert (p.modules["calls"] == steps).all()  # ...of the modules
    assert p.ops.set_index("name").loc["aten::addmm", "calls"] == steps  # ...and operators
    kept = run(
        "%%gpuprofile -q --keep-first\n"
        "for _ in range(5):\n"
        "    loss = net(x).sum()\n"
        "    gpumagic.step()\n"
    )
    assert kept.result.success
    k = ip.user_ns["_gpuprofile"]
    assert k.summary.steps == 5 and (k.modules["calls"] == 5).all()
