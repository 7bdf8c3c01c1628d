"""Host path (no NVIDIA driver here, or hidden): sampling, ring buffer, lifecycle, validation."""

from __future__ import annotations

import math
import os
import threading
import time

import numpy as np
import psutil
import pytest
from watch_helpers import wait_for, watch_threads

import gpumagic
from gpumagic.monitor import Watcher, current, machine_sources, stop_current, watch
from gpumagic.monitor import metrics as M
from gpumagic.monitor.ring import Ring, capacity_for


@pytest.fixture(autouse=True)
def host_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Force the host path even on a GPU machine: NVML sees no device at all."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    # torch's own device list wins once CUDA is initialised (an earlier GPU test): ignore it.
    monkeypatch.setattr("gpumagic.monitor.nvml.torch_visible_uuids", lambda: None)


def test_host_sample_has_real_values() -> None:
    w = Watcher(interval=0.1, cells=False)
    time.sleep(0.12)  # a CPU % needs a measuring window
    w.sample_now()
    status = w.status()
    host = status["host"]
    vm = psutil.virtual_memory()
    assert host["host_memory_total"] == vm.total
    assert 0 < host["host_memory_used"] <= vm.total
    assert 0.0 <= host["host_cpu"] <= 100.0
    rss = psutil.Process().memory_info().rss
    assert 0.5 * rss < host["process_rss"] < 2 * rss
    assert status.reason  # one line saying why there is no GPU panel
    assert w.devices[-1].kind == "host" and len(w.devices) == 1


def test_host_only_reason_names_the_cause() -> None:
    w = Watcher(cells=False)
    assert w.reason is not None
    # Either no driver here, or the env var above hid the GPUs of a GPU machine.
    assert "NVML unavailable" in w.reason or "CUDA_VISIBLE_DEVICES" in w.reason


def test_ring_is_bounded_by_the_window() -> None:
    ring = Ring(capacity_for(window=1.0, interval=0.1), devices=2, metrics=M.N_METRICS)
    nbytes = ring.nbytes
    block = np.zeros((2, M.N_METRICS))
    for i in range(50_000):  # many windows' worth
        block[0, 0] = i
        ring.push(float(i), block)
    assert len(ring) == ring.capacity == 26
    assert ring.nbytes == nbytes
    times, values = ring.tail()
    assert times.tolist() == [float(i) for i in range(50_000 - 26, 50_000)]
    assert values[-1, 0, 0] == 49_999
    t, _ = ring.since(49_990.0)
    assert t[0] == 49_990.0 and len(t) == 10


def test_watcher_memory_stays_bounded_and_frame_holds_the_window() -> None:
    w = Watcher(interval=0.1, window=0.5, cells=False)
    for _ in range(200):
        w.sample_now()
    assert len(w._ring) == w._ring.capacity == capacity_for(0.5, 0.1)
    frame = w.result().samples
    # All 200 samples were taken within far less than 0.5 s? Then the ring's capacity bounds it.
    assert len(frame) <= w._ring.capacity
    assert list(frame["device"].unique()) == ["host"]
    assert frame["time"].is_monotonic_increasing


def test_thread_samples_at_the_interval_and_stops() -> None:
    w = watch(interval=0.1, cells=False)
    assert current() is w and w.running
    assert [t.daemon for t in watch_threads()] == [True]
    assert wait_for(lambda: w.samples_taken >= 5, 3.0)
    result = w.stop()
    assert not w.running and current() is None and watch_threads() == []
    times = result.snapshot.times
    gaps = np.diff(times)
    assert np.median(gaps) == pytest.approx(0.1, abs=0.04)
    assert result.samples_taken == len(times)
    assert result.sample_cpu_mean_s > 0


def test_second_start_replaces_the_first() -> None:
    first = watch(interval=0.1, cells=False)
    second = gpumagic.watch(interval=0.2, cells=False)
    assert not first.running
    assert second.running and current() is second
    assert len(watch_threads()) == 1
    assert first.stop() is first.stop()  # idempotent: the same result
    with pytest.raises(RuntimeError, match="stopped"):
        first.start()
    result = stop_current()
    assert result is not None and not second.running
    assert stop_current() is None


@pytest.mark.parametrize("interval", [0, -1.0, float("nan"), float("inf"), "fast"])
def test_bad_interval_raises_before_any_thread(interval: object) -> None:
    before = threading.active_count()
    with pytest.raises(ValueError, match="interval"):
        watch(interval=interval)  # type: ignore[arg-type]
    assert threading.active_count() == before and current() is None


def test_interval_floor() -> None:
    w = Watcher(interval=0.01, cells=False)
    assert w.interval == 0.1
    assert any("floor" in n for n in w.notes())


def test_bad_window_and_gpus() -> None:
    with pytest.raises(ValueError, match="window"):
        Watcher(interval=1.0, window=0.5)
    with pytest.raises(ValueError, match="window"):
        Watcher(window=-3)
    with pytest.raises(ValueError, match="unknown GPU index 0: available CUDA indexes are none"):
        Watcher(machine_sources(gpus=[0]))
    with pytest.raises(ValueError, match="integers"):
        Watcher(machine_sources(gpus="zero"))


def test_bad_input_keeps_the_running_watcher() -> None:
    running = watch(interval=0.1, cells=False)
    with pytest.raises(ValueError):
        watch(interval=0)
    with pytest.raises(ValueError, match="nope"):
        watch(log="/nonexistent-dir/nope/x.csv")
    assert current() is running and running.running and len(watch_threads()) == 1


def test_sampling_error_never_raises_and_is_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    raised: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    w = watch(interval=0.1, cells=False)
    calls = {"n": 0}
    real_push = w._ring.push

    def flaky_push(t: float, block: np.ndarray) -> None:
        calls["n"] += 1
        if calls["n"] % 2:
            raise OSError("simulated failure in the middle of a sample")
        real_push(t, block)

    monkeypatch.setattr(w._ring, "push", flaky_push)
    assert wait_for(lambda: calls["n"] >= 6, 3.0)
    assert w.running and raised == []
    assert w.sample_errors >= 3
    assert any("simulated failure" in n for n in w.notes())


def test_status_right_after_start_has_values() -> None:
    w = watch(interval=5.0, cells=False)  # the thread would not sample for 5 s
    status = w.status()
    assert status.running
    assert not math.isnan(status["host"]["host_memory_total"])


def test_thread_cpu_cost_is_measured() -> None:
    w = watch(interval=0.1, cells=False)
    assert wait_for(lambda: w.samples_taken >= 4, 3.0)
    w.stop()
    # thread_time resolution is ~1 µs-1 ms depending on the clock; the total must be positive
    # and a host sample must cost less than the interval it runs in.
    assert 0 < w.sample_cpu_mean_s < 0.1


def test_pid_is_this_process() -> None:
    w = Watcher(cells=False)
    assert w.sources[-1].reader._proc.pid == os.getpid()


# -- publishing: what a front end follows without the watcher knowing it (issue 8) ----------


def test_subscribers_hear_every_sample_and_the_stop_once() -> None:
    w = watch(interval=0.1, cells=False)
    events: list[tuple[str, int, str]] = []
    w.subscribe(lambda e: events.append((e, w.seq, threading.current_thread().name)))
    assert wait_for(lambda: sum(e == "sample" for e, _, _ in events) >= 3, 3.0)
    result = w.stop()
    w.stop()  # idempotent: no second "stop"
    names = [e for e, _, _ in events]
    assert names.count("stop") == 1 and names[-1] == "stop"
    samples = [(seq, thread) for e, seq, thread in events if e == "sample"]
    # Each "sample" comes after that sample is in: seq (the version readers poll) has moved.
    seqs = [seq for seq, _ in samples]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert "gpumagic-watch" in {thread for _, thread in samples}  # the sampler's own thread
    stop_thread = next(thread for e, _, thread in events if e == "stop")
    assert stop_thread == threading.current_thread().name  # the caller of stop()
    assert result.samples_taken == w.samples_taken


def test_unsubscribe_and_late_subscribers() -> None:
    w = watch(interval=0.1, cells=False)
    heard: list[str] = []
    unsubscribe = w.subscribe(heard.append)
    assert wait_for(lambda: "sample" in heard, 3.0)
    unsubscribe()
    unsubscribe()  # twice is harmless
    n = len(heard)
    w.sample_now()
    assert len(heard) == n
    w.stop()
    assert len(heard) == n  # not told of the stop either
    late: list[str] = []
    w.subscribe(late.append)  # a stopped watcher tells a new subscriber at once
    assert late == ["stop"]


def test_a_failing_subscriber_never_stops_the_sampling() -> None:
    w = watch(interval=0.1, cells=False)

    def broken(event: str) -> None:
        raise RuntimeError(f"front end bug on {event}")

    w.subscribe(broken)
    before = w.samples_taken
    assert wait_for(lambda: w.samples_taken >= before + 3, 3.0)
    assert w.running and w.sample_errors == 0
    assert any("'sample' subscriber failed" in n and "front end bug" in n for n in w.notes())
    w.stop()  # the stop reaches the broken subscriber too, and stop() still returns
    assert not w.running
