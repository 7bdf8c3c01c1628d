"""A notebook someone else ran, opened untrusted in JupyterLab and in Notebook 7.

``%%memtrace``, ``%%gpuprofile`` and ``%gpuwatch`` run in a real kernel (nbclient) and the
notebook is saved unsigned (``tests/shared_notebook.py``), as every notebook one receives
is: the front end sanitises its HTML, dropping ``<style>`` blocks and inline ``<svg>``. In
both front ends, every chart must be a visible image of non-zero size, the bars and the
highlighted rows must show, and no text may run into the next (table cells, label: value
pairs, legend items stay apart), which is what an untrusted notebook looked like before:
the charts' texts ran together and the bars were gone. A control output added to the
notebook shows that the page measured is sanitised indeed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from shared_notebook import MEMTRACE, PROFILE, WATCH_STOP, execute

if TYPE_CHECKING:
    from conftest import LabPage

pytestmark = pytest.mark.browser

# What the page shows, measured in the page: every gpumagic output of the notebook panel.
MEASURE_JS = r"""
(panel) => {
  const out = {reports: [], images: [], bars: [], rows: [], apart: [], together: [], svg: 0, style: 0};
  const reports = panel.querySelectorAll('.jp-OutputArea-output .gpumagic');
  for (const r of reports) { out.reports.push(r.className); }
  out.svg = panel.querySelectorAll('.jp-OutputArea-output .gpumagic svg').length;
  out.style = panel.querySelectorAll('.jp-OutputArea-output style').length;
  for (const img of panel.querySelectorAll('.gpumagic img')) {
    const b = img.getBoundingClientRect();
    out.images.push({
      cls: img.className, alt: img.alt, complete: img.complete, natural: img.naturalWidth,
      w: b.width, h: b.height, src: (img.getAttribute('src') || '').slice(0, 26),
    });
  }
  for (const bar of panel.querySelectorAll('.gpumagic .gm-bar')) {
    const b = bar.getBoundingClientRect();
    out.bars.push({w: b.width, h: b.height, bg: getComputedStyle(bar).backgroundColor});
  }
  for (const tr of panel.querySelectorAll('.gpumagic tr.gm-hot, .gpumagic tr.gm-error')) {
    out.rows.push(getComputedStyle(tr).backgroundColor);
  }
  // Text boxes that must stay apart: the cells of a table row, the label: value pairs of a
  // summary line, the items of a chart's legend.
  const groups = [];
  for (const tr of panel.querySelectorAll('.gpumagic tr')) { groups.push(Array.from(tr.children)); }
  for (const kv of panel.querySelectorAll('.gpumagic .gm-kv')) { groups.push(Array.from(kv.children)); }
  for (const lg of panel.querySelectorAll('.gpumagic .gm-stack + .gm-note')) { groups.push(Array.from(lg.children)); }
  for (const group of groups) {
    const boxes = [];
    for (const el of group) {
      const range = document.createRange();
      range.selectNodeContents(el);
      const r = range.getBoundingClientRect();
      const text = el.innerText.trim();
      if (text && r.right > r.left) { boxes.push({text, l: r.left, r: r.right, t: r.top, b: r.bottom}); }
    }
    for (let i = 0; i + 1 < boxes.length; i++) {
      const a = boxes[i], c = boxes[i + 1];
      const sameLine = Math.min(a.b, c.b) - Math.max(a.t, c.t) > 2;
      if (!sameLine) { continue; }
      out.apart.push(c.l - a.r);
      if (c.l - a.r < 3) { out.together.push([a.text.slice(0, 40), c.text.slice(0, 40), c.l - a.r]); }
    }
  }
  return out;
}
"""

IMAGES_LOADED_JS = """
(panel) => Array.from(panel.querySelectorAll('.gpumagic img')).every(i => i.complete && i.naturalWidth > 0)
"""


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The notebook, run once for both front ends."""
    return execute(tmp_path_factory.mktemp("shared-run") / "shared.ipynb")


# A control output: what the front end does to an untrusted notebook's HTML, so the test
# knows the page it measures is sanitised (inline <svg> and <style> gone, style= kept).
CONTROL_HTML = (
    '<div class="sanitiser-control"><style>.sanitiser-control{color:red}</style>'
    '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10"/></svg>'
    '<span style="color:rgb(1, 2, 3)">kept</span></div>'
)
CONTROL_JS = """
(panel) => {
  const c = panel.querySelector('.sanitiser-control');
  if (!c) { return null; }
  const span = c.querySelector('span');
  return {svg: c.querySelectorAll('svg').length, style: c.querySelectorAll('style').length,
          color: span ? getComputedStyle(span).color : null};
}
"""


def _with_control(executed: Path, target: Path) -> None:
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    cell = nbformat.v4.new_code_cell("# a control output, written by the test")
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": CONTROL_HTML})]
    nb.cells.append(cell)
    nbformat.write(nb, target)


@pytest.mark.parametrize("frontend", ["lab", "nb7"])
def test_shared_notebook_reads_untrusted(frontend: str, executed: Path, request: Any) -> None:
    ui: LabPage = request.getfixturevalue(frontend)
    name = f"shared_{frontend}.ipynb"
    _with_control(executed, ui.server.root_dir / name)
    ui.open_notebook(name)
    trusted = ui.trusted()
    assert trusted and not any(trusted), f"the notebook should open untrusted: {trusted}"
    ui.wait_output(len(trusted) - 1, ".sanitiser-control", timeout=30)
    for index, kind in ((MEMTRACE, "memtrace"), (PROFILE, "profile"), (WATCH_STOP, "watch-result")):
        ui.wait_output(index, f".gpumagic-{kind}", timeout=30)
    panel = ui.panel.element_handle()
    control = ui.page.evaluate(CONTROL_JS, panel)
    assert control == {"svg": 0, "style": 0, "color": "rgb(1, 2, 3)"}, control
    ui.page.wait_for_function(IMAGES_LOADED_JS, arg=panel, timeout=20_000)
    seen = ui.page.evaluate(MEASURE_JS, panel)

    # what a sanitiser drops is not there to drop
    assert seen["svg"] == 0 and seen["style"] == 0, seen
    assert {"gpumagic gpumagic-memtrace", "gpumagic gpumagic-profile", "gpumagic gpumagic-watch-result"} <= set(
        seen["reports"]
    ), seen["reports"]
    # every chart a visible image of non-zero size (breakdown, steps, host CPU and RAM)
    images = seen["images"]
    assert len(images) >= 4, images
    for image in images:
        assert image["src"].startswith("data:image/svg+xml;base64"), image
        assert image["complete"] and image["natural"] > 0, image
        assert image["w"] > 20 and image["h"] > 5, image
        assert image["alt"], image
    assert any(i["cls"] == "gm-timeline" for i in images) and any(
        i["alt"].startswith("host CPU") for i in images
    ), images
    # the bars show: drawn wide and coloured (the memtrace and lines tables, the module tree)
    drawn = [b for b in seen["bars"] if b["w"] >= 1 and b["h"] >= 5]
    assert len(drawn) >= 5 and any(b["w"] >= 30 for b in drawn), seen["bars"]
    assert all(b["bg"] not in ("", "rgba(0, 0, 0, 0)", "transparent") for b in drawn), seen["bars"]
    # the heaviest statements stay shaded (the style= colour, not the theme's stripes)
    assert seen["rows"] and all("217, 83, 79" in bg for bg in seen["rows"]), seen["rows"]
    # no text runs into the next
    assert len(seen["apart"]) >= 50, "too few neighbouring text boxes measured"
    assert not seen["together"], seen["together"]

    for index, label in ((MEMTRACE, "memtrace"), (PROFILE, "profile"), (WATCH_STOP, "watch")):
        cell = ui.cell(index)
        cell.evaluate("el => el.scrollIntoView({block: 'start'})")
        shot = ui.screenshot(f"untrusted-{label}", full_page=False)
        print(f"\n{frontend} {label}: {shot}")
        assert shot.stat().st_size > 0
