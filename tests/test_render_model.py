"""The one table model and the report sections: one declaration gives the text and the HTML
form, and the HTML keeps its meaning (alignment, highlights, bars, swatches) in ``style=``
attributes, which untrusted notebooks, GitHub and nbviewer keep when they drop ``<style>``."""

from __future__ import annotations

import math
import re

from gpumagic.render.sections import (
    Box,
    Bullets,
    Details,
    Figure,
    Heading,
    KeyValues,
    Paragraph,
    Report,
    only,
)
from gpumagic.render.table import Bar, Column, Table
from gpumagic.units import fmt_bytes, fmt_us

MIB = 2**20

ROWS = [
    {"name": "void kernel<float, 4>(float*)", "calls": 12, "us": 3200.0, "bytes": 64 * MIB},
    {"name": "aten::add", "calls": 3000, "us": 80.0, "bytes": -MIB},
    {"name": "aten::missing", "calls": 1, "us": math.nan, "bytes": 0},
]


def _table(**kw) -> Table:
    return Table(
        [
            Column("name", "name", align="code", chars=12, html_chars=20),
            Column("calls", "calls", lambda n: f"{n:,}"),
            Column("time", "us", fmt_us),
            Column("Δ", "bytes", lambda b: fmt_bytes(b, signed=True), bar=Bar(64 * MIB, "red")),
        ],
        ROWS,
        highlight=lambda r: "hot" if r["calls"] > 100 else ("error" if r["us"] != r["us"] else ""),
        **kw,
    )


def _cells(html: str, tag: str = "td") -> list[str]:
    return re.findall(rf"<{tag}[^>]*>(.*?)</{tag}>", html)


def test_one_table_two_forms_with_the_same_cells() -> None:
    text = _table().text()
    assert text[0].split() == ["name", "calls", "time", "Δ"]
    assert set(text[1]) == {"-", " "}
    # text: numbers right-aligned, long names cut with an ellipsis, missing values a dash
    assert text[2].startswith("void kernel…") and text[2].endswith("+64.0 MiB")
    assert "3,000" in text[3] and "80.0 µs" in text[3]
    assert "–" in text[4]
    html = _table().html()
    cells = _cells(html)
    assert len(cells) == 4 * len(ROWS)
    assert cells[0] == "void kernel&lt;float, …"  # escaped, cut at html_chars
    assert cells[1] == "12" and cells[2] == "3.2 ms" and cells[3].startswith("+64.0 MiB ")


def test_html_keeps_meaning_in_inline_styles() -> None:
    html = _table().html()
    for cell in re.findall(r"<t[hd][ >][^>]*>", html):  # <th ...>, <td ...> (not <thead>)
        assert re.search(r'style="text-align:(left|right)', cell), cell  # every cell aligned
    rows = re.findall(r"<tr[^>]*>", html)[1:]
    assert 'class="gm-hot"' in rows[1] and "background:" in rows[1]
    assert 'class="gm-error"' in rows[2] and "background:" in rows[2]
    assert "background:" not in rows[0]
    # the bar is drawn by inline styles alone, full for 64 MiB, a sliver for 1 MiB
    assert 'style="display:inline-block;height:9px;vertical-align:middle;width:60px;background:red"' in html
    assert "width:1px;background:red" in html
    # a cut name keeps its whole text as the tooltip (escaped)
    assert 'title="void kernel&lt;float, 4&gt;(float*)"' in html


def test_marks_name_highlighted_rows_in_text_only_where_asked() -> None:
    plain, marked = _table().text(), _table(marks=True).text()
    assert not plain[3].startswith("*")
    assert marked[2].startswith(" void") and marked[3].startswith("*aten") and marked[4].startswith("!aten")


def test_sortable_headers_sort_by_raw_values() -> None:
    html = _table(sortable=True).html()
    assert 'class="gm-table gm-sortable"' in html and html.count("onclick=") == 4
    values = re.findall(r'data-v="([^"]*)"', html)
    # raw values, not their text: 3.2 ms sorts as 3200 µs, a missing time as nothing (last)
    assert values[:4] == ["void kernel&lt;float, 4&gt;(float*)", "12", "3200.0", str(64 * MIB)]
    assert values[10] == ""
    assert "onclick" not in _table().html()


def test_swatch_and_colour_name_a_category_in_html_only() -> None:
    table = Table(
        [
            Column("category", "c", align="left", swatch=lambda c: {"Kernel": "#3b7dd8"}[c]),
            Column("why", "w", color=lambda w: "#d9534f" if w == "host_wait" else None),
        ],
        [{"c": "Kernel", "w": "host_wait"}],
    )
    assert table.text()[2].split() == ["Kernel", "host_wait"]
    html = table.html()
    assert '<span style="color:#3b7dd8">■</span> Kernel' in html
    assert '<span style="color:#d9534f">host_wait</span>' in html


def test_a_report_lists_its_sections_once_for_both_forms() -> None:
    report = Report(
        "demo",
        "%%demo",
        "a <sub>",
        [
            KeyValues([("peak", "1.0 GiB"), ("state", "bad")], warn=["state"]),
            Heading("Rows", "two of them"),
            _table(),
            Paragraph("it's a note", prefix="note: "),
            Figure("<svg></svg>", ["[chart as text]"]),
            only("html", Paragraph("HTML only")),
            only("text", Paragraph("text only")),
            Box([Paragraph("Out of memory", "plain"), KeyValues([("free", "0 B")], inline="")]),
            Bullets("What to try", ["smaller batch", "checkpointing"]),
            Details("packages", [Paragraph("torch 2.13", "plain")], open=True),
        ],
        warn="failed at line 3",
    )
    text = report.text()
    lines = text.splitlines()
    assert lines[0] == "%%demo: a <sub>  failed at line 3"
    assert "  peak: 1.0 GiB" in lines and "Rows: two of them" in lines
    assert "note: it's a note" in lines and "[chart as text]" in lines
    assert "text only" in lines and "HTML only" not in text
    assert lines[lines.index("Out of memory") + 1] == "  free 0 B"
    assert lines[lines.index("What to try:") + 1] == "  - smaller batch"
    assert "packages" in lines and "torch 2.13" in lines

    html = report.html()
    assert html.startswith('<div class="gpumagic gpumagic-demo">') and "<style>" in html
    assert "<style>" not in report.html(style=False)
    assert "%%demo" in html and "a &lt;sub&gt;" in html and "failed at line 3" in html
    assert '<span class="gm-warn" style="color:#b94a48">bad</span>' in html
    assert "<h4>Rows" in html and "it's a note" in html and "<svg></svg>" in html
    assert "HTML only" in html and "text only" not in html
    assert "<li>checkpointing</li>" in html and "<details open><summary>packages</summary>" in html
    # boxes and notes carry their look inline
    assert re.search(r'<div class="gm-box" style="border-left:3px solid #d9534f', html)
    assert re.search(r'<div class="gm-note" style="color:#888">it\'s a note', html)


def _sanitised(html: str) -> str:
    """What an untrusted notebook, GitHub or nbviewer keeps: no <style> block."""
    return re.sub(r"<style>.*?</style>", "", html, flags=re.S)


def test_memtrace_report_keeps_its_highlights_and_bars_without_the_style_block(run) -> None:
    r = run("%%memtrace\nimport torch\nbuf = torch.ones(2**24)\nsmall = [1, 2]\n")
    assert r.result.success, r.stdout
    html = _sanitised(r.html())
    hot = re.findall(r'<tr class="gm-hot" style="([^"]*)">', html)
    assert hot and all("background:" in s for s in hot)  # the 64 MiB line stays shaded
    assert re.search(r'<span class="gm-bar" style="display:inline-block;[^"]*width:60px', html)
    assert re.search(r'<div class="gm-kv" style="display:flex', html)  # pairs do not run together
    text = r.bundles[0]["text/plain"]
    marked = [line for line in text.splitlines() if line.startswith("*")]
    assert marked and "buf = torch.ones(2**24)" in marked[0]  # the same row, marked in text
