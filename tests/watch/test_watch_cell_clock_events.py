"""Issue 29 item 3: a clock-event (throttle) reason active while a cell runs is marked on that
cell's row (the cells table's text and HTML, the ``clock_events`` column of ``.cells``) with
the share of the cell's samples it was active in, and the summary says it in words; idle is
not marked, and where NVML reads no reasons (or there is no GPU) nothing is said."""

from __future__ import annotations

import os
from typing import Any

import pytest
from watch_helpers import wait_for
from watch_nvml_double import MIB, gpu

from gpumagic.monitor import Watcher, watch
from gpumagic.units import fmt_percent

IDLE, POWER_CAP, HW_SLOWDOWN, SYNC_BOOST, HW_THERMAL = 0x1, 0x4, 0x8, 0x10, 0x40


def run_and_close(shell: Any, w: Watcher, source: str) -> Any:
    """Run a cell, then wait until the sample that closes it (the first after its end) is in:
    the next cell's changes of the double must not reach this one's record."""
    result = shell.run_cell(source, store_history=True)
    taken = w.samples_taken
    assert wait_for(lambda: w.samples_taken >= taken + 2)
    return result


def test_a_reason_during_one_cell_and_not_another(wshell: Any, fake_nvml: Any) -> None:
    fake = fake_nvml([gpu("Fake A", "GPU-aaaa", procs=[(os.getpid(), 300 * MIB)])])
    w = watch(interval=0.1, shell=wshell)
    wshell.user_ns.update(fake=fake, _w=w)
    fake.gpus[0]["throttle"] = POWER_CAP | SYNC_BOOST  # the whole of the first cell
    capped = run_and_close(wshell, w, "import time\n_w.sample_now(); time.sleep(0.2)")
    fake.gpus[0]["throttle"] = IDLE  # the second: clocks at idle, which is no news
    quiet = run_and_close(wshell, w, "_w.sample_now(); time.sleep(0.2)")
    # the third: hot for part of it (one sample at least on each side of the change)
    hot = run_and_close(
        wshell,
        w,
        "fake.gpus[0]['throttle'] = 0x40 | 0x8 | 0x4\n_w.sample_now(); time.sleep(0.15)\n"
        "fake.gpus[0]['throttle'] = 0x1\n_w.sample_now(); time.sleep(0.15)",
    )
    result = w.stop()

    cells = result.cells.set_index("execution_count")
    assert cells.loc[capped.execution_count, "clock_events"] == {
        "cuda:0": {"sw_power_cap": 1.0, "sync_boost": 1.0}
    }
    assert cells.loc[quiet.execution_count, "clock_events"] == {"cuda:0": {}}  # read: none
    shares = cells.loc[hot.execution_count, "clock_events"]["cuda:0"]
    assert set(shares) == {"sw_power_cap", "hw_slowdown", "hw_thermal_slowdown"}
    assert 0 < shares["hw_thermal_slowdown"] < 1 and len(set(shares.values())) == 1

    text = str(result)
    html = result._repr_mimebundle_()["text/html"]
    row = next(line for line in text.splitlines() if f"[{capped.execution_count}]" in line)
    assert "power cap 100%" in row and "sync boost 100%" in row
    quiet_row = next(line for line in text.splitlines() if f"[{quiet.execution_count}]" in line)
    assert "power cap" not in quiet_row and "idle" not in quiet_row
    assert "clocks held by" in text and "clocks held by" in html
    assert "power cap 100%, sync boost 100%" in html
    n = capped.execution_count
    said = f"GPU 0 was held by its power cap during 100% of cell In[{n}]"
    assert said in text and said in html
    hot_share = fmt_percent(100 * shares["hw_thermal_slowdown"])
    # asserted together, said together
    assert (
        "GPU 0 was slowed to half its clocks or less by its hardware and slowed by heat during "
        f"{hot_share} of cell In[{hot.execution_count}]: see %gpucheck"
    ) in text
    power_line = next(line for line in text.splitlines() if "held by its power cap" in line)
    assert f"In[{hot.execution_count}]: see %gpucheck" in power_line  # two cells, one line
    assert f"In[{quiet.execution_count}]" not in power_line


def test_only_the_gpus_this_kernel_uses_when_it_uses_any(wshell: Any, fake_nvml: Any) -> None:
    """On a shared box another user's card at its power cap is not this cell's news, as its
    utilisation is not; where this kernel uses no GPU, every watched GPU's reasons count."""
    fake = fake_nvml(
        [
            gpu("Mine", "GPU-aaaa", throttle=SYNC_BOOST, procs=[(os.getpid(), 300 * MIB)]),
            gpu("Theirs", "GPU-bbbb", throttle=POWER_CAP, procs=[(999_999, 9000 * MIB)]),
        ]
    )
    w = watch(interval=0.1, shell=wshell)
    wshell.user_ns.update(_w=w)
    mine = run_and_close(wshell, w, "_w.sample_now()")
    fake.gpus[0]["procs"] = []  # this kernel let go of its GPU
    pandas = run_and_close(wshell, w, "_w.sample_now()")
    result = w.stop()
    cells = result.cells.set_index("execution_count")
    assert cells.loc[mine.execution_count, "clock_events"] == {"cuda:0": {"sync_boost": 1.0}}
    assert cells.loc[pandas.execution_count, "clock_events"] == {
        "cuda:0": {"sync_boost": 1.0},
        "cuda:1": {"sw_power_cap": 1.0},
    }
    text = str(result)
    # several GPUs: the table names which one
    assert "cuda:0 sync boost 100%, cuda:1 power cap 100%" in text
    assert f"GPU 1 was held by its power cap during 100% of cell In[{pandas.execution_count}]" in text


def test_unread_reasons_say_nothing(wshell: Any, fake_nvml: Any) -> None:
    """A card that does not report its reasons: no share, no column in the table, no line."""
    both = {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"}
    fake_nvml([gpu(throttle=POWER_CAP, unsupported=both)])
    w = watch(interval=0.1, shell=wshell)
    wshell.user_ns.update(_w=w)
    run_and_close(wshell, w, "_w.sample_now()")
    result = w.stop()
    assert result.cells["clock_events"].tolist() == [None]
    text = str(result)
    assert "clocks held by" not in text and "see %gpucheck" not in text
    assert "power cap" not in text


def test_idle_and_unknown_bits_are_not_marked(fake_nvml: Any) -> None:
    """Idle clocks mean nothing ran; a bit this version cannot name stays in the samples."""
    from gpumagic.monitor.cells import MARKED_REASONS

    fake = fake_nvml([gpu(throttle=IDLE | 0x8000)])
    w = Watcher(interval=0.1, cells=False)
    cell = w.marks.open("x = 1", 1)
    w.sample_now()
    fake.gpus[0]["throttle"] = HW_SLOWDOWN
    w.sample_now()
    assert cell.clock_event_shares() == {"cuda:0": {"hw_slowdown": 0.5}}
    assert "gpu_idle" not in MARKED_REASONS and "sw_power_cap" in MARKED_REASONS
    assert w.result().samples["throttle"].tolist()[0] == "gpu_idle;unknown_0x8000"


def test_a_line_names_a_few_cells_then_counts_the_rest(fake_nvml: Any) -> None:
    fake_nvml([gpu(throttle=POWER_CAP)])
    w = Watcher(interval=0.1, cells=False)
    for n in range(1, 10):
        w.marks.open(f"step({n})", n)
        w.sample_now()
        w.marks.close(n, True)
        w.sample_now()
    (line,) = [s for s in str(w.result()).splitlines() if "see %gpucheck" in s]
    assert line == (
        "GPU 0 was held by its power cap during 100% of cell In[1], 100% of cell In[2], "
        "100% of cell In[3], 100% of cell In[4], 100% of cell In[5] and 4 more cells: "
        "see %gpucheck"
    )


@pytest.fixture
def host_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr("gpumagic.monitor.nvml.torch_visible_uuids", lambda: None)


@pytest.mark.usefixtures("host_only")
def test_the_host_path_has_no_clock_events(wshell: Any) -> None:
    w = watch(interval=0.1, shell=wshell)
    wshell.user_ns.update(_w=w)
    run_and_close(wshell, w, "_w.sample_now()")
    result = w.stop()
    assert not result.has_gpus
    assert "clock_events" not in result.cells.columns
    text = str(result)
    assert "clocks held by" not in text and "see %gpucheck" not in text
