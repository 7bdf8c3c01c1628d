"""What the watcher shows: live frame, status and result mime bundles (HTML + text)."""

from __future__ import annotations

import os
import re
import time
from typing import Any

import pytest
from svg_images import inline_svg
from watch_nvml_double import MIB, gpu

from gpumagic.monitor import Watcher, watch
from gpumagic.render.watch_live import start_view
from gpumagic.render.watch_views import LiveFrame, live_html


@pytest.fixture
def host_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr("gpumagic.monitor.nvml.torch_visible_uuids", lambda: None)


@pytest.mark.usefixtures("host_only")
def test_host_only_frame_looks_finished(wshell: Any) -> None:
    w = watch(interval=0.1, shell=wshell)
    time.sleep(0.25)
    wshell.run_cell("import time; time.sleep(0.2)", store_history=True)
    frame = LiveFrame(w)
    html = inline_svg(frame())
    assert html.startswith('<div class="gpumagic gpumagic-watch">')
    assert "No GPU panel:" in html and "Showing this machine's CPU and RAM" in html
    assert html.count("<svg") == 2  # host CPU and RAM
    assert "host CPU" in html and "host RAM" in html
    assert "<rect" in html  # the cell's band
    assert frame() is frame()  # no new sample: the cached frame
    result = w.stop()
    bundle = result._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert 'class="gpumagic gpumagic-watch-result"' in bundle["text/html"]
    assert "import time; time.sleep(0.2)" in bundle["text/html"]
    assert "No GPU panel" in bundle["text/plain"] and "peak CPU" in bundle["text/plain"]


def test_gpu_frame_has_small_multiples_per_gpu(
    fake_nvml: Any, wshell: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvml(
        [
            gpu("Fake <A100>", "GPU-aaaa", throttle=0x20, procs=[(os.getpid(), 64 * MIB)]),
            gpu("Fake B", "GPU-bbbb", mem_used=15_500 * MIB, mem_total=16_000 * MIB),
        ]
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    w = watch(interval=0.1, shell=wshell, log=None)
    wshell.run_cell("x = '<b>not bold</b>'  # cell source with markup", store_history=True)
    time.sleep(0.25)
    html = inline_svg(LiveFrame(w)())
    assert html.count("<svg") == 2 * 4 + 2
    assert "cuda:0 (GPU 1)" in html and "cuda:1 (GPU 0)" in html
    assert "Fake &lt;A100&gt;" in html and "<A100>" not in html  # escaped
    assert "thermal throttling" in html and "memory 97% used" in html  # alerts in the header
    assert "sw_thermal_slowdown" in html
    assert "No GPU panel" not in html
    status = w.status()
    text = str(status)
    assert "cuda:0 (GPU 1)" in text and "Fake <A100>" in text
    result = w.stop()
    page = inline_svg(result._repr_mimebundle_()["text/html"])
    assert "&lt;b&gt;not bold&lt;/b&gt;" in page and "<b>not bold</b>" not in page
    assert "peak util" in page and "this kernel" in page
    assert page.count("<svg") == 10


def test_summary_chart_decimates_long_runs(fake_nvml: Any) -> None:
    fake = fake_nvml([gpu()])
    w = Watcher(interval=0.1, window=10_000, cells=False)
    for i in range(3000):
        fake.gpus[0]["util"] = 100 if i == 1500 else 10  # one spike must survive
        w.sample_now()
    snap = w.snapshot()
    html = inline_svg(live_html(snap))
    util_chart = re.search(r"<svg.*?</svg>", html, re.S)
    assert util_chart is not None
    points = re.search(
        r'<polyline points="([^"]+)" fill="none" stroke="#3b7dd8"', util_chart.group(0)
    )
    assert points is not None and len(points.group(1).split()) <= 400
    ys = [float(p.split(",")[1]) for p in points.group(1).split()]
    assert max(ys) - min(ys) > 40  # the 100% spike is still drawn well above the 10% line


@pytest.mark.usefixtures("host_only")
def test_render_live_is_cheap() -> None:
    w = Watcher(interval=1.0, window=300, cells=False)
    for _ in range(301):
        w.sample_now()
    t0 = time.perf_counter()
    for _ in range(10):
        live_html(w.snapshot())
    per_frame = (time.perf_counter() - t0) / 10
    assert per_frame < 0.1  # loose: the benchmark reports the real number


@pytest.mark.usefixtures("host_only")
def test_start_view_feeds_a_live_view_and_stop_finishes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUMAGIC_LIVE", "off")  # a terminal: the view exists but shows nothing
    w = watch(interval=0.1, cells=False)
    view = start_view(w)
    frame = view._render()
    assert frame is not None and 'class="gpumagic gpumagic-watch"' in frame
    assert view.error is None
    result = w.stop()
    assert not view.running and w._subscribers == []  # the watcher holds no view after its stop
    assert result.samples_taken >= 1


@pytest.mark.usefixtures("host_only")
def test_live_view_follows_the_watcher_and_its_stop_freezes_the_slot(
    wshell: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher knows nothing of the view: the view polls ``seq`` for frames and hears of
    the stop through ``subscribe``, which puts the one-line note in its slot."""
    from IPython.utils.capture import capture_output

    monkeypatch.setenv("GPUMAGIC_LIVE", "display")  # a display slot, updated in place
    with capture_output() as cap:
        w = watch(interval=0.1, cells=False)
        view = start_view(w)
        assert view.running
        deadline = time.monotonic() + 5
        while view.pushes < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        w.stop()
    assert view.pushes >= 2, view.error  # new samples made new frames while it ran
    assert not view.running and w._subscribers == []
    last = cap.outputs[-1].data
    assert "gpuwatch stopped at" in last["text/plain"]
    assert 'class="gpumagic gpumagic-watch-stopped"' in last["text/html"]
