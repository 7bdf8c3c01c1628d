"""%gpuwatch through a real IPython shell, on the host path (no NVIDIA driver here)."""

from __future__ import annotations

import threading
import time

import pytest


def sampler_threads():
    return [t for t in threading.enumerate() if t.name == "gpumagic-watch" and t.is_alive()]


@pytest.fixture(autouse=True)
def _stop_after(ip):
    yield
    ip.run_cell("%gpuwatch stop", store_history=False)


def test_start_status_stop_with_cells_and_csv(ip, run, tmp_path):
    log = tmp_path / "gpu.csv"
    r = run(f"%gpuwatch -i 0.1 --log {log}")
    assert r.result.success, r.stdout
    assert len(sampler_threads()) == 1
    run("import time; time.sleep(0.35)")
    r = run("%gpuwatch status")
    assert r.result.success
    assert r.bundles == []  # shown once, as Out[] (below), not displayed as well
    bundle = r.result.result._repr_mimebundle_()
    assert "text/html" in bundle and "gpumagic" in bundle["text/html"]
    r = run("%gpuwatch stop")
    assert r.result.success, r.stdout
    assert sampler_threads() == []
    result = r.result.result
    assert result is ip.user_ns["_gpuwatch"]
    assert len(result.samples) >= 3
    assert "host" in set(result.samples["device"])
    # the sleeping cell is one of the cells marked, with its duration
    cells = result.cells
    sleepy = cells[cells["source"].str.contains("sleep", na=False)]
    assert len(sleepy) == 1 and sleepy.iloc[0]["duration_us"] >= 300_000
    assert log.exists() and log.read_text().splitlines()[0].startswith("timestamp")
    assert r.bundles == []
    html = result._repr_mimebundle_()["text/html"]
    assert str(log) in html


def test_second_start_replaces_the_first(run):
    run("%gpuwatch -i 0.2")
    run("%gpuwatch start -i 0.3")
    assert len(sampler_threads()) == 1


@pytest.mark.parametrize(
    "line, expected",
    [
        ("%gpuwatch -i 0", "interval"),
        ("%gpuwatch -i -1", "interval"),
        ("%gpuwatch --gpus 7", "7"),
        ("%gpuwatch --log /proc/nope/gpu.csv", "/proc/nope/gpu.csv"),
        ("%gpuwatch sideways", "invalid choice"),
    ],
)
def test_bad_input_is_a_usage_error_before_any_thread(run, line, expected):
    from IPython.core.error import UsageError

    r = run(line)
    assert isinstance(r.result.error_in_exec, UsageError), r.stdout
    assert expected in str(r.result.error_in_exec)
    assert "usage: %gpuwatch" in str(r.result.error_in_exec)
    assert sampler_threads() == []


def test_stop_without_a_watcher_says_so(run):
    r = run("%gpuwatch stop")
    assert r.result.success
    assert "nothing is being watched" in r.bundles[0]["text/plain"]
    assert r.result.result is None  # a note on screen, nothing to keep


def test_unload_stops_the_sampler(ip, run):
    run("%gpuwatch -i 0.1")
    assert len(sampler_threads()) == 1
    run("%unload_ext gpumagic")
    time.sleep(0.05)
    assert sampler_threads() == []
    run("%load_ext gpumagic")


def test_a_running_cell_is_marked_with_its_own_number(ip, run):
    run("%gpuwatch -i 0.1")
    r = run("import gpumagic.monitor as gm_monitor\nrunning_now = gm_monitor.current().marks.records()[-1].execution_count")
    assert r.result.success, r.stdout
    assert ip.user_ns["running_now"] == r.result.execution_count


def test_status_and_stop_return_their_result_shown_once(ip, run):
    from gpumagic.monitor import WatchResult, WatchStatus

    run("%gpuwatch -i 0.1")
    r = run("%gpuwatch status")
    assert isinstance(r.result.result, WatchStatus) and r.bundles == []
    assert r.stdout.count(f"Out[{r.result.execution_count}]") == 1
    assert "gpuwatch status" in r.stdout
    r = run("res = %gpuwatch stop")
    assert r.result.success, r.stdout
    assert isinstance(ip.user_ns["res"], WatchResult) and ip.user_ns["res"] is ip.user_ns["_gpuwatch"]
    assert r.bundles == [] and r.result.result is None and "Out[" not in r.stdout
    assert sampler_threads() == []
    run("%gpuwatch -i 0.1")
    r = run("%gpuwatch stop")
    assert isinstance(r.result.result, WatchResult) and r.bundles == []
    assert r.stdout.count(f"Out[{r.result.execution_count}]") == 1
    assert "gpuwatch summary" in r.stdout


@pytest.mark.parametrize("action", ["status", "stop"])
def test_a_trailing_semicolon_silences_status_and_stop(ip, run, action):
    run("%gpuwatch -i 0.1")
    ip.user_ns.pop("_gpuwatch", None)
    r = run(f"%gpuwatch {action};")
    assert r.result.success, r.result.error_in_exec
    assert r.result.result is None and r.bundles == [] and "Out[" not in r.stdout
    if action == "stop":  # silenced, not skipped: it stopped and kept the result
        assert sampler_threads() == [] and ip.user_ns["_gpuwatch"] is not None
    else:
        assert len(sampler_threads()) == 1
