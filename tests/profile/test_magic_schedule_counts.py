"""%%gpuprofile with a schedule, ended at every count of gpumagic.step() calls (issue 25):
the kernel lives, the cell runs as it would without the magic, and the report says which
steps it recorded, that it holds only the cell's end, or that nothing was recorded.

A cell ending in the schedule's warm-up once crashed the process (torch's (WARMUP, None)
transition starts a trace to stop it, and the recorder took that start for the cell's own
profiler). A crash must fail the test, not end pytest, so the cells run in a child IPython,
one JSON line each; the last cell begun names the one that crashed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]

# (wait, warmup, active, repeat): every count of steps from 0 to beyond the window is run
SCHEDULES = [
    (w, u, a, 1) for w in (0, 1, 2) for u in (0, 1, 2) for a in (1, 2)
] + [(2, 1, 2, 2), (1, 0, 1, 2)]
MAX_STEPS = 6

CHILD = textwrap.dedent(
    """
    import json, sys
    from IPython.testing.globalipapp import start_ipython
    from IPython.utils.capture import capture_output

    ip = start_ipython()
    ip.run_line_magic("load_ext", "gpumagic")
    ip.run_cell("import torch, gpumagic")
    for wait, warmup, active, repeat, steps in json.loads(sys.argv[1]):
        print("BEGIN", wait, warmup, active, repeat, steps, flush=True)
        for name in ("_gpuprofile", "done"):
            ip.user_ns.pop(name, None)
        cell = (
            f"%%gpuprofile --wait {wait} --warmup {warmup} --active {active} --repeat {repeat}\\n"
            "x = torch.randn(32, 32)\\n"
            "done = 0\\n"
            f"for i in range({steps}):\\n"
            "    y = x @ x\\n"
            "    gpumagic.step()\\n"
            "    done += 1\\n"
        )
        with capture_output() as cap:
            r = ip.run_cell(cell)
        p = ip.user_ns.get("_gpuprofile")
        print(json.dumps({
            "case": [wait, warmup, active, repeat, steps],
            "success": r.success,
            "error": repr(r.error_in_exec or r.error_before_exec),
            "done": ip.user_ns.get("done"),
            "shown": cap.stdout + "".join(o.data.get("text/plain", "") for o in cap.outputs),
            "step_names": None if p is None else p.summary.step_names,
            "steps_from": None if p is None else p.summary.steps_from,
            "notes": None if p is None else p.notes,
        }), flush=True)
    """
)


@pytest.fixture(scope="module")
def ended_cells():
    cases = [[*s, n] for s in SCHEDULES for n in range(MAX_STEPS + 1)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(cases)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    lines = done.stdout.splitlines()
    begun = [ln for ln in lines if ln.startswith("BEGIN")]
    assert done.returncode == 0, (
        f"the kernel died (rc {done.returncode}) in the cell of "
        f"{begun[-1] if begun else 'none begun'} (wait warmup active repeat steps)\n"
        + done.stderr[-2000:]
    )
    results = [json.loads(ln) for ln in lines if ln.startswith("{")]
    assert len(results) == len(cases)
    return results


def test_a_cell_ending_in_the_warm_up_of_its_schedule_leaves_the_kernel_alive(ended_cells):
    """The issue's cell: wait 2, warm-up 1, active 2, and two steps; the kernel lives and the
    report says nothing was recorded, with the count the schedule needs."""
    (cell,) = [c for c in ended_cells if c["case"] == [2, 1, 2, 1, 2]]
    assert cell["success"] and cell["done"] == 2
    assert (
        "nothing was recorded: the schedule (wait=2, warmup=1, active=2) needs at least 4 "
        "gpumagic.step() calls before it records, and the cell made 2" in cell["shown"]
    )


def test_every_count_of_steps_reports_what_its_schedule_recorded(ended_cells):
    for cell in ended_cells:
        wait, warmup, active, _repeat, steps = cell["case"]
        # the cell's own behaviour: it ran to its end, every run of --repeat
        assert cell["success"], cell
        assert cell["done"] == steps, cell
        skipped = wait + warmup
        if steps < skipped:  # the window never opened
            assert "nothing was recorded" in cell["shown"], cell
            assert f"the cell made {steps}" in cell["shown"], cell
            assert cell["step_names"] is None, cell
        elif steps == skipped and steps > 0:
            # the window opened at the last step() call: only the cell's end, said so
            assert cell["steps_from"] != "ProfilerStep", cell
            assert any("no whole step" in n for n in cell["notes"]), cell
        elif steps == 0:  # no schedule to skip and no marks: the cell is one step
            assert cell["steps_from"] != "ProfilerStep", cell
        else:
            # the recorded steps, by their ProfilerStep numbers; the span after the last
            # step() call (the cell's end) is no step
            recorded = [str(k) for k in range(skipped, skipped + min(active, steps - skipped))]
            assert cell["steps_from"] == "ProfilerStep", cell
            assert cell["step_names"] == recorded, cell
            assert not any("no whole step" in n for n in cell["notes"]), cell
