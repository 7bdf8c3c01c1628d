"""Shared boxes and the bill (issue 12), against the NVML double: the process table, the GPU
chooser, energy per cell, cost and the idle alert on the GPU path."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from watch_helpers import wait_for
from watch_nvml_double import MIB, gpu

from gpumagic.monitor import Watcher, watch
from gpumagic.monitor import choose as choose_mod
from gpumagic.monitor.cells import CellMarks
from gpumagic.monitor.choose import select_gpus
from gpumagic.monitor.cost import CostMeter
from gpumagic.monitor.devices import WatchedDevice
from gpumagic.monitor.processes import NOT_IN_NAMESPACE

GIB = 1024**3
WH_MJ = 3.6e6  # one watt-hour in millijoules


def _absent_pid() -> int:
    pid = 4_000_000
    while psutil.pid_exists(pid):
        pid -= 1
    return pid


@pytest.fixture
def other_process() -> Iterator[subprocess.Popen[bytes]]:
    """A real second process whose command line carries HTML, as a shared box's neighbour."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "<b>neighbour</b>"]
    )
    yield proc
    proc.kill()
    proc.wait()


# -- who is on the GPU ---------------------------------------------------------------------
def test_process_table_lists_pid_user_memory_command_with_this_kernel_marked(
    fake_nvml: Any, other_process: subprocess.Popen[bytes]
) -> None:
    me = os.getpid()
    fake_nvml(
        [
            gpu("A", "GPU-a", procs=[(me, 700 * MIB), (other_process.pid, 300 * MIB)]),
            gpu("B", "GPU-b", procs=[(other_process.pid, 2 * GIB)]),
        ]
    )
    w = Watcher(cells=False)
    status = w.status()
    frame = status.processes
    assert list(frame.columns) == [
        "device", "index", "cuda_index", "pid", "user", "gpu_memory", "command", "this_kernel", "note"
    ]
    assert list(zip(frame["device"], frame["pid"], frame["gpu_memory"])) == [
        ("cuda:0", me, 700 * MIB),
        ("cuda:0", other_process.pid, 300 * MIB),
        ("cuda:1", other_process.pid, 2 * GIB),
    ]
    assert list(frame["this_kernel"]) == [True, False, False]
    user = psutil.Process().username()
    assert set(frame["user"]) == {user}
    theirs = frame[frame["pid"] == other_process.pid]["command"].iloc[0]
    assert "time.sleep(60)" in theirs and "<b>neighbour</b>" in theirs
    assert frame["note"].eq("").all()
    text = str(status)
    assert "compute processes on the watched GPUs now: 3" in text and "this kernel" in text
    html = status._repr_mimebundle_()["text/html"]
    assert "&lt;b&gt;neighbour&lt;/b&gt;" in html and "<b>neighbour</b>" not in html
    assert str(other_process.pid) in html and "700 MiB" in html


def test_process_table_inside_a_container_keeps_memory_and_says_why(fake_nvml: Any) -> None:
    # NVML lists host PIDs; inside a container's PID namespace they name no process here.
    host_a, host_b = _absent_pid(), _absent_pid() - 1
    fake_nvml([gpu(procs=[(host_a, 3 * GIB), (host_b, 512 * MIB)])])
    w = Watcher(cells=False)
    frame = w.status().processes
    assert list(frame["gpu_memory"]) == [3 * GIB, 512 * MIB]
    assert frame["user"].isna().all() and frame["command"].isna().all()
    assert (frame["note"] == NOT_IN_NAMESPACE).all()
    assert not frame["this_kernel"].any()
    status = w.status()
    notes = status.snapshot.processes.notes if status.snapshot.processes else []
    assert any("host PIDs" in n and "2 of them" in n and "GPU memory" in n for n in notes)
    text = str(status)
    assert "3.0 GiB" in text and "not in this PID namespace" in text and "host PIDs" in text


def test_process_table_falls_back_to_the_v2_struct(fake_nvml: Any) -> None:
    fake = fake_nvml(
        [gpu(procs=[(os.getpid(), 64 * MIB)], missing={"nvmlDeviceGetComputeRunningProcesses"})]
    )
    frame = Watcher(cells=False).status().processes
    assert list(frame["pid"]) == [os.getpid()] and frame["this_kernel"].all()
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] >= 1


def test_stop_summary_lists_the_processes_at_the_stop(fake_nvml: Any) -> None:
    fake_nvml([gpu(procs=[(os.getpid(), 128 * MIB)])])
    result = watch(interval=0.1, cells=False).stop()
    assert list(result.processes["pid"]) == [os.getpid()]
    assert "compute processes on the watched GPUs at the stop: 1" in str(result)
    assert "at the stop" in result._repr_mimebundle_()["text/html"]


def test_host_path_has_an_empty_process_frame(fake_nvml: Any) -> None:
    fake_nvml([])
    status = Watcher(cells=False).status()
    assert status.processes.empty and "compute processes" not in str(status)


# -- energy per cell -------------------------------------------------------------------------
def test_energy_is_spread_over_the_cells_of_each_interval() -> None:
    marks = CellMarks()
    a = marks.open("a", 1, start=100.0)
    marks.close(1, True, end=103.0)
    b = marks.open("b", 2, start=103.0)
    marks.close(2, True, end=104.0)
    # 4 s interval [100, 104], 4 Wh at constant power: a gets 3 Wh, b 1 Wh.
    marks.add_energy(100.0, 104.0, 4 * WH_MJ)
    assert a.energy_mj == pytest.approx(3 * WH_MJ) and b.energy_mj == pytest.approx(WH_MJ)
    c = marks.open("c", 3, start=104.5)
    marks.add_energy(104.0, 106.0, 2 * WH_MJ)  # c covers 1.5 s of 2 s, still running
    assert c.energy_mj == pytest.approx(1.5 * WH_MJ)
    assert b.energy_mj == pytest.approx(WH_MJ)  # ended before the interval: nothing more
    assert marks.busy_seconds(104.0, 106.0) == pytest.approx(1.5)
    assert marks.busy_seconds(100.0, 104.0) == pytest.approx(4.0)
    assert marks.last_end() == 104.0


def test_energy_per_cell_from_the_total_energy_counter(fake_nvml: Any) -> None:
    fake = fake_nvml([gpu("A", "GPU-a", energy_mj=50_000_000), gpu("B", "GPU-b", energy_mj=10)])
    w = Watcher(cells=False)
    w.marks.open("train()", 7, start=time.time() - 5)
    w.sample_now()
    fake.gpus[0]["energy_mj"] += WH_MJ  # 1 Wh on A, 0.5 Wh on B, both inside the cell
    fake.gpus[1]["energy_mj"] += WH_MJ / 2
    w.sample_now()
    w.marks.close(7, True)
    w.sample_now()  # no energy after the cell
    result = w.stop()
    cell = result.cells.iloc[0]
    assert cell["energy_wh"] == pytest.approx(1.5)
    assert result.cost is not None and result.cost.energy_wh == pytest.approx(1.5)
    assert "1.50 Wh" in str(result)
    assert not any("energy" in n for n in result.notes)


def test_energy_not_supported_is_missing_with_a_note(fake_nvml: Any) -> None:
    fake_nvml([gpu(unsupported={"nvmlDeviceGetTotalEnergyConsumption"})])
    w = Watcher(cells=False)
    w.marks.open("x", 1, start=time.time() - 1)
    w.sample_now()
    w.sample_now()
    w.marks.close(1, True)
    result = w.stop()
    assert math.isnan(result.cells.iloc[0]["energy_wh"])
    assert any("energy per cell not available" in n and "Volta" in n for n in result.notes)


# -- cost and the idle alert on the GPU path -------------------------------------------------
def test_price_and_idle_share_on_the_gpu_path(fake_nvml: Any) -> None:
    fake = fake_nvml([gpu(util=0), gpu("B", "GPU-b", util=0)])
    w = Watcher(interval=1.0, cells=False, price=7.2)
    w.sample_now()
    time.sleep(0.2)
    w.sample_now()  # idle interval (both below 5%)
    fake.gpus[1]["util"] = 80
    time.sleep(0.2)
    w.sample_now()  # busy interval
    cost = w.result().cost
    assert cost is not None
    assert cost.metered_s == pytest.approx(cost.idle_s * 2, rel=0.3)
    assert cost.total_usd == pytest.approx(7.2 * cost.metered_s / 3600)
    assert cost.idle_usd == pytest.approx(7.2 * cost.idle_s / 3600)
    assert 0.3 < cost.idle_share < 0.7
    text = str(w.stop())
    assert "at $7.20/h" in text and "while idle" in text and "below 5% utilisation" in text


def test_idle_alert_needs_idle_gpus_and_this_kernels_memory(fake_nvml: Any) -> None:
    fake = fake_nvml([gpu(util=1, procs=[(os.getpid(), 900 * MIB)]), gpu("B", "GPU-b", util=0)])
    fired: list[Any] = []
    w = watch(interval=0.1, cells=False, price=2.5, idle_alert=0.3, on_idle=fired.append)
    assert wait_for(lambda: bool(fired), 3.0)
    alerts = [a for a in w.status().alerts if a.kind == "idle"]
    assert len(alerts) == 1 and "the instance is idle and costing $2.50/h" in alerts[0].message
    assert "while this kernel holds GPU memory" in alerts[0].message
    time.sleep(0.3)
    assert len(fired) == 1  # once per idle stretch, not per sample
    fake.gpus[0]["util"] = 60
    n = w.samples_taken
    assert wait_for(lambda: w.samples_taken >= n + 2, 3.0)
    assert not [a for a in w.status().alerts if a.kind == "idle"]
    result = w.stop()
    assert any(a.kind == "idle" for a, _, _ in result.alerts)  # seen, in the summary
    assert "costing $2.50/h" in str(result)


def test_no_idle_alert_when_this_kernel_holds_no_gpu_memory(fake_nvml: Any) -> None:
    fake_nvml([gpu(util=0, procs=[(os.getpid() + 1, 900 * MIB)])])
    fired: list[Any] = []
    w = watch(interval=0.1, cells=False, idle_alert=0.2, on_idle=fired.append)
    time.sleep(0.6)
    assert not fired and not [a for a in w.status().alerts if a.kind == "idle"]
    w.stop()


def test_a_failing_on_idle_callback_becomes_a_note() -> None:
    devices = (WatchedDevice("host", "h"),)

    def boom(alert: Any) -> None:
        raise RuntimeError("pager down")

    meter = CostMeter(devices, None, 0.5, on_idle=boom)
    marks = CellMarks()
    for t in (10.0, 10.3, 10.6):
        meter.sample(t, marks, None, False, None)  # the host's row tells the meter nothing
    assert meter.alert is not None and meter.callback_error is not None
    assert "pager down" in meter.callback_error


# -- choosing GPUs -------------------------------------------------------------------------
@pytest.fixture
def clean_choice(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        # set first: delenv of a variable that is not set records nothing to undo, and
        # select_gpus sets both, which would then leak into the tests after (tests/check's)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(choose_mod, "_before_first", None)
    yield


def _box(**overrides: dict[str, Any]) -> list[dict[str, Any]]:
    gpus = [
        gpu("H100", "GPU-0000", mem_used=1 * GIB, mem_total=80 * GIB, util=0),
        gpu("H100", "GPU-1111", mem_used=2 * GIB, mem_total=80 * GIB, util=0),
        gpu("H100", "GPU-2222", mem_used=1 * GIB, mem_total=80 * GIB, util=0),
        gpu("H100", "GPU-3333", mem_used=1 * GIB, mem_total=80 * GIB, util=0),
    ]
    for index, values in overrides.items():
        gpus[int(index.removeprefix("g"))].update(values)
    return gpus


def test_select_by_free_memory_and_sets_the_environment(fake_nvml: Any, clean_choice: None) -> None:
    fake_nvml(_box(g0={"mem_used": 60 * GIB}, g2={"mem_used": 40 * GIB}, g3={"mem_used": 10 * GIB}))
    choice = select_gpus(2, sample_s=0)
    assert choice.indices == [1, 3]  # 78 and 70 GiB free
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert choice.uuids == ["GPU-1111", "GPU-3333"]
    table = choice.table
    assert list(table["chosen"]) == [False, True, False, True]
    text = str(choice)
    assert "CUDA_VISIBLE_DEVICES=1,3" in text and "chosen: cuda:0" in text and "chosen: cuda:1" in text


def test_select_by_utilisation(fake_nvml: Any, clean_choice: None) -> None:
    fake_nvml(_box(g0={"util": 90}, g1={"util": 95, "mem_used": 0}, g2={"util": 40}, g3={"util": 3}))
    choice = select_gpus(1, sample_s=0)
    # same free memory to the GiB for 0, 2, 3 (1 has more but all four are eligible): the
    # ranking is by free memory first, so GPU 1 wins without a cap...
    assert choice.indices == [1]
    capped = select_gpus(2, max_gpu_utilization=50, sample_s=0, apply=False)
    assert capped.indices == [3, 2]  # lower utilisation first among equal memory
    why = dict(zip(capped.table["index"], capped.table["why_not"]))
    assert "busy" in why[0] and "busy" in why[1]


def test_select_avoids_other_users_processes(
    fake_nvml: Any, clean_choice: None, other_process: subprocess.Popen[bytes]
) -> None:
    # GPU 1 has the most free memory but someone else's process: a GPU nobody uses ranks first.
    fake_nvml(_box(g1={"mem_used": 0, "procs": [(other_process.pid, 512 * MIB)]}))
    choice = select_gpus(1, sample_s=0, apply=False)
    assert choice.indices == [3]  # among the free ones the highest index: GPU 0 is everyone's default
    assert select_gpus(4, sample_s=0, apply=False).indices == [3, 2, 0, 1]
    with pytest.raises(ValueError, match=r"3 of 4 GPU\(s\) qualify \(no other process\), 4 wanted"):
        select_gpus(4, no_others=True, sample_s=0)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # nothing was changed
    user = psutil.Process().username()
    row = choice.table.set_index("index").loc[1]
    assert row["other_processes"] == 1 and row["users"] == user and row["other_memory"] == 512 * MIB
    assert "1: " + user in str(choice)


def test_select_with_min_free_and_too_few_gpus_changes_nothing(
    fake_nvml: Any, clean_choice: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvml(_box(g0={"mem_used": 75 * GIB}, g1={"mem_used": 79 * GIB}, g2={"mem_used": 70 * GIB}, g3={"mem_used": 78 * GIB}))
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    before = dict(os.environ)
    with pytest.raises(ValueError, match=r"1 of 4 GPU\(s\) qualify \(at least 8.0 GiB free\), 2 wanted") as err:
        select_gpus(2, min_free_memory="8GiB", sample_s=0)
    assert "GPU 1: 1.0 GiB free < 8.0 GiB" in str(err.value) and "Nothing was changed" in str(err.value)
    assert dict(os.environ) == before
    assert select_gpus(1, min_free_memory=8 * GIB, sample_s=0).indices == [2]


def test_select_within_the_visible_gpus_and_again_among_the_same(
    fake_nvml: Any, clean_choice: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvml(_box(g1={"mem_used": 0}, g2={"mem_used": 5 * GIB}, g3={"mem_used": 3 * GIB}))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # a scheduler gave this job GPUs 2 and 3
    first = select_gpus(1, sample_s=0)
    assert first.indices == [3] and [c.index for c in first.candidates] == [2, 3]
    # The second choice picks among the scheduler's two again, not among the one left visible.
    second = select_gpus(2, sample_s=0)
    assert second.indices == [3, 2] and os.environ["CUDA_VISIBLE_DEVICES"] == "3,2"


def test_select_refuses_once_cuda_is_initialised(
    fake_nvml: Any, clean_choice: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    fake_nvml(_box())
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    before = dict(os.environ)
    with pytest.raises(ValueError, match=r"already initialised.*restart the kernel"):
        select_gpus(1, sample_s=0)
    assert dict(os.environ) == before


def test_select_skips_mig_gpus_and_says_so(fake_nvml: Any, clean_choice: None) -> None:
    fake_nvml(_box(g3={"mig_mode": 1}, g0={"mem_used": 0}))
    choice = select_gpus(1, sample_s=0, apply=False)
    assert choice.indices == [0]
    assert "MIG mode" in choice.table.set_index("index").loc[3, "why_not"]


def test_select_without_nvml_is_a_value_error(fake_nvml: Any, clean_choice: None) -> None:
    import pynvml

    fake_nvml([gpu()], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(ValueError, match="no NVIDIA GPU to choose from: NVML unavailable"):
        select_gpus()
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_on_a_mig_instance_processes_are_its_own_and_energy_is_not_claimed(
    fake_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_watch_nvml_paths import MIG_A, mig_board

    fake_nvml([mig_board(energy_mj=10**9)])
    monkeypatch.setattr("gpumagic.monitor.nvml.torch_visible_uuids", lambda: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG_A)
    w = Watcher(cells=False, price=1.0)
    w.sample_now()
    status = w.status()
    frame = status.processes
    assert list(zip(frame["pid"], frame["gpu_memory"])) == [(os.getpid(), 3 * GIB)]
    assert frame["this_kernel"].all()
    assert any("MIG instances share their board's energy counter" in n for n in status.notes)
    time.sleep(0.05)
    w.sample_now()
    cost = w.stop().cost
    # NVML has no utilisation for a MIG instance: the time is neither idle nor busy.
    assert cost is not None and cost.idle_s == 0 and cost.unknown_s == pytest.approx(cost.metered_s)


def test_gpuselect_magic_shows_the_choice_once_and_returns_it(
    fake_nvml: Any, clean_choice: None, run: Any, ip: Any
) -> None:
    from gpumagic.monitor.choose import GpuChoice

    fake_nvml(_box(g2={"mem_used": 0}))
    r = run("choice = %gpuselect 1 --max-gpu-utilization 50%")
    assert r.result.success, r.result.error_in_exec
    choice = ip.user_ns["choice"]
    assert isinstance(choice, GpuChoice) and choice.indices == [2]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2" and os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert r.bundles == [] and "Out[" not in r.stdout  # assigned: not shown
    r = run("%gpuselect 2")
    assert r.result.success and r.stdout.count(f"Out[{r.result.execution_count}]") == 1
    assert "CUDA_VISIBLE_DEVICES=2,3" in r.stdout  # among the same four GPUs again
    html = r.result.result._repr_mimebundle_()["text/html"]
    assert "gpumagic" in html and "chosen: cuda:0" in html
