"""The parts of a ``%%gpuprofile`` report that speak the user's code: time per line of the
cell, per ``nn.Module`` (a collapsible tree in HTML, the top modules in text), where each
finding points."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpumagic.render.html import NOTE_STYLE, bar, escape
from gpumagic.render.sections import Heading, Paragraph, Section, only, sub_span
from gpumagic.render.table import Bar, Column, Table, cut
from gpumagic.units import fmt_count, fmt_percent, fmt_us

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.profile.result import ProfileResult
    from gpumagic.profile.rules.base import Finding

HOST_COLOR = "#5cb85c"
DEVICE_COLOR = "#3b7dd8"
_OP_CHARS = 40
MAX_TREE_NODES = 400  # past this the module tree is cut (a model of thousands of modules)


def shorten(name: str, n: int) -> str:
    return cut(name, n)


def first_line(source: str) -> str:
    first = source.splitlines()[0] if source else ""
    return first + (" …" if "\n" in source else "")


def where_text(f: Finding) -> str:
    """``line 4 · `x = x.cuda()` · module model.fc`` ("" when the finding names no place)."""
    parts = []
    if f.line is not None:
        parts.append(f"line {f.line} · `{first_line(f.source)}`" if f.source else f"line {f.line}")
    if f.module:
        parts.append(f"module {f.module}")
    return " · ".join(parts)


def where_html(f: Finding) -> str:
    parts = []
    if f.line is not None:
        code = f" · <code>{escape(first_line(f.source))}</code>" if f.source else ""
        parts.append(f"<b>line {f.line}</b>{code}")
    if f.module:
        parts.append(f"module <code>{escape(f.module)}</code>")
    if not parts:
        return ""
    return f'<div class="gm-where">{" · ".join(parts)}</div>'


def _has_gpu(r: ProfileResult) -> bool:
    return not r.summary.cpu_only


# --- lines -------------------------------------------------------------------------------


def _lines_title(r: ProfileResult, lines: pd.DataFrame) -> str:
    total = float(lines["host_us"].sum())
    text = f"host time {fmt_us(total)} in all, of the {fmt_us(r.lines_span_us)} the statements spanned"
    return text + ("; GPU time by the line that launched it" if _has_gpu(r) else "")


def lines_sections(r: ProfileResult) -> list[Section]:
    """Each statement of the cell: hits, host time, the GPU time it launched, its top
    operator and kernel; the heaviest line highlighted (GPU time first, where there is one)."""
    lines = r.lines
    if lines.empty:
        note = Paragraph(r.lines_note, css="gm-lines-note")
        return [Heading("Lines of the cell"), note] if r.lines_note else []
    gpu = _has_gpu(r)
    host_max = max(float(lines["host_us"].max()), 1e-9)
    dev_max = max(float(lines["device_us"].max()), 1e-9)
    hot = int(np.argmax(lines["device_us"] if gpu and dev_max > 1e-9 else lines["host_us"]))
    rows = [{**row, "hot": i == hot} for i, row in enumerate(lines.to_dict("records"))]
    columns = [
        Column("line", "line"),
        Column(
            "statement",
            lambda x: "    " * int(x["depth"]) + first_line(x["source"]),
            align="code",
            chars=60,
            tooltip=lambda x: x["source"],
        ),
        Column("hits", "hits", fmt_count),
        Column("host time", "host_us", fmt_us, bar=Bar(host_max, HOST_COLOR)),
        Column("host share", "host_percent", fmt_percent),
    ]
    if gpu:
        columns += [
            Column("GPU time", "device_us", fmt_us, bar=Bar(dev_max, DEVICE_COLOR)),
            Column("GPU share", "device_percent", fmt_percent),
            Column("top kernel", "top_kernel", align="code", chars=30, html_chars=_OP_CHARS),
        ]
    columns.append(Column("top operator", "top_op", align="code", chars=30, html_chars=_OP_CHARS))
    table = Table(columns, rows, highlight=lambda x: "hot" if x["hot"] else "", sortable=True)
    return [Heading("Lines of the cell", _lines_title(r, lines)), table]


# --- modules -----------------------------------------------------------------------------


def _module_total(m: pd.DataFrame, gpu: bool) -> pd.Series:
    if gpu:
        return m["forward_device_us"] + m["backward_device_us"]
    return m["forward_host_us"] + m["backward_host_us"]


def _top_modules(m: pd.DataFrame, gpu: bool, rows: int) -> Table:
    top = m.assign(_t=_module_total(m, gpu)).sort_values("_t", ascending=False, kind="stable")
    columns = [
        Column("module", "module", align="code", chars=50),
        Column("type", "type", align="left", chars=20),
        Column("calls", "calls", fmt_count),
        Column("fwd host", "forward_host_us", fmt_us),
        Column("bwd host", "backward_host_us", fmt_us),
    ]
    if gpu:
        columns += [
            Column("fwd device", "forward_device_us", fmt_us),
            Column("bwd device", "backward_device_us", fmt_us),
        ]
    return Table(columns, top.head(rows).to_dict("records"))


@dataclass
class ModuleTree:
    """Every module as a tree in HTML (bars: forward + backward time, inclusive of children;
    the first level open), cut at :data:`MAX_TREE_NODES`."""

    modules: pd.DataFrame
    gpu: bool

    def text(self) -> list[str]:
        return []

    def html(self) -> str:
        m, gpu = self.modules, self.gpu
        total = _module_total(m, gpu).to_numpy()
        scale = max(float(total.max()), 1e-9)
        children: dict[str, list[int]] = {}
        for i, parent in enumerate(m["parent"].tolist()):
            children.setdefault(str(parent), []).append(i)
        records = m.to_dict("records")
        shown = 0

        def node(i: int) -> str:
            nonlocal shown
            shown += 1
            x = records[i]
            label = (
                f"{bar(total[i] / scale, DEVICE_COLOR if gpu else HOST_COLOR, 60)} "
                f"<code>{escape(x['module'])}</code>"
                + sub_span(f"{x['type']} · {fmt_count(x['calls'])} calls · {_times(x, gpu)}")
            )
            kids = children.get(str(x["module"]), [])
            if not kids:
                return f"<div class='gm-module' style='margin-left:14px'>{label}</div>"
            inner = []
            for k in kids:
                if shown >= MAX_TREE_NODES:
                    more = f"… {len(m) - shown} more modules in .modules"
                    inner.append(f"<div class='gm-note' style='{NOTE_STYLE}'>{more}</div>")
                    break
                inner.append(node(k))
            opened = " open" if int(x["depth"]) < 1 else ""
            return (
                f"<details class='gm-module'{opened}><summary>{label}</summary>"
                f"<div style='margin-left:14px'>{''.join(inner)}</div></details>"
            )

        return "".join(node(i) for i in children.get("", []) if shown < MAX_TREE_NODES)


def _times(x: dict[str, Any], gpu: bool) -> str:
    host = f"fwd {fmt_us(x['forward_host_us'])} · bwd {fmt_us(x['backward_host_us'])}"
    if not gpu:
        return host
    return (
        f"GPU fwd {fmt_us(x['forward_device_us'])} · bwd {fmt_us(x['backward_device_us'])} · "
        f"host {host}"
    )


def modules_sections(r: ProfileResult, rows: int) -> list[Section]:
    """The modules: a tree of all of them in HTML, the top ``rows`` by time in text."""
    m = r.modules
    if m.empty:
        return []
    gpu = _has_gpu(r)
    what = "GPU time" if gpu else "host time"
    return [
        only(
            "html",
            Heading(
                "Modules",
                f"{fmt_count(len(m))} modules; bars: forward + backward {what}, inclusive of "
                f"children; {r.modules_note}",
            ),
        ),
        only(
            "text",
            Heading(
                f"Top modules (of {fmt_count(len(m))}; inclusive of children; {r.modules_note})"
            ),
        ),
        ModuleTree(m, gpu),
        only("text", _top_modules(m, gpu, rows)),
    ]
