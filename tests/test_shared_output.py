"""Output that survives sharing, read the ways a shared notebook is read: one output per
result, no stylesheet and no inline ``<svg>`` (sanitisers drop both), every chart an SVG
image with its words in ``alt``; ``nbconvert --to markdown`` with no repeated style block;
the LaTeX (PDF) export with each report's whole text.

The notebook runs in a real kernel (``tests/shared_notebook.py``); the browser test opens
the same notebook, untrusted, in JupyterLab and Notebook 7.
"""

from __future__ import annotations

import re

import pytest
from shared_notebook import MEMTRACE, PROFILE, WATCH_START, WATCH_STOP, execute, html_outputs
from svg_images import svg_images

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

pytestmark = pytest.mark.notebooks


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> nbformat.NotebookNode:
    path = execute(tmp_path_factory.mktemp("shared") / "shared.ipynb")
    return nbformat.read(path, as_version=4)


def test_every_cell_ran(shared) -> None:
    errors = [o for c in shared.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors


def test_one_output_per_result_and_nothing_a_sanitiser_drops(shared) -> None:
    kinds = {
        MEMTRACE: "gpumagic-memtrace",
        PROFILE: "gpumagic-profile",
        WATCH_STOP: "gpumagic-watch-result",
        WATCH_START: "gpumagic-watch-stopped",  # the live chart, frozen into one line at the stop
    }
    for index, kind in kinds.items():
        outputs = html_outputs(shared, index)
        assert len(outputs) == 1, (index, [o[:80] for o in outputs])
        assert f'class="gpumagic {kind}"' in outputs[0]
    for cell in shared.cells:
        for output in cell.get("outputs", []):
            html = output.get("data", {}).get("text/html", "")
            assert "<style" not in html and "<svg" not in html and "<script" not in html
            # widgets would need the live kernel: every live view ended as plain output
            assert "application/vnd.jupyter.widget-view+json" not in output.get("data", {})


def test_charts_are_svg_images_that_say_what_they_show(shared) -> None:
    profile = svg_images(html_outputs(shared, PROFILE)[0])
    watch = svg_images(html_outputs(shared, WATCH_STOP)[0])
    assert len(profile) >= 2  # the breakdown bar, the steps
    assert len(watch) == 2  # host CPU and RAM (no GPU here)
    for image in profile + watch:
        assert image.attrs["alt"] and image.attrs["alt"] == image.attrs["title"]
        assert int(image.attrs["width"]) > 0 and int(image.attrs["height"]) > 0
        assert "<rect" in image.svg or "<polyline" in image.svg
    assert any(i.attrs["alt"].startswith("host CPU") for i in watch)
    assert any(i.attrs.get("class") == "gm-timeline" for i in profile)


def test_text_plain_is_the_whole_report(shared) -> None:
    def plain(index: int) -> str:
        cell = shared.cells[index]
        return "".join(o["data"].get("text/plain", "") for o in cell.outputs if "data" in o)

    memtrace, profile, watch = plain(MEMTRACE), plain(PROFILE), plain(WATCH_STOP)
    assert "big = torch.ones(2**23)" in memtrace and "peak" in memtrace
    assert "Step-time breakdown" in profile and "Steps" in profile and "step " in profile
    # the charts' numbers in words where the text form has no chart
    assert re.search(r"host CPU .*: peak \d+%, mean \d+%", watch), watch
    assert "import time" in watch  # the cells table


def test_markdown_export_has_no_style_blocks_and_image_charts(shared) -> None:
    from nbconvert import MarkdownExporter

    body, _ = MarkdownExporter().from_notebook_node(shared)
    assert "<style" not in body and "<svg" not in body
    assert body.count("data:image/svg+xml;base64,") >= 4
    assert body.count('class="gpumagic gpumagic-') == 4


def test_latex_export_reads_each_report_as_text(shared) -> None:
    from nbconvert import LatexExporter

    body, _ = LatexExporter().from_notebook_node(shared)
    for words in ("\\%\\%memtrace", "Step-time breakdown", "gpuwatch summary", "big = torch.ones"):
        assert words in body, words
    # text, not HTML and not object reprs
    assert "<div" not in body and "<img" not in body and "&lt;gpumagic" not in body
    assert not re.search(r"<gpumagic\.|object at 0x", body)

