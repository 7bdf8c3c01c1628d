"""Every tutorial notebook runs top to bottom on the CPU (nbclient), at its small size.

A cell that must fail to teach something (the out-of-memory demo) carries the standard
``raises-exception`` tag; any other error fails the test. Each notebook must show at least
one gpumagic report (an HTML output whose element has a ``gpumagic`` class), so a notebook
whose magics silently stopped rendering fails too.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
# per notebook; all of them together must stay under 15 minutes on a 2-core machine
TIMEOUT_S = 600

pytestmark = pytest.mark.notebooks


def execute_notebook(path: Path, workdir: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    )
    client.execute()
    return nb


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_notebook_runs_on_the_cpu(path: Path, tmp_path: Path) -> None:
    # run in a copy of the folder so files the notebook writes (traces, CSV, scripts) stay out of the tree
    for f in NOTEBOOKS.iterdir():
        if f.is_file():
            (tmp_path / f.name).write_bytes(f.read_bytes())
    started = time.perf_counter()
    nb = execute_notebook(tmp_path / path.name, tmp_path)
    elapsed = time.perf_counter() - started
    print(f"\n{path.name}: {elapsed:.0f} s")
    html = [
        o["data"]["text/html"]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "text/html" in o.get("data", {})
    ]
    assert any('class="gpumagic' in h for h in html), f"{path.name} shows no gpumagic report"
    for c in nb.cells:
        if c.cell_type != "code" or "raises-exception" in c.metadata.get("tags", []):
            continue
        errors = [o for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{path.name}: {errors[0]['ename']}: {errors[0]['evalue']}"


def test_there_are_tutorials():
    names = {p.stem for p in PATHS}
    assert {
        "01_quickstart",
        "02_case_study",
        "03_out_of_memory",
        "04_multi_gpu",
        "05_reproducible_env",
    } <= names
