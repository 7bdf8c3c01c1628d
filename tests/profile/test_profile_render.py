"""Mime bundles, HTML escaping, the exported report, comparison, and the CLI."""

from __future__ import annotations

import html
import re

import pytest
from profile_helpers import trace_path
from svg_images import inline_svg

import gpumagic
from gpumagic.profile.cli import main


def test_mime_bundle_and_escaped_names(load):
    r = load("resnet50_v100_num_workers_0.json.gz")
    bundle = r._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    page = inline_svg(bundle["text/html"])  # the charts' drawings in place of their images
    assert page.startswith('<div class="gpumagic gpumagic-profile">')
    # kernel names carry templates: they must appear escaped, never as raw tags
    top = r.kernels["name"].iloc[0]
    assert "<" in top
    assert html.escape(top[:40]) in page
    assert "<float" not in page and "<4, at::native" not in page
    for tag in set(re.findall(r"<([a-zA-Z][a-zA-Z0-9]*)", page)):
        assert tag in {
            "div",
            "h4",
            "span",
            "b",
            "table",
            "thead",
            "tbody",
            "tr",
            "th",
            "td",
            "pre",
            "svg",
            "rect",
            "text",
            "title",
            "br",
            "style",
        }, tag
    assert "Findings" in page and 'data-rule="dataloader"' in page
    assert "<svg" in page and "GPU busy" in page  # the per-step timeline
    assert "host_wait" in page  # the idle section
    text = bundle["text/plain"]
    assert "DataLoader" in text and "Findings" in text
    assert str(r) == text
    assert "\n" not in repr(r) and repr(r).startswith("<ProfileResult: %%gpuprofile")


def test_rows_limits_the_tables(load):
    r = load("resnet50_v100_num_workers_0.json.gz")
    small, big = r.to_html(rows=3), r.to_html(rows=30)
    assert small.count("<tr") < big.count("<tr")
    assert len(r.to_text(rows=2)) < len(r.to_text(rows=20))


def test_export_writes_a_self_contained_report(load, tmp_path):
    r = load("a100_alexnet_syncs.json.gz")
    out = r.export(tmp_path / "report.html")
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert 'data-rule="sync"' in page
    assert page.rstrip().endswith("</html>")


def test_compare_resnet_pair_shows_the_dataloader_share_dropping(load):
    before = load("resnet50_v100_num_workers_0.json.gz")
    after = load("resnet50_v100_num_workers_4.json.gz")
    c = gpumagic.compare(before, after)
    bd = c.breakdown
    assert bd.loc["DataLoader", "a_percent"] == pytest.approx(22.92, abs=0.01)
    assert bd.loc["DataLoader", "b_percent"] == pytest.approx(0.20, abs=0.01)
    assert bd.loc["DataLoader", "delta_pp"] < -20
    step = c.table.loc["step_time_us"]
    assert step["delta"] == pytest.approx(142808.5 - 154911.3, abs=0.5)
    assert c.step_time_change_percent == pytest.approx(-7.8, abs=0.1)
    # The headline leads with the verdict on the median step time and its 95% interval (a
    # change is never shown without it): six steps a side, one of them slow, cannot tell a
    # step-time change from the noise; the DataLoader's drop lies well beyond it.
    assert c.headline.startswith("no difference beyond the noise: median step time 152 ms -> 123 ms")
    assert "-19% (95% CI " in c.headline
    assert c.headline.endswith("DataLoader 35.5 ms -> 292 µs per step")
    assert c.verdict == "no difference" and c.interval is not None
    assert c.interval[0] < 0 < c.interval[1]
    assert c.breakdown.loc["DataLoader", "verdict"] == "less"
    assert c.breakdown.loc["DataLoader", "delta_high_us"] < 0
    status = c.findings.set_index("rule")["status"]
    assert status["dataloader"] == "fixed"  # its category fell beyond the noise
    bundle = c._repr_mimebundle_()
    assert bundle["text/html"].startswith('<div class="gpumagic gpumagic-profile-compare">')
    assert "DataLoader 35.5 ms -&gt; 292 µs per step" in bundle["text/html"]
    assert c.headline in bundle["text/plain"]


def test_compare_accepts_paths():
    c = gpumagic.compare(
        trace_path("two_ranks/rank-0.json.gz"), trace_path("two_ranks/rank-1.json.gz")
    )
    assert c.names == ("rank-0", "rank-1")
    assert c.table.loc["step_time_us", "delta"] == pytest.approx(619271.5 - 615120.0, abs=0.5)


def test_cli_prints_the_summary_and_writes_html(tmp_path, capsys):
    out = tmp_path / "r.html"
    code = main(
        [
            "analyze",
            str(trace_path("resnet50_v100_num_workers_0.json.gz")),
            "--html",
            str(out),
            "--rows",
            "3",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "Step-time breakdown" in printed and "dataloader" in printed
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert f"HTML report: {out}" in printed


def test_cli_reports_bad_input_without_a_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main([str(bad)]) == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err
    assert main([str(tmp_path / "missing.json")]) == 1


def test_lazy_public_names_and_cheap_import():
    import subprocess
    import sys

    code = (
        "import sys, gpumagic; "
        "assert 'pandas' not in sys.modules and 'numpy' not in sys.modules and 'msgspec' not in sys.modules; "
        "import gpumagic.profile; "
        "assert 'pandas' not in sys.modules and 'msgspec' not in sys.modules; "
        "from gpumagic.profile.load import load_trace; "
        "assert gpumagic.load_trace is load_trace; "
        "from gpumagic.profile.compare import compare; assert gpumagic.compare is compare"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_report_keeps_its_meaning_without_the_style_block(load):
    """Untrusted notebooks, GitHub and nbviewer drop <style>: alignment, swatches, the
    findings' severity edges and the slowest rank's row must be in style= attributes."""
    r = load("two_ranks")
    page = re.sub(r"<style>.*?</style>", "", r.to_html(), flags=re.S)
    cells = re.findall(r"<t[hd][ >][^>]*>", page)
    assert cells and all("text-align:" in c for c in cells)
    assert re.search(r'<tr class="gm-hot" style="background:[^"]+">', page)  # the slowest rank
    assert '<span style="color:#3b7dd8">■</span> Kernel' in page  # breakdown table's swatch
    boxes = re.findall(r'<div class="gm-box gm-finding"[^>]*>', page)
    assert len(boxes) == len(r.findings) > 0
    assert all("border-left:3px solid #" in box for box in boxes)
    # the operator and kernel tables are one declaration: the same rows in both forms
    text = r.to_text(rows=5)
    top = r.kernels["name"].iloc[0]
    assert top[:40] in text and html.escape(top[:40]) in page
