"""%gpuwatch in JupyterLab: the live widget renders and keeps changing while a busy cell runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import LabPage

pytestmark = pytest.mark.browser

# CPU-bound for ~6 s so the host CPU chart moves (no GPU on CI: the host panel is what shows)
BUSY_CELL = """\
import time
t_end = time.time() + 6
n = 0
while time.time() < t_end:
    n += sum(i * i for i in range(2000))
"""


def test_gpuwatch_widget_is_live_while_a_cell_runs(lab: LabPage) -> None:
    lab.write_notebook(
        "gpuwatch_live",
        ["%load_ext gpumagic", "%gpuwatch -i 0.2", BUSY_CELL, "%gpuwatch stop"],
    )
    lab.open_notebook("gpuwatch_live")
    lab.run_all()
    lab.wait_cell_running(2)
    chart = lab.wait_output(1, ".widget-html-content .gpumagic-watch", timeout=30)
    lab.assert_no_widget_errors()
    first, second = lab.sample_html(chart, count=2, interval=2.0)
    still_running = lab.is_running(2)
    shot = lab.screenshot("gpuwatch-live")
    print(f"\n%gpuwatch screenshot: {shot}")

    assert "data:image/svg+xml;base64," in first, first[:300]  # the charts, as images
    assert still_running, "the busy cell ended before the second capture: the check proves nothing"
    assert first != second, "the %gpuwatch chart did not change while a cell ran"

    lab.wait_run_all()
    lab.assert_no_widget_errors()
    # stop leaves a static summary (an HTML output, not a widget) with the cells it saw
    summary = lab.wait_output(3, ".gpumagic", timeout=30)
    assert "import time" in summary.inner_html()  # the busy cell, by its first line
    final = lab.screenshot("gpuwatch-stopped")
    print(f"%gpuwatch summary screenshot: {final}")
    assert shot.stat().st_size > 0 and final.stat().st_size > 0
