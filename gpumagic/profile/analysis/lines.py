"""Time per line of a profiled cell: host time, GPU time, hit counts, top operator and kernel.

Every statement of a ``%%gpuprofile`` cell ran inside a profiler range of its own (see
:mod:`gpumagic.profile.record.probe`), and at most one was open at any instant, so the ranges
tile the cell: a statement's ``host_us`` is the sum of its ranges and excludes the
statements nested in it (a loop's body has rows of its own), and the rows add up to the
time the statements spanned, less the probe's own few microseconds between ranges.

GPU work is charged to the statement whose range contains the runtime call that launched
it (correlation id -> launch), whatever thread made the call: the kernels autograd's
device threads launch during ``loss.backward()`` belong to that line, the kernels that
run long after an asynchronous launch still belong to the line that launched them.
Operators on any thread are charged by their start.

The table counts the steps the step statistics count (see
:attr:`~gpumagic.profile.analysis.trace_analysis.Analysis.window`): statements that ran
before the first analysed step (the first-call setup step ``%%gpuprofile`` leaves out, the
code before the loop) or after the last one are not in it.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
import pandas as pd

from gpumagic.profile.analysis.trace_analysis import Analysis
from gpumagic.profile.trace.model import KERNEL
from gpumagic.profile.trace.spans import CodeSpans, StatementLabel

LINE_COLUMNS = [
    "line",
    "source",
    "hits",
    "host_us",
    "host_percent",
    "device_us",
    "device_percent",
    "top_op",
    "top_kernel",
    "depth",
    "statement",
]

NO_LINES_NOTE = (
    "No per-line times: this trace has no statement ranges. %%gpuprofile opens one around "
    "each statement of the cell it runs; a trace recorded elsewhere has none."
)


def argmax_per_group(
    group: np.ndarray, item: np.ndarray, weight: np.ndarray, n_groups: int
) -> np.ndarray:
    """For each group ``0..n_groups-1``, the item with the largest summed weight (-1: none
    with a positive weight). Sorting pairs, not a dense groups x items table."""
    out = np.full(n_groups, -1, np.int64)
    if not len(group):
        return out
    width = int(item.max()) + 1
    pairs, inverse = np.unique(group.astype(np.int64) * width + item, return_inverse=True)
    totals = np.bincount(inverse.reshape(-1), weights=weight)
    g, it = pairs // width, pairs % width
    order = np.lexsort((-totals, g))
    first = order[np.r_[True, g[order][1:] != g[order][:-1]]]
    keep = first[totals[first] > 0]
    out[g[keep]] = it[keep]
    return out


_EMPTY: dict[tuple[str, ...], pd.DataFrame] = {}


def empty_frame(columns: list[str], text: tuple[str, ...]) -> pd.DataFrame:
    """An empty table with these columns (``text`` ones of strings, the others numbers);
    built once: most traces have no lines, and pandas takes a millisecond to build one."""
    key = tuple(columns)
    if key not in _EMPTY:
        _EMPTY[key] = pd.DataFrame(
            {c: pd.Series(dtype=object if c in text else float) for c in columns}
        )
    return _EMPTY[key].copy()


class LineAttribution:
    """Per-statement numbers of one analysed trace (see the module docstring)."""

    def __init__(self, analysis: Analysis) -> None:
        self.a = analysis
        self.code: CodeSpans = analysis.trace.code
        spans = self.code.statements.within(*analysis.window)
        order = np.argsort(spans.ts, kind="stable")
        self._ts, self._end, self._key = spans.ts[order], spans.end[order], spans.key[order]
        # statement index -> row of the frame, in the cell's order
        self.keys = np.unique(spans.key)
        self._span_row = np.searchsorted(self.keys, self._key)  # frame row of each span
        labels = self.code.labels
        self._labels = {s.index: s for s in labels.statements} if labels is not None else {}

    def __bool__(self) -> bool:
        return len(self.keys) > 0

    @property
    def profiled_us(self) -> float:
        """From the first statement's start to the last one's end."""
        return float(self._end.max() - self._ts.min()) if len(self._ts) else 0.0

    def rows_at(self, ts: np.ndarray) -> np.ndarray:
        """Frame row of the statement running at each time (-1 outside every statement)."""
        out = np.full(len(ts), -1, np.int64)
        if not len(self._ts) or not len(ts):
            return out
        k = np.searchsorted(self._ts, ts, side="right") - 1
        ok = (k >= 0) & (ts <= self._end[np.maximum(k, 0)])
        out[ok] = self._span_row[k[ok]]
        return out

    @cached_property
    def gpu_rows(self) -> np.ndarray:
        """Frame row of the statement that launched each GPU event (-1: none)."""
        return self.rows_at(self.a.launch_ts)

    @cached_property
    def runtime_rows(self) -> np.ndarray:
        return self.rows_at(self.a.trace.runtime.ts)

    @cached_property
    def host_rows(self) -> np.ndarray:
        return self.rows_at(self.a.trace.host.ts)

    def label(self, row: int) -> StatementLabel:
        """Line, depth and source of the statement at frame ``row``."""
        index = int(self.keys[row])
        found = self._labels.get(index)
        if found is not None:
            return found
        return StatementLabel(index, self.code.statement_lines.get(index, -1), 0, "")

    def frame(self) -> pd.DataFrame:
        """The table (computed once; callers get a copy to keep or change)."""
        return self._frame.copy()

    @cached_property
    def _frame(self) -> pd.DataFrame:
        n = len(self.keys)
        if n == 0:
            return empty_frame(LINE_COLUMNS, ("source", "top_op", "top_kernel"))
        trace = self.a.trace
        gpu, host = trace.gpu, trace.host
        key_row = self._span_row
        hits = np.bincount(key_row, minlength=n)
        host_us = np.bincount(key_row, weights=self._end - self._ts, minlength=n)
        g_rows = self.gpu_rows
        g_dur = gpu.end - gpu.ts
        ok = g_rows >= 0
        device_us = np.bincount(g_rows[ok], weights=g_dur[ok], minlength=n)
        all_gpu_us = float(g_dur[self.a.gpu_in_window].sum())
        kernel = ok & (gpu.kind == KERNEL)
        top_kernel = argmax_per_group(g_rows[kernel], gpu.name.codes[kernel], g_dur[kernel], n)
        # operators: device time they launched themselves, else host self time
        ops = self.a.op_rows
        h_rows = self.host_rows[ops]
        in_line = h_rows >= 0
        ops, h_rows = ops[in_line], h_rows[in_line]
        codes = host.name.codes[ops]
        dev_self = self.a.device_time[0][ops]
        top_dev = argmax_per_group(h_rows, codes, dev_self, n)
        top_host = argmax_per_group(h_rows, codes, self.a.host_self[ops], n)
        top_op = np.where(top_dev >= 0, top_dev, top_host)
        labels = [self.label(i) for i in range(n)]
        total_host = float(host_us.sum())
        frame = pd.DataFrame(
            {
                "line": [s.line for s in labels],
                "source": [s.source for s in labels],
                "hits": hits.astype(np.int64),
                "host_us": host_us,
                "host_percent": 100.0 * host_us / total_host if total_host > 0 else 0.0,
                "device_us": device_us,
                "device_percent": 100.0 * device_us / all_gpu_us if all_gpu_us > 0 else 0.0,
                "top_op": [host.name.values[c] if c >= 0 else "" for c in top_op.tolist()],
                "top_kernel": [gpu.name.values[c] if c >= 0 else "" for c in top_kernel.tolist()],
                "depth": [s.depth for s in labels],
                "statement": self.keys.astype(np.int64),
            },
            columns=LINE_COLUMNS,
        )
        return frame


def line_attribution(analysis: Analysis) -> LineAttribution:
    """The per-line attribution of ``analysis``, made once and kept on it."""
    return analysis.memo("LineAttribution", lambda: LineAttribution(analysis))
