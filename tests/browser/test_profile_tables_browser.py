"""%gpuprofile's operator table sorts by a column when its header is clicked, in JupyterLab."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from trace_data import require_trace

if TYPE_CHECKING:
    from conftest import LabPage

pytestmark = pytest.mark.browser


def _column(table, index: int) -> list[float]:
    cells = table.locator(f"tbody tr td:nth-child({index + 1})")
    return [float(v) for v in cells.evaluate_all("cs => cs.map(c => c.getAttribute('data-v'))")]


def test_operator_table_sorts_on_header_click(lab: LabPage) -> None:
    trace = require_trace("resnet50_v100_num_workers_0.json.gz")
    lab.write_notebook("tables", ["%load_ext gpumagic", f"%gpuprofile --load {trace} --rows 12"])
    lab.open_notebook("tables")
    lab.run_all()
    lab.wait_run_all()
    report = lab.wait_output(1, ".gpumagic-profile", timeout=60)
    table = report.locator("table.gm-sortable").filter(has_text="host self").first
    calls_before = _column(table, 1)
    assert calls_before != sorted(calls_before, reverse=True), "already sorted by calls: the check proves nothing"
    table.locator("th", has_text="calls").click()
    calls = _column(table, 1)
    assert calls == sorted(calls, reverse=True), calls
    table.locator("th", has_text="calls").click()  # second click: ascending
    assert _column(table, 1) == sorted(calls)
    print(f"\nsorted table screenshot: {lab.screenshot('sorted-by-calls')}")
