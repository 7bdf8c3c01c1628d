"""The case-study tutorial in JupyterLab: it runs top to bottom and its reports render.

``notebooks/02_case_study.ipynb`` is the notebook most users open first, so it is checked
in the front end they use: every ``%%gpuprofile`` run shows its report, every
``--compare`` its side-by-side view, ``%%memtrace`` and ``%gpuwatch stop`` their tables,
the summary cell its DataFrame, and no cell shows a traceback or a broken widget.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import LabPage
    from playwright.sync_api import Locator

pytestmark = pytest.mark.browser

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "02_case_study.ipynb"
# about 15 s through nbclient on a 2-core machine; the browser adds rendering and the widget
RUN_TIMEOUT_S = 420.0

def _cell_indexes(prefix: str) -> list[int]:
    """Indexes (0-based, markdown included, as LabPage counts them) of code cells with a line
    starting with prefix (a comparison is kept: ``comparison = %gpuprofile --compare ...``)."""
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    # a cell magic is the cell's first line; a line magic may follow other lines
    # (``workers = _gpuprofile`` before ``comparison = %gpuprofile --compare ...``)
    lines = slice(None) if prefix.startswith("%") and not prefix.startswith("%%") else slice(1)
    return [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        and any(ln.split("= ", 1)[-1].startswith(prefix) for ln in c.source.splitlines()[lines])
    ]


def test_case_study_runs_and_renders(lab: LabPage) -> None:
    profiles = _cell_indexes("%%gpuprofile -n ")
    compares = _cell_indexes("%gpuprofile --compare ")
    (memtrace,) = _cell_indexes("%%memtrace")
    (summary,) = _cell_indexes("import pandas as pd")
    (watch_stop,) = _cell_indexes("%gpuwatch stop")
    assert len(profiles) >= 7 and len(compares) == len(profiles) - 1, (profiles, compares)

    shutil.copyfile(NOTEBOOK, lab.server.root_dir / NOTEBOOK.name)
    lab.open_notebook(NOTEBOOK.name)
    started = time.perf_counter()
    lab.run_all()
    lab.wait_run_all(RUN_TIMEOUT_S)
    print(f"\n{NOTEBOOK.name}: Run All took {time.perf_counter() - started:.0f} s in JupyterLab")

    # every profiled run shows its report; the baseline's names the DataLoader stall
    for i in profiles:
        lab.wait_output(i, ".gpumagic-profile", timeout=30)
    baseline = lab.outputs(profiles[0], ".gpumagic-profile").first
    assert baseline.locator('.gm-finding[data-rule="dataloader"]').count() == 1, (
        "the baseline report does not show the dataloader finding"
    )
    assert "DataLoader" in baseline.inner_text()

    # every comparison renders, headline first; the first one is baseline -> workers
    for i in compares:
        lab.wait_output(i, ".gpumagic-profile-compare", timeout=30)
    first = lab.outputs(compares[0], ".gpumagic-profile-compare").first
    first_text = first.inner_text()
    assert "baseline" in first_text and "workers" in first_text and "DataLoader" in first_text
    assert "DataLoader share of the step:" in lab.cell(compares[0]).inner_text()

    lab.wait_output(memtrace, ".gpumagic-memtrace", timeout=30)
    table = lab.wait_output(summary, ".jp-RenderedHTMLCommon table", timeout=30)
    table_text = table.inner_text()
    for row in ("baseline", "workers", "set_to_none", "step_ms", "dataloader_percent"):
        assert row in table_text, f"{row!r} missing from the summary table"
    assert lab.outputs(watch_stop, ".gpumagic").count() >= 1, "%gpuwatch stop showed no summary"

    # stderr counts too: kineto's start/stop lines would show here if the recorder stopped
    # silencing them
    errors = lab.error_outputs()
    assert not errors, "cells wrote errors:\n" + "\n---\n".join(errors)
    lab.assert_no_widget_errors()

    shots = [
        _viewport_shot(lab, "baseline-report", baseline),  # taller than the window: its top
        lab.screenshot("compare-baseline-workers", locator=first),
        lab.screenshot("summary", locator=lab.cell(summary)),
    ]
    for shot in shots:
        print(f"screenshot: {shot}")
        assert shot.stat().st_size > 0


def _viewport_shot(lab: LabPage, label: str, locator: Locator) -> Path:
    # An element screenshot of an output taller than the notebook's scroll area comes out
    # cut by the toolbar; scroll its top into view and take the window instead.
    locator.evaluate("el => el.scrollIntoView({block: 'start'})")
    lab.page.wait_for_timeout(300)
    return lab.screenshot(label, full_page=False)
