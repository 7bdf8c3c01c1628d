"""Smoke test of the browser harness: a live ipywidget keeps redrawing while a cell runs.

This is the shape of the real ``%gpuwatch`` check: a background thread in the kernel
pushes new SVG into a widget while the main thread is busy, and the page must show
each new frame without waiting for the busy cell to finish.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import LabPage

pytestmark = pytest.mark.browser

WIDGET_CELL = """\
import threading
import ipywidgets as widgets
from IPython.display import display


def frame(n):
    # The bar width and the label both change, so every frame is different markup.
    return (
        '<svg class="labtest-counter" xmlns="http://www.w3.org/2000/svg" width="240" height="40">'
        f'<rect width="{10 + (n * 13) % 220}" height="30" fill="#4c72b0"/>'
        f'<text x="6" y="22" fill="black">tick {n}</text></svg>'
    )


counter = widgets.HTML(value=frame(0))
stop_ticking = threading.Event()


def tick():
    n = 0
    # Bounded, so a forgotten kernel does not tick forever.
    while n < 400 and not stop_ticking.wait(0.3):
        n += 1
        counter.value = frame(n)


threading.Thread(target=tick, daemon=True, name="labtest-ticker").start()
display(counter)
"""

BUSY_CELL = "import time; time.sleep(4)"

WIDGET_SELECTOR = ".jp-OutputArea-output .widget-html-content"


def test_live_widget_updates_while_a_cell_runs(lab: LabPage) -> None:
    lab.write_notebook("smoke_widget", [WIDGET_CELL, BUSY_CELL])
    lab.open_notebook("smoke_widget")
    lab.run_all()

    lab.wait_cell_running(1)
    widget = lab.wait_output(0, WIDGET_SELECTOR, timeout=30)
    lab.assert_no_widget_errors()

    first, second = lab.sample_html(widget, count=2, interval=1.5)
    # Both captures must fall inside the busy cell, or this would not prove that the
    # widget updates while the kernel's main thread is blocked.
    still_running = lab.is_running(1)
    shot = lab.screenshot("while-busy")

    assert "labtest-counter" in first, f"widget shows no SVG: {first[:300]!r}"
    assert still_running, "busy cell finished before the second capture; the check proves nothing"
    assert first != second, f"widget did not change in 1.5 s while a cell ran: {first[:300]!r}"

    lab.wait_run_all()
    lab.assert_no_widget_errors()
    final = lab.screenshot("done")
    print(f"\nscreenshots: {shot} {final}")
    assert shot.is_file() and shot.stat().st_size > 0
    assert final.is_file() and final.stat().st_size > 0
