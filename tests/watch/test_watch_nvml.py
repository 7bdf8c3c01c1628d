"""NVML error handling and device mapping, against a double of the pynvml functions."""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np
import pynvml
import pytest
from watch_helpers import wait_for
from watch_nvml_double import MIB, gpu

from gpumagic.monitor import Watcher, machine_sources, watch
from gpumagic.monitor import metrics as M
from gpumagic.monitor.devices import parse_visible_devices
from gpumagic.monitor.nvml import describe_init_error

UUIDS = ["GPU-aaaa1111", "GPU-bbbb2222", "GPU-cccc3333", "GPU-dddd4444"]


def four_gpus() -> list[dict[str, Any]]:
    return [gpu(f"Fake {i}", u) for i, u in enumerate(UUIDS)]


def latest(w: Watcher, row: int, key: str) -> float:
    last = w._ring.last()
    assert last is not None
    return float(last[1][row, M.INDEX[key]])


def test_all_metrics_are_read(fake_nvml: Any) -> None:
    fake_nvml(
        [
            gpu(
                "Fake A",
                "GPU-aaaa",
                util=71,
                mem_util=33,
                mem_used=3 * 1024 * MIB,
                mem_total=16 * 1024 * MIB,
                temp=66,
                power_mw=250_500,
                limit_mw=300_000,
                sm=1710,
                mem_clock=9501,
                throttle=0x4,
                procs=[(os.getpid(), 700 * MIB), (os.getpid() + 1, 5 * MIB)],
            )
        ]
    )
    w = Watcher(cells=False)
    w.sample_now()
    entry = w.status()["cuda:0"]
    assert entry["utilization_gpu"] == 71 and entry["utilization_memory"] == 33
    assert entry["memory_used"] == 3 * 1024**3 and entry["memory_total"] == 16 * 1024**3
    assert entry["temperature"] == 66
    assert entry["power_draw"] == pytest.approx(250.5) and entry["power_limit"] == 300.0
    assert (entry["clock_sm"], entry["clock_mem"]) == (1710, 9501)
    assert entry["throttle"] == ["sw_power_cap"]
    assert entry["process_memory_used"] == 700 * MIB  # only this pid's share
    assert w.devices[0].name == "Fake A" and w.devices[0].uuid == "GPU-aaaa"  # bytes decoded


def test_pcie_throughput_is_never_sampled(fake_nvml: Any) -> None:
    fake = fake_nvml([gpu()])
    w = Watcher(cells=False)
    for _ in range(3):
        w.sample_now()
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0


def test_not_supported_metric_is_missing_and_not_retried(fake_nvml: Any) -> None:
    fake = fake_nvml([gpu(unsupported={"nvmlDeviceGetPowerUsage"})])
    w = watch(interval=0.1, cells=False)
    assert wait_for(lambda: w.samples_taken >= 4, 3.0)
    result = w.stop()
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1  # asked once, remembered
    frame = result.samples[result.samples["device"] == "cuda:0"]
    assert frame["power_draw"].isna().all()
    assert (frame["utilization_gpu"] == 50).all() and (frame["temperature"] == 60).all()
    assert any("power.draw not supported" in n for n in result.notes)


def test_gpu_lost_mid_run_keeps_sampling_the_rest(fake_nvml: Any) -> None:
    fake = fake_nvml([gpu("Fake A", "GPU-aaaa"), gpu("Fake B", "GPU-bbbb")])
    w = watch(interval=0.1, cells=False)
    assert wait_for(lambda: w.samples_taken >= 2, 3.0)
    fake.gpus[0]["lost"] = True
    n = w.samples_taken
    assert wait_for(lambda: w.samples_taken >= n + 4, 3.0)
    calls_after = fake.calls["nvmlDeviceGetUtilizationRates"]
    time.sleep(0.25)
    assert w.running
    assert math.isnan(latest(w, 0, "utilization_gpu"))  # missing for the lost GPU
    assert latest(w, 1, "utilization_gpu") == 50  # the other GPU goes on
    assert not math.isnan(latest(w, 2, "host_memory_total"))  # and the host
    # The lost GPU is not asked again: only GPU B's utilisation calls grow.
    grown = fake.calls["nvmlDeviceGetUtilizationRates"] - calls_after
    assert 0 < grown <= w.samples_taken - n
    assert any("GPU 0 lost" in note for note in w.notes())
    w.stop()


def test_transient_error_is_missing_for_one_sample(fake_nvml: Any) -> None:
    fake = fake_nvml([gpu()])
    w = Watcher(cells=False)
    w.sample_now()
    fake.gpus[0]["transient"].add("nvmlDeviceGetTemperature")
    w.sample_now()
    assert math.isnan(latest(w, 0, "temperature")) and latest(w, 0, "utilization_gpu") == 50
    w.sample_now()
    assert latest(w, 0, "temperature") == 60
    assert w.sources[0].readers[0].errors == 1
    assert any("1 failed NVML call" in n and "nvmlDeviceGetTemperature" in n for n in w.notes())


def test_older_driver_fallbacks(fake_nvml: Any) -> None:
    fake = fake_nvml([gpu(throttle=0x40, missing={"nvmlDeviceGetCurrentClocksEventReasons"})])
    w = Watcher(cells=False)
    w.sample_now()
    w.sample_now()
    assert latest(w, 0, "throttle_reasons") == 0x40
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2


def test_process_list_v2_fallback_on_older_drivers(fake_nvml: Any) -> None:
    fake = fake_nvml(
        [gpu(procs=[(os.getpid(), 256 * MIB)], missing={"nvmlDeviceGetComputeRunningProcesses"})]
    )
    w = Watcher(cells=False)
    w.sample_now()
    w.sample_now()
    assert latest(w, 0, "process_memory_used") == 256 * MIB
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 1
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 2
    assert not any("process" in n for n in w.notes())  # a fallback that works is not news


def test_memory_v1_fallback_when_v2_signature_is_missing(
    fake_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_nvml([gpu(mem_used=1234 * MIB)])

    def v1_only(h: int) -> Any:  # an nvidia-ml-py without the version argument
        return type(fake).nvmlDeviceGetMemoryInfo(fake, h)

    monkeypatch.setattr(fake, "nvmlDeviceGetMemoryInfo", v1_only)
    w = Watcher(cells=False)
    w.sample_now()
    w.sample_now()
    assert latest(w, 0, "memory_used") == 1234 * MIB


def test_init_failures_become_one_line_reasons(fake_nvml: Any) -> None:
    fake_nvml([gpu()], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    w = Watcher(cells=False)
    assert w.reason == "NVML unavailable: the NVIDIA driver is not loaded"
    assert [d.kind for d in w.devices] == ["host"]
    reason = describe_init_error(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    assert "not found (no NVIDIA driver)" in reason


def test_no_gpu_at_all(fake_nvml: Any) -> None:
    fake_nvml([])
    w = Watcher(cells=False)
    assert w.reason == "NVML found no NVIDIA GPU"


def test_nvml_init_once_per_process(fake_nvml: Any) -> None:
    fake = fake_nvml([gpu()])
    for _ in range(3):
        Watcher(cells=False).stop()
    assert fake.calls["nvmlInit"] == 1
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 1  # handles cached too


# -- CUDA_VISIBLE_DEVICES -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (None, [0, 1, 2, 3]),
        ("2,0", [2, 0]),
        (" 3 , 1 ", [3, 1]),
        ("GPU-cccc", [2]),  # a UUID prefix, as CUDA accepts
        ("GPU-bbbb2222,GPU-aaaa", [1, 0]),
        ("1,9,2", [1]),  # CUDA stops at the first entry that names no device
        ("-1", []),
        ("", []),
        ("GPU-", []),  # ambiguous prefix
    ],
)
def test_parse_visible_devices(env: str | None, expected: list[int]) -> None:
    order, _ = parse_visible_devices(env, UUIDS)
    assert order == expected


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # a repeated entry anywhere before the list ends: torch/CUDA expose nothing at all
        ("0,0", []),
        ("1,0,1", []),
        ("1,9,1", []),  # torch checks repeats before the range: still nothing
        ("GPU-bbbb,GPU-aaaa,GPU-bbbb", []),
        ("GPU-bbbb2222,GPU-bbbb", []),  # two prefixes of one GPU
        # ordinals read like strtoul: the leading digits
        ("1gpu2,2ampere", [1, 2]),
        ("+2", [2]),
        ("0,-1,1", [0]),  # a negative ordinal ends the list
        ("0,x", [0]),
        # the first entry sets the kind: another kind ends the list
        ("GPU-bbbb2222,0", [1]),
        ("2,GPU-aaaa", [2]),
        ("gpu-cccc", []),  # "GPU-" is case-sensitive for torch: this reads as no ordinal
    ],
)
def test_visible_devices_parsed_as_torch_does(env: str, expected: list[int]) -> None:
    order, notes = parse_visible_devices(env, UUIDS)
    assert order == expected
    if expected == [] and env.count(",") and env.split(",")[0].strip().lstrip("+").isdigit():
        assert any("repeats" in n and "no device at all" in n for n in notes)


def test_notes_and_reasons_say_what_cuda_does(
    fake_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, notes = parse_visible_devices("1gpu2", UUIDS)
    assert notes == ["CUDA_VISIBLE_DEVICES entry '1gpu2' reads as 1 (CUDA takes its leading digits)"]
    fake_nvml(four_gpus())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0,1")
    w = Watcher(cells=False)
    assert [d.kind for d in w.devices] == ["host"]
    assert w.reason == "no GPU visible: CUDA_VISIBLE_DEVICES='1,0,1' repeats an entry, so CUDA exposes none"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    w = Watcher(cells=False)
    assert w.reason is not None and "names no device NVML lists here" in w.reason


def test_visible_devices_mapping_shows_both_indexes(
    fake_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvml(four_gpus())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    w = Watcher(cells=False)
    gpus = [d for d in w.devices if d.kind == "cuda"]
    assert [(d.cuda_index, d.nvml_index, d.name) for d in gpus] == [
        (0, 2, "Fake 2"),
        (1, 0, "Fake 0"),
    ]
    assert gpus[0].label == "cuda:0 (GPU 2)"
    w.sample_now()
    frame = w.result().samples
    assert list(frame["index"][:2]) == [2, 0] and list(frame["cuda_index"][:2]) == [0, 1]
    only = Watcher(machine_sources(gpus=[1]), cells=False)
    assert [(d.cuda_index, d.nvml_index) for d in only.devices if d.kind == "cuda"] == [(1, 0)]
    with pytest.raises(
        ValueError,
        match=r"unknown GPU index 3: available CUDA indexes are 0 \(Fake 2\), 1 \(Fake 0\)",
    ):
        Watcher(machine_sources(gpus="0,3"))


def test_visible_devices_hiding_everything(fake_nvml: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml(four_gpus())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    w = Watcher(cells=False)
    assert w.reason is not None and "hides every GPU" in w.reason
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,7")
    w = Watcher(cells=False)
    assert [d.nvml_index for d in w.devices if d.kind == "cuda"] == [1]
    assert any("'7'" in n for n in w.notes())


def test_torch_device_order_wins_when_cuda_is_initialised(
    fake_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvml(four_gpus())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(
        "gpumagic.monitor.nvml.torch_visible_uuids", lambda: ["GPU-dddd4444", "GPU-bbbb2222"]
    )
    w = Watcher(cells=False)
    assert [(d.cuda_index, d.nvml_index) for d in w.devices if d.kind == "cuda"] == [(0, 3), (1, 1)]


def test_process_memory_in_a_pid_namespace_is_unknown(
    fake_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NVML lists host PIDs; inside a container none matches os.getpid().
    fake_nvml([gpu(procs=[(999_999, 2048 * MIB)])])
    monkeypatch.setattr("gpumagic.monitor.nvml_source.cuda_in_use", lambda: True)
    w = Watcher(cells=False)
    w.sample_now()
    assert math.isnan(latest(w, 0, "process_memory_used"))
    assert any("PID namespace" in n for n in w.notes())
    monkeypatch.setattr("gpumagic.monitor.nvml_source.cuda_in_use", lambda: False)
    w.sample_now()
    assert latest(w, 0, "process_memory_used") == 0  # no CUDA here: really nothing


# -- alerts ---------------------------------------------------------------------------------
def test_memory_and_throttle_alerts(fake_nvml: Any) -> None:
    fake = fake_nvml(
        [
            gpu("A", "GPU-a", mem_used=15_000 * MIB, mem_total=16_000 * MIB, throttle=0x40 | 0x1),
            gpu("B", "GPU-b", throttle=0x80),  # the hardware power brake
            gpu("C", "GPU-c", throttle=0x1 | 0x10),
        ]
    )
    w = Watcher(cells=False)
    w.sample_now()
    kinds = {(a.kind, a.device) for a in w.status().alerts}
    assert kinds == {("memory", "cuda:0"), ("thermal", "cuda:0"), ("power", "cuda:1")}
    fake.gpus[0]["mem_used"] = 1000 * MIB
    fake.gpus[0]["throttle"] = 0
    w.sample_now()
    assert {(a.kind, a.device) for a in w.status().alerts} == {("power", "cuda:1")}
    seen = {a.key: n for a, _, n in w.result().alerts}
    assert seen[("memory", "cuda:0")] == 1 and seen[("power", "cuda:1")] == 2


def test_low_utilization_alert_while_a_cell_runs(fake_nvml: Any) -> None:
    fake = fake_nvml([gpu(util=8, procs=[(os.getpid(), 900 * MIB)]), gpu("idle", "GPU-x", util=0)])
    w = Watcher(interval=1.0, cells=False)
    w.marks.open("train(model)", 12, start=time.time() - 6)
    for _ in range(3):
        w.sample_now()
    alerts = w.status().alerts
    assert [(a.kind, a.device) for a in alerts] == [
        ("low_utilization", "cuda:0")
    ]  # not the idle GPU
    assert "cell [12]" in alerts[0].message and "%%gpuprofile" in alerts[0].message
    fake.gpus[0]["util"] = 95
    for _ in range(6):
        w.sample_now()
    assert w.status().alerts == []
    w.marks.close(12, True)
    w.sample_now()
    assert w.status().alerts == []


def test_low_utilization_needs_a_running_cell_of_some_length(fake_nvml: Any) -> None:
    fake_nvml([gpu(util=2, procs=[(os.getpid(), 900 * MIB)])])
    w = Watcher(cells=False)
    for _ in range(4):
        w.sample_now()
    assert w.status().alerts == []  # nothing runs
    w.marks.open("x", 1)  # just started
    for _ in range(4):
        w.sample_now()
    assert w.status().alerts == []


def test_ring_values_are_float_nan_for_missing(fake_nvml: Any) -> None:
    fake_nvml(
        [
            gpu(
                unsupported={
                    "nvmlDeviceGetTemperature",  # NOT_SUPPORTED: no successor is asked
                    "nvmlDeviceGetComputeRunningProcesses",
                    "nvmlDeviceGetComputeRunningProcesses_v2",
                }
            )
        ]
    )
    w = Watcher(cells=False)
    w.sample_now()
    last = w._ring.last()
    assert last is not None
    row = last[1][0]
    assert np.isnan(row[M.TEMPERATURE]) and np.isnan(row[M.PROC_MEM]) and row[M.UTIL_GPU] == 50
