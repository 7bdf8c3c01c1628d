"""The CSV log: nvidia-smi column names, one row per device per sample, flushed per sample."""

from __future__ import annotations

import csv
import os
import threading
from pathlib import Path

import pandas as pd
import psutil
import pytest
from watch_helpers import wait_for, watch_threads
from watch_nvml_double import MIB, gpu

from gpumagic.monitor import Watcher, csvlog, current, watch
from gpumagic.monitor.machine import MACHINE

HOST_COLUMNS = [
    "timestamp",
    "device",
    "index",
    "cuda.index",
    "name",
    "host.cpu [%]",
    "host.memory.used [MiB]",
    "host.memory.total [MiB]",
    "process.cpu [%]",
    "process.memory.rss [MiB]",
]


@pytest.fixture(autouse=True)
def host_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr("gpumagic.monitor.nvml.torch_visible_uuids", lambda: None)


def read_rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as f:
        return list(csv.reader(f))


def test_host_log_is_flushed_while_running(tmp_path: Path) -> None:
    path = tmp_path / "watch.csv"
    w = watch(interval=0.1, log=path, cells=False)
    # Read the file while the sampler still runs: every sample must already be on disk.
    assert wait_for(lambda: len(read_rows(path)) >= 4, 3.0)
    rows = read_rows(path)
    assert w.running
    assert rows[0] == HOST_COLUMNS
    assert all(r[1] == "host" for r in rows[1:])
    total_mib = psutil.virtual_memory().total / MIB
    assert abs(float(rows[1][7]) - total_mib) <= 1
    result = w.stop()
    rows = read_rows(path)
    # One row per device (the host) per sample; nothing is lost at stop.
    assert len(rows) - 1 == result.samples_taken
    frame = pd.read_csv(path)
    assert list(frame.columns) == HOST_COLUMNS
    assert frame["timestamp"].map(pd.Timestamp).is_monotonic_increasing
    assert result.log == str(path)


def test_gpu_log_columns_and_rows_per_sample(
    tmp_path: Path, fake_nvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvml(
        [
            gpu("Fake A", "GPU-aaaa", mem_used=2048 * MIB, power_mw=123_456, throttle=0x24),
            gpu("Fake B", "GPU-bbbb", procs=[(os.getpid(), 512 * MIB)]),
        ]
    )
    path = tmp_path / "gpu.csv"
    w = Watcher(interval=0.1, log=path, cells=False)
    for _ in range(3):
        w.sample_now()
    w.stop()
    rows = read_rows(path)
    header = rows[0]
    assert header == csvlog.header(MACHINE, with_gpus=True)
    for name in (
        "utilization.gpu [%]",
        "utilization.memory [%]",
        "memory.used [MiB]",
        "memory.total [MiB]",
        "temperature.gpu",
        "power.draw [W]",
        "power.limit [W]",
        "clocks.sm [MHz]",
        "clocks.mem [MHz]",
        "clocks_throttle_reasons.active",
        "host.cpu [%]",
    ):
        assert name in header
    data = [dict(zip(header, r)) for r in rows[1:]]
    assert len(data) == 3 * 3  # (2 GPUs + host) per sample
    first = data[0]
    assert (first["device"], first["index"], first["cuda.index"], first["name"]) == (
        "cuda:0",
        "0",
        "0",
        "Fake A",
    )
    assert first["memory.used [MiB]"] == "2048"
    assert first["power.draw [W]"] == "123.46"
    assert first["power.limit [W]"] == "300.00"
    assert first["clocks_throttle_reasons.active"] == "0x0000000000000024"
    assert first["clocks_throttle_reasons.names"] == "sw_power_cap;sw_thermal_slowdown"
    assert first["process.used_gpu_memory [MiB]"] == "0"
    assert data[1]["process.used_gpu_memory [MiB]"] == "512"
    assert data[2]["device"] == "host" and data[2]["utilization.gpu [%]"] == ""
    assert data[2]["host.memory.total [MiB]"] != ""


def test_unwritable_path_fails_before_any_thread(tmp_path: Path) -> None:
    before = threading.active_count()
    bad = tmp_path / "missing-dir" / "log.csv"
    with pytest.raises(ValueError, match="missing-dir"):
        watch(log=bad)
    with pytest.raises(ValueError, match="directory"):
        watch(log=tmp_path)
    assert threading.active_count() == before and current() is None and watch_threads() == []


def test_existing_foreign_file_is_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a gpuwatch log"):
        watch(log=path)
    assert path.read_text() == "a,b\n1,2\n"


def test_same_log_is_continued(tmp_path: Path) -> None:
    path = tmp_path / "again.csv"
    first = Watcher(log=path, cells=False)
    first.sample_now()
    first.stop()
    second = Watcher(log=path, cells=False)
    second.sample_now()
    second.stop()
    rows = read_rows(path)
    assert rows[0] == HOST_COLUMNS and rows.count(HOST_COLUMNS) == 1
    assert len(rows) == 1 + first.samples_taken + second.samples_taken
