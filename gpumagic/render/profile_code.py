"""The parts of a ``%%gpuprofile`` report that speak the user's code: time per line of the
cell, per ``nn.Module`` (a collapsible tree in HTML, the top modules in text), where each
finding points."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpumagic.render.html import bar, escape, table, text_table
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
    return name if len(name) <= n else name[: n - 1] + "…"


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
    return not r.summary["cpu_only"]


# --- lines -------------------------------------------------------------------------------


def _lines_title(r: ProfileResult, lines: pd.DataFrame) -> str:
    from gpumagic.profile.analysis.lines import line_attribution

    total = float(lines["host_us"].sum())
    span = line_attribution(r.primary).profiled_us
    text = f"host time {fmt_us(total)} in all, of the {fmt_us(span)} the statements spanned"
    return text + ("; GPU time by the line that launched it" if _has_gpu(r) else "")


def lines_text(r: ProfileResult) -> list[str]:
    lines = r.lines
    if lines.empty:
        return ["", r.lines_note] if r.lines_note else []
    gpu = _has_gpu(r)
    headers = ["line", "hits", "host", "host %"]
    headers += ["device", "device %", "top kernel"] if gpu else []
    headers += ["top op", "source"]
    body = []
    for x in lines.itertuples():
        row = [str(x.line), fmt_count(x.hits), fmt_us(x.host_us), fmt_percent(x.host_percent)]
        if gpu:
            row += [fmt_us(x.device_us), fmt_percent(x.device_percent), shorten(x.top_kernel, 30)]
        row += [shorten(x.top_op, 30), shorten("  " * int(x.depth) + first_line(x.source), 70)]
        body.append(row)
    left = [i for i, h in enumerate(headers) if h in ("top kernel", "top op", "source")]
    return [
        "",
        f"Lines of the cell: {_lines_title(r, lines)}",
        text_table(headers, body, left=left),
    ]


def lines_html(r: ProfileResult) -> str:
    lines = r.lines
    if lines.empty:
        return (
            f"<div class='gm-note gm-lines-note'>{escape(r.lines_note)}</div>"
            if r.lines_note
            else ""
        )
    gpu = _has_gpu(r)
    host_max = max(float(lines["host_us"].max()), 1e-9)
    dev_max = max(float(lines["device_us"].max()), 1e-9)
    hot = int(np.argmax(lines["device_us"] if gpu and dev_max > 1e-9 else lines["host_us"]))
    headers = ["line", "statement", "hits", "host time"]
    headers += ["GPU time", "GPU share", "top kernel"] if gpu else []
    headers += ["top operator"]
    rows, keys, titles, classes = [], [], [], []
    for i, x in enumerate(lines.itertuples()):
        src = escape("    " * int(x.depth) + first_line(x.source))
        cells = [
            str(x.line),
            src,
            fmt_count(x.hits),
            f"{fmt_us(x.host_us)} {bar(x.host_us / host_max, HOST_COLOR, 60)}",
        ]
        key: list[object] = [x.line, x.source, x.hits, x.host_us]
        if gpu:
            cells += [
                f"{fmt_us(x.device_us)} {bar(x.device_us / dev_max, DEVICE_COLOR, 60)}",
                fmt_percent(x.device_percent),
                escape(shorten(x.top_kernel, _OP_CHARS)),
            ]
            key += [x.device_us, x.device_percent, x.top_kernel]
        cells.append(escape(shorten(x.top_op, _OP_CHARS)))
        key.append(x.top_op)
        rows.append(cells)
        keys.append(key)
        titles.append(x.source)
        classes.append("gm-hot" if i == hot else "")
    code = [1] + ([6, 7] if gpu else [4])
    return f"<h4>Lines <span class='gm-sub'>{escape(_lines_title(r, lines))}</span></h4>" + table(
        headers, rows, code=code, row_classes=classes, title_attr=titles, sort_keys=keys
    )


# --- modules -----------------------------------------------------------------------------


def _module_note(r: ProfileResult) -> str:
    from gpumagic.profile.analysis.modules import ORIGIN_NOTES, module_attribution

    return ORIGIN_NOTES.get(module_attribution(r.primary).origin, "")


def _module_total(m: pd.DataFrame, gpu: bool) -> pd.Series:
    if gpu:
        return m["forward_device_us"] + m["backward_device_us"]
    return m["forward_host_us"] + m["backward_host_us"]


def modules_text(r: ProfileResult, rows: int) -> list[str]:
    m = r.modules
    if m.empty:
        return []
    gpu = _has_gpu(r)
    top = m.assign(_t=_module_total(m, gpu)).sort_values("_t", ascending=False, kind="stable")
    headers = ["module", "type", "calls", "fwd host", "bwd host"]
    headers += ["fwd device", "bwd device"] if gpu else []
    body = []
    for x in top.head(rows).itertuples():
        row = [
            shorten(str(x.module), 50),
            shorten(str(x.type), 20),
            fmt_count(x.calls),
            fmt_us(x.forward_host_us),
            fmt_us(x.backward_host_us),
        ]
        if gpu:
            row += [fmt_us(x.forward_device_us), fmt_us(x.backward_device_us)]
        body.append(row)
    return [
        "",
        f"Top modules (of {fmt_count(len(m))}; inclusive of children; {_module_note(r)})",
        text_table(headers, body, left=[0, 1]),
    ]


def modules_html(r: ProfileResult) -> str:
    m = r.modules
    if m.empty:
        return ""
    gpu = _has_gpu(r)
    total = _module_total(m, gpu).to_numpy()
    scale = max(float(total.max()), 1e-9)
    children: dict[str, list[int]] = {}
    for i, parent in enumerate(m["parent"].tolist()):
        children.setdefault(str(parent), []).append(i)
    shown = 0

    def node(i: int) -> str:
        nonlocal shown
        shown += 1
        x = m.iloc[i]
        times = [f"fwd {fmt_us(x.forward_host_us)}", f"bwd {fmt_us(x.backward_host_us)}"]
        if gpu:
            times = [
                f"GPU fwd {fmt_us(x.forward_device_us)}",
                f"bwd {fmt_us(x.backward_device_us)}",
                f"host fwd {fmt_us(x.forward_host_us)}",
                f"bwd {fmt_us(x.backward_host_us)}",
            ]
        label = (
            f"{bar(total[i] / scale, DEVICE_COLOR if gpu else HOST_COLOR, 60)} "
            f"<code>{escape(x.module)}</code> <span class='gm-sub'>{escape(x.type)} · "
            f"{fmt_count(x.calls)} calls · {escape(' · '.join(times))}</span>"
        )
        kids = children.get(str(x.module), [])
        if not kids:
            return f"<div class='gm-module' style='margin-left:14px'>{label}</div>"
        inner = []
        for k in kids:
            if shown >= MAX_TREE_NODES:
                inner.append(
                    f"<div class='gm-note'>… {len(m) - shown} more modules in .modules</div>"
                )
                break
            inner.append(node(k))
        opened = " open" if int(x.depth) < 1 else ""
        return (
            f"<details class='gm-module'{opened}><summary>{label}</summary>"
            f"<div style='margin-left:14px'>{''.join(inner)}</div></details>"
        )

    roots = [node(i) for i in children.get("", []) if shown < MAX_TREE_NODES]
    what = "GPU time" if gpu else "host time"
    return (
        f"<h4>Modules <span class='gm-sub'>{fmt_count(len(m))} modules; bars: forward + backward "
        f"{what}, inclusive of children; {escape(_module_note(r))}</span></h4>" + "".join(roots)
    )


# --- comparison --------------------------------------------------------------------------
