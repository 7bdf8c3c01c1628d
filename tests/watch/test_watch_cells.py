"""Cell marks from IPython's pre/post_run_cell events, in a real InteractiveShell."""

from __future__ import annotations

import math
from typing import Any

import psutil
import pytest
from watch_nvml_double import MIB, gpu

from gpumagic.monitor import Watcher, current, watch


def callbacks(shell: Any, watcher: Watcher) -> int:
    """How many of the watcher's callbacks the shell still holds."""
    marks = watcher.marks
    return shell.events.callbacks["pre_run_cell"].count(
        marks._pre_run_cell
    ) + shell.events.callbacks["post_run_cell"].count(marks._post_run_cell)


@pytest.fixture
def host_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr("gpumagic.monitor.nvml.torch_visible_uuids", lambda: None)


@pytest.mark.usefixtures("host_only")
def test_cells_are_marked_with_counts_source_and_times(wshell: Any) -> None:
    w = watch(interval=0.1, shell=wshell)
    assert callbacks(wshell, w) == 2
    r1 = wshell.run_cell("import time\nx = 1  # first", store_history=True)
    wshell.run_cell("   \n", store_history=True)  # blank: IPython fires post_run_cell only
    r2 = wshell.run_cell(
        "\n\n# spin one core\nt0 = time.perf_counter()\n"
        "while time.perf_counter() - t0 < 0.45:\n    pass",
        store_history=True,
    )
    r3 = wshell.run_cell("1 / 0", store_history=True)
    result = w.stop()
    assert callbacks(wshell, w) == 0  # unregistered on stop

    cells = result.cells
    assert list(cells["execution_count"]) == [
        r1.execution_count,
        r2.execution_count,
        r3.execution_count,
    ]
    assert list(cells["source"]) == ["import time", "# spin one core", "1 / 0"]
    assert list(cells["success"]) == [True, True, False]
    spin = cells.iloc[1]
    assert 0.45e6 <= spin["duration_us"] < 2e6
    assert spin["samples"] >= 3  # ~4 samples at 0.1 s, plus the one after the cell ended
    # One core spinning is at least 1/ncpu of the machine (other load only adds to it).
    assert spin["peak_host_cpu"] >= 0.5 * 100 / (psutil.cpu_count() or 1)
    assert spin["peak_host_memory"] > 0
    assert "peak_utilization" not in cells.columns  # host only: no GPU columns
    assert cells["start"].is_monotonic_increasing
    # A cell shorter than the interval still gets the sample taken right after it ended.
    assert cells.iloc[0]["samples"] >= 1


@pytest.mark.usefixtures("host_only")
def test_watch_started_inside_a_cell_marks_the_following_cells(wshell: Any) -> None:
    wshell.user_ns["gm_shell"] = wshell
    wshell.run_cell(
        "import gpumagic\n_w = gpumagic.watch(interval=0.1, shell=gm_shell)", store_history=True
    )
    w = current()
    assert w is not None and w.marks.attached
    run = wshell.run_cell("import time; time.sleep(0.15)", store_history=True)
    wshell.run_cell("_res = _w.stop()", store_history=True)  # stopped from inside a cell
    result = wshell.user_ns["_res"]
    counts = list(result.cells["execution_count"])
    assert counts[0] == run.execution_count
    # The stopping cell itself is cut at the stop, not left open forever.
    assert all(not math.isnan(d) for d in result.cells["duration_us"])
    assert callbacks(wshell, w) == 0


@pytest.mark.usefixtures("host_only")
def test_replacing_a_watcher_moves_the_cell_marks(wshell: Any) -> None:
    first = watch(interval=0.1, shell=wshell)
    second = watch(interval=0.1, shell=wshell)
    assert callbacks(wshell, first) == 0 and callbacks(wshell, second) == 2
    wshell.run_cell("y = 2", store_history=True)
    assert len(second.result().cells) == 1 and len(first.result().cells) == 0


def test_cell_peaks_from_the_gpu(wshell: Any, fake_nvml: Any) -> None:
    import os

    fake = fake_nvml(
        [gpu("Fake A", "GPU-aaaa", util=3, mem_used=1000 * MIB, procs=[(os.getpid(), 300 * MIB)])]
    )
    wshell.user_ns["fake"] = fake
    w = watch(interval=0.1, shell=wshell)
    run = wshell.run_cell(
        "import time\n"
        "fake.gpus[0]['util'] = 97; fake.gpus[0]['mem_used'] = 9000 * 2**20\n"
        "time.sleep(0.35)\n"
        "fake.gpus[0]['util'] = 3; fake.gpus[0]['mem_used'] = 1000 * 2**20",
        store_history=True,
    )
    result = w.stop()
    row = result.cells.iloc[0]
    assert row["execution_count"] == run.execution_count
    assert row["peak_utilization"] == 97
    assert row["peak_memory"] == 9000 * MIB
    assert row["peak_process_memory"] == 300 * MIB
    assert 3 <= row["mean_utilization"] < 97


def test_cell_records_are_bounded_and_windowed() -> None:
    from gpumagic.monitor.cells import MAX_CELLS, CellMarks

    marks = CellMarks()
    for i in range(MAX_CELLS + 50):
        marks.open(f"cell {i}", i, start=float(i))
        marks.close(i, True, end=i + 0.5)
    assert len(marks.cells) == MAX_CELLS  # a day of cells cannot grow memory without bound
    recent = marks.records(since=float(MAX_CELLS + 40))
    assert [r.execution_count for r in recent] == list(range(MAX_CELLS + 40, MAX_CELLS + 50))
    marks.open("running", None, start=0.0)
    assert marks.records(since=1e12)[-1].source == "running"  # a running cell is always drawn


@pytest.mark.usefixtures("host_only")
def test_cells_are_marked_only_on_a_shell_it_is_given(wshell: Any) -> None:
    """The sampler core never looks for IPython itself (issue 8): ``%gpuwatch`` passes its
    shell, a notebook calling ``gpumagic.watch`` passes ``shell=get_ipython()``."""
    import gpumagic

    alone = gpumagic.watch(interval=0.1)  # inside IPython, but no shell given: no marks
    assert not alone.marks.attached and callbacks(wshell, alone) == 0
    alone.stop()
    given = gpumagic.watch(interval=0.1, shell=wshell)
    assert given.marks.attached and callbacks(wshell, given) == 2
    given.stop()
    assert callbacks(wshell, given) == 0
    off = gpumagic.watch(interval=0.1, cells=False, shell=wshell)
    assert not off.marks.attached and callbacks(wshell, off) == 0
    off.stop()
