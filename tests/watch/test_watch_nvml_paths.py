"""The watcher's CUDA and NVML paths (issue 9), against the NVML double and the torch.cuda double
(tests/cuda_double.py): NVML lists a process only once it has a CUDA context; a MIG instance is
watched as a device of its own; "used" memory is NVML's v2 figure in the env report and the
watcher alike; SwPowerCap (normal at full load) raises no alert; temperature falls back to
nvmlDeviceGetTemperatureV; a cell's utilisation is that of the GPUs this process uses."""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np
import pytest
import torch
from cuda_double import FakeCuda
from watch_nvml_double import MIB, gpu, mig

from gpumagic.monitor import Watcher
from gpumagic.monitor import metrics as M
from gpumagic.monitor.alerts import compute_alerts
from gpumagic.monitor.cells import CellRecord
from gpumagic.monitor.nvml import cuda_devices_in_use, cuda_in_use

GIB = 1024 * MIB
MIG_A = "MIG-1a2b3c4d-0000-5000-8000-00000000000a"
MIG_B = "MIG-2b3c4d5e-0000-5000-8000-00000000000b"


def latest(w: Watcher, row: int, key: str) -> float:
    last = w._ring.last()
    assert last is not None
    return float(last[1][row, M.INDEX[key]])


def _idle_cell_alerts(w: Watcher) -> list[str]:
    """Alerts for a pandas cell running 12 s on an idle GPU while the latest sample repeats."""
    snap = w.snapshot()
    times = np.arange(13.0) + 1000.0
    values = np.repeat(snap.values[-1:], 13, axis=0)
    cell = CellRecord(execution_count=7, source="df.groupby('k').sum()", start=1000.0)
    return [a.message for a in compute_alerts(snap.devices, times, values, cell, cuda_in_use())]


# -- "uses CUDA" means a CUDA context exists: torch's _lazy_init makes none, NVML lists none -----
@pytest.mark.parametrize("others", [[(999_999, 10 * GIB)], []])
def test_initialised_torch_without_a_context_is_not_using_the_gpu(
    fake_nvml: Any, monkeypatch: pytest.MonkeyPatch, others: list[tuple[int, int]]
) -> None:
    fake_nvml([gpu(util=0, procs=others)])
    cuda = FakeCuda(monkeypatch)
    monkeypatch.setattr("gpumagic.monitor.nvml.torch_visible_uuids", lambda: None)
    cuda.initialized = True  # %gpuenv or %%memtrace ran _lazy_init: no context was made
    w = Watcher(interval=0.1, cells=False)
    w.sample_now()
    assert not cuda_in_use() and cuda.calls["_cuda_hasPrimaryContext"] > 0
    assert latest(w, 0, "process_memory_used") == 0  # really nothing, not "unknown"
    assert not any("PID namespace" in n for n in w.notes())
    assert _idle_cell_alerts(w) == []  # the promise in alerts.py: a pandas cell raises nothing
    # Once torch made a context (a tensor on the GPU) and NVML still lists no such pid
    # (a container's PID namespace), the memory is unknown and a long idle cell is news.
    cuda.contexts.add(0)
    w.sample_now()
    assert cuda_in_use()
    assert math.isnan(latest(w, 0, "process_memory_used"))
    assert any("PID namespace" in n for n in w.notes()) == bool(others)
    assert [m.split(" while")[0] for m in _idle_cell_alerts(w)] == ["GPU 0 busy 0.0%"]


def test_context_from_reserved_memory_where_torch_lacks_has_primary_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cuda = FakeCuda(monkeypatch, devices=2)
    monkeypatch.delattr(torch._C, "_cuda_hasPrimaryContext")
    assert cuda_devices_in_use() == set()  # not initialised: nothing is asked
    cuda.initialized = True
    assert cuda_devices_in_use() == set()  # initialised, nothing reserved
    cuda.allocate(2 * MIB)
    assert cuda_devices_in_use() == {0, 1}  # the double's counters are the same on both
    assert cuda.init_attempts == []


# -- MIG: CUDA exposes an instance, not the board; NVML has no utilisation per instance ----
def mig_board(**values: Any) -> dict[str, Any]:
    """An H100 in MIG mode: the board's memory is every tenant's; utilisation NOT_SUPPORTED."""
    return gpu(
        "NVIDIA H100 80GB HBM3",
        "GPU-aaaa0000-0000-0000-0000-000000000000",
        mem_used=75 * GIB,
        mem_total=80 * GIB,
        unsupported={"nvmlDeviceGetUtilizationRates"},
        mig_mode=1,
        mig_slots=[
            mig("NVIDIA H100 80GB HBM3 MIG 3g.40gb", MIG_A, mem_used=5 * GIB, mem_total=40 * GIB,
                procs=[(os.getpid(), 3 * GIB)], unsupported={"nvmlDeviceGetUtilizationRates"}),
            None,  # an empty slot: NOT_FOUND
            mig("NVIDIA H100 80GB HBM3 MIG 1g.10gb", MIG_B, mem_used=int(9.5 * GIB),
                mem_total=10 * GIB, unsupported={"nvmlDeviceGetUtilizationRates"}),
        ],
        **values,
    )


def test_mig_instance_in_visible_devices_is_watched_as_itself(
    fake_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_nvml([mig_board()])
    monkeypatch.setattr("gpumagic.monitor.nvml.torch_visible_uuids", lambda: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG_A)
    w = Watcher(cells=False)
    assert w.reason is None
    (device,) = [d for d in w.devices if d.kind == "cuda"]
    assert (device.key, device.label, device.name, device.uuid) == (
        "cuda:0",
        "cuda:0 (GPU 0 MIG 0)",
        "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
        MIG_A,
    )
    w.sample_now()
    assert latest(w, 0, "memory_used") == 5 * GIB and latest(w, 0, "memory_total") == 40 * GIB
    assert latest(w, 0, "process_memory_used") == 3 * GIB  # from the instance's process list
    assert math.isnan(latest(w, 0, "utilization_gpu"))
    assert latest(w, 0, "temperature") == 60  # the board's sensor
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 0  # not asked: there is none
    asked = {(fn, h) for fn, h in fake.handles_asked}
    assert ("nvmlDeviceGetMemoryInfo", (0, 0)) in asked and ("nvmlDeviceGetMemoryInfo", 0) not in asked
    assert ("nvmlDeviceGetTemperature", 0) in asked
    notes = " | ".join(w.notes())
    assert "hides every GPU" not in notes and "not watched" not in notes
    assert "utilisation is not available per MIG instance" in notes
    assert "utilization not supported (not available per MIG instance (NVML))" in notes
    assert w.status().alerts == []  # the board is 94% full, this instance is not
    # a prefix of the instance's UUID selects it too, as for GPU- UUIDs
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG_B[:12])
    w = Watcher(cells=False)
    w.sample_now()
    assert [d.mig_index for d in w.devices if d.kind == "cuda"] == [2]
    assert [(a.kind, a.device) for a in w.status().alerts] == [("memory", "cuda:0")]


def test_mig_mode_without_visible_devices_watches_each_instance_not_the_board(
    fake_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_nvml([mig_board(), gpu("NVIDIA H100 80GB HBM3", "GPU-bbbb")])
    monkeypatch.setattr("gpumagic.monitor.nvml.torch_visible_uuids", lambda: None)
    w = Watcher(cells=False)
    gpus = [d for d in w.devices if d.kind == "cuda"]
    assert [(d.key, d.nvml_index, d.mig_index) for d in gpus] == [
        ("cuda:0", 0, 0),
        ("cuda:1", 0, 2),
        ("cuda:2", 1, None),
    ]
    w.sample_now()
    assert [latest(w, r, "memory_total") for r in range(3)] == [40 * GIB, 10 * GIB, 16000 * MIB]
    assert ("nvmlDeviceGetMemoryInfo", 0) not in fake.handles_asked  # never the whole board
    assert latest(w, 2, "utilization_gpu") == 50  # the whole GPU beside it as before
    assert any("CUDA enumerates one MIG instance per process" in n for n in w.notes())


def test_torch_uuid_of_a_mig_instance_maps_to_it(
    fake_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvml([mig_board()])
    # torch prints a MIG device's UUID bare; gpumagic prefixes "GPU-" (torch_visible_uuids)
    monkeypatch.setattr(
        "gpumagic.monitor.nvml.torch_visible_uuids", lambda: ["GPU-" + MIG_B.removeprefix("MIG-")]
    )
    w = Watcher(cells=False)
    assert [(d.key, d.mig_index) for d in w.devices if d.kind == "cuda"] == [("cuda:0", 2)]


def test_a_mig_entry_nvml_does_not_list_is_not_called_hiding(
    fake_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvml([gpu()])
    monkeypatch.setattr("gpumagic.monitor.nvml.torch_visible_uuids", lambda: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG_A)
    w = Watcher(cells=False)
    assert w.reason is not None and "hides every GPU" not in w.reason
    assert "names no device NVML lists here" in w.reason
    assert any(MIG_A in n and "matches no device" in n for n in w.notes())


# -- one meaning of "used": NVML's v2 memory struct, without the driver's reserved memory -----
def test_env_report_and_watcher_show_the_same_used_memory(fake_nvml: Any) -> None:
    from gpumagic.environment.collect import read_nvml

    fake = fake_nvml([gpu(mem_used=0, mem_reserved=538 * MIB, mem_total=143771 * MIB)])
    w = Watcher(cells=False)
    w.sample_now()
    watched = latest(w, 0, "memory_used")
    (reported,) = read_nvml().gpus
    assert watched == reported.used_memory == 0  # nvidia-smi's "0MiB" on an idle H200
    assert reported.total_memory == 143771 * MIB
    assert fake.initialised == 1  # %gpuenv's init/shutdown pair left the watcher's init alone
    fake.nvmlMemory_v2 = None  # an nvidia-ml-py without the v2 struct: v1 for both
    assert read_nvml().gpus[0].used_memory == 538 * MIB


# -- SwPowerCap at full load, the deprecated temperature call, whose utilisation a cell shows --
def test_sw_power_cap_at_full_load_is_no_alert(fake_nvml: Any) -> None:
    fake = fake_nvml([gpu(util=100, throttle=0x4)])
    w = Watcher(cells=False)
    w.sample_now()
    status = w.status()
    assert status.alerts == []
    assert status["cuda:0"]["throttle"] == ["sw_power_cap"]  # still shown as what it is
    for mask, kind, name in (
        (0x4 | 0x40, "thermal", "hw_thermal_slowdown"),
        (0x4 | 0x20, "thermal", "sw_thermal_slowdown"),
        (0x4 | 0x80, "power", "hw_power_brake_slowdown"),
        (0x8, "slowdown", "hw_slowdown"),
    ):
        fake.gpus[0]["throttle"] = mask
        w.sample_now()
        (alert,) = w.status().alerts
        assert alert.kind == kind and name in alert.message and "sw_power_cap" not in alert.message


def test_temperature_falls_back_to_the_v_call_once_the_old_symbol_is_gone(
    fake_nvml: Any,
) -> None:
    fake = fake_nvml([gpu(temp=71, missing={"nvmlDeviceGetTemperature"})])
    w = Watcher(cells=False)
    for _ in range(3):
        w.sample_now()
    assert latest(w, 0, "temperature") == 71
    assert fake.calls["nvmlDeviceGetTemperature"] == 1  # gone: not asked again
    assert fake.calls["nvmlDeviceGetTemperatureV"] == 3
    assert not any("temperature" in n for n in w.notes())
    fake = fake_nvml([gpu(temp=72)])
    fake.nvmlDeviceGetTemperature = None  # an nvidia-ml-py that dropped it
    w = Watcher(cells=False)
    w.sample_now()
    assert latest(w, 0, "temperature") == 72
    fake = fake_nvml([gpu(unsupported={"nvmlDeviceGetTemperature"})])  # no sensor: a note
    w = Watcher(cells=False)
    w.sample_now()
    assert fake.calls["nvmlDeviceGetTemperatureV"] == 0
    assert any("temperature not supported" in n for n in w.notes())


def _cell_row(w: Watcher, fake: Any) -> Any:
    w.marks.open("train()", 3, start=time.time() - 1)
    for _ in range(3):
        w.sample_now()
    w.marks.close(3, True)
    w.sample_now()
    return w.stop().cells.iloc[-1]


def test_cell_utilisation_is_of_this_processes_gpus_not_the_busiest(
    fake_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    two = [
        gpu("mine", "GPU-a", util=5, procs=[(os.getpid(), 900 * MIB)]),
        gpu("someone else's", "GPU-b", util=99, procs=[(999_999, 70 * GIB)]),
    ]
    fake = fake_nvml(two)
    row = _cell_row(Watcher(cells=False), fake)
    assert row["peak_utilization"] == 5 and row["mean_utilization"] == 5
    assert row["utilization_of"] == "cuda:0"
    # this process on no GPU NVML can tell: the busiest GPU, and it says so
    fake.gpus[0]["procs"] = []
    row = _cell_row(Watcher(cells=False), fake)
    assert row["peak_utilization"] == 99 and row["utilization_of"] == "busiest GPU"
    # a container's PID namespace: NVML lists no pid of ours; the context torch holds tells
    cuda = FakeCuda(monkeypatch, devices=2)
    cuda.initialized, cuda.contexts = True, {1}
    fake.gpus[1]["procs"] = [(999_999, 70 * GIB)]
    row = _cell_row(Watcher(cells=False), fake)
    assert row["peak_utilization"] == 99 and row["utilization_of"] == "cuda:1"


def test_the_cell_table_names_whose_utilisation_it_shows(fake_nvml: Any) -> None:
    fake = fake_nvml(
        [
            gpu("mine", "GPU-a", util=5, procs=[(os.getpid(), 900 * MIB)]),
            gpu("someone else's", "GPU-b", util=99),
        ]
    )
    w = Watcher(cells=False)
    _cell_row(w, fake)
    html = w.result()._repr_mimebundle_()["text/html"]
    assert "5.0% (cuda:0)" in html
