"""Every tutorial notebook runs top to bottom on the CPU (nbclient), at its small size.

A cell that must fail to teach something (the out-of-memory demo) carries the standard
``raises-exception`` tag; any other error fails the test. Each notebook must show at least
one gpumagic report (an HTML output whose element has a ``gpumagic`` class), so a notebook
whose magics silently stopped rendering fails too, and no output may hold Kineto's
``USDT: ... profiler_start/stop`` lines. The two notebooks that measure fixes and settings
must say what their measurements support: every fix or setting with its verdict, the ones
that cannot act on a CPU as "no effect on CPU" beside a measurement that agrees, and a
summary that counts what its table shows.
"""

from __future__ import annotations

import re
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
    usdt = [t for t in _texts(nb) if "USDT" in t]
    assert not usdt, f"{path.name} shows Kineto's lines: {usdt[0][:200]}"
    if path.stem in CHECKS:
        CHECKS[path.stem](nb)


def _texts(nb: nbformat.NotebookNode) -> list[str]:
    """Every text a reader sees: streams (stdout, stderr) and the plain text of each output."""
    out = []
    for c in nb.cells:
        for o in c.get("outputs", []) if c.cell_type == "code" else []:
            if o.get("output_type") == "stream":
                out.append(o["text"])
            out += [o.get("data", {}).get(k, "") for k in ("text/plain", "text/html")]
    return [t for t in out if t]


def _stdout(nb: nbformat.NotebookNode) -> str:
    return "".join(
        o["text"]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream" and o.get("name") == "stdout"
    )


_JUDGED = re.compile(r"^(\w+) -> (\w+): (faster|slower|no difference)", re.MULTILINE)


def _check_case_study(nb: nbformat.NotebookNode) -> None:
    out = _stdout(nb)
    if "device=cpu" not in out:
        return  # on a GPU every fix can act: what it shows is for the reader to judge
    judged = {after: verdict for _, after, verdict in _JUDGED.findall(out)}
    # every fix reported with its verdict, against the run before it
    assert set(judged) == {
        "workers", "non_blocking", "amp", "channels_last", "cudnn_benchmark", "set_to_none"
    }, judged
    # a fix that cannot act on a CPU says so, beside a measurement that agrees
    for fix in ("non_blocking", "cudnn_benchmark"):
        assert judged[fix] == "no difference", (fix, judged[fix])
    assert out.count("no effect on CPU") >= 2 and "the measurement agrees" in out
    assert "yet the measurement says" not in out
    # the summary counts only the changes beyond the noise, as the verdicts say them
    m = re.search(r"on cpu: (\d+) of 6 changes beyond the noise: (.*)", out)
    assert m, out[-2000:]
    beyond = {fix for fix, verdict in judged.items() if verdict != "no difference"}
    assert int(m.group(1)) == len(beyond)
    assert set(re.findall(r"(\w+) \((?:faster|slower),", m.group(2))) == beyond
    table = next(t for t in _texts(nb) if "95% interval (ms)" in t and "<table" in t)
    for fix, verdict in judged.items():
        row = re.search(rf"<th>{fix}</th>(.*?)</tr>", table, re.DOTALL)
        assert row and f"<td>{verdict}" in row.group(1), (fix, verdict)
    assert "NaN" not in table and "e-0" not in table


def _check_reproducible_env(nb: nbformat.NotebookNode) -> None:
    out = _stdout(nb)
    if "device=cpu" not in out:
        return
    for setting in ("deterministic", "fast_gpu"):
        assert f"{setting}: no effect on CPU; the measurement agrees (no difference" in out, out
    table = next(t for t in _texts(nb) if "vs defaults (95% interval)" in t and "<table" in t)
    assert table.count("no difference (no effect on CPU)") == 2
    assert "NaN" not in table and "e-0" not in table
    # the report shows once (%gpuenv); each --freeze says what it wrote, not the report again
    html = [t for t in _texts(nb) if t.startswith("<")]
    assert sum('class="gpumagic gpumagic-env"' in t for t in html) == 1
    assert sum("Wrote " in t for t in html) == 3


CHECKS = {"02_case_study": _check_case_study, "05_reproducible_env": _check_reproducible_env}


def test_there_are_tutorials():
    names = {p.stem for p in PATHS}
    assert {
        "01_quickstart",
        "02_case_study",
        "03_out_of_memory",
        "04_multi_gpu",
        "05_reproducible_env",
        "06_why_slower",
        "07_fit_a_7b_model",
    } <= names
