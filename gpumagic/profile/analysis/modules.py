"""Time per ``nn.Module``: forward and backward, host and GPU, inclusive of children.

Forward: each module call is a span in the trace (``%%gpuprofile``'s module hooks, or the
``nn.Module: Linear_0`` frames of a ``with_stack=True`` trace), and what the span holds on
its thread is the call's: its duration, and the GPU work launched by runtime calls inside
it. Spans nest, so a module's numbers include its children's.

Backward: autograd runs a module's backward long after its forward, on another thread, so
no span holds it. The trace links the two instead: a backward node's op
(``autograd::engine::evaluate_function: AddmmBackward0``, "Fwd thread id" > 0) carries the
``Sequence number`` of the forward op that created it (PyTorch's ``fwdbwd`` flow arrows
join the same pairs). The forward op sits in the innermost module span around it; the
node's duration and the GPU work launched inside it go to that module and the modules
around it.

Like every table, it counts the analysed steps (the analysis's ``window``): module calls and
backward nodes that started before the first analysed step or after the last one are left
out.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
import pandas as pd

from gpumagic.profile.analysis import tree
from gpumagic.profile.analysis.lines import empty_frame
from gpumagic.profile.analysis.trace_analysis import Analysis
from gpumagic.profile.trace.spans import CodeSpans, torch_module_type

MODULE_COLUMNS = [
    "module",
    "type",
    "calls",
    "depth",
    "forward_host_us",
    "forward_device_us",
    "backward_host_us",
    "backward_device_us",
    "parent",
]

ORIGIN_NOTES = {
    "gpumagic": "modules named as the notebook's namespace names them",
    "with_stack": (
        "modules from the trace's with_stack=True frames: the profiler names instances "
        "Type_N, not as the code names them"
    ),
}


class ModuleAttribution:
    """Per-module numbers of one analysed trace (see the module docstring)."""

    def __init__(self, analysis: Analysis) -> None:
        self.a = analysis
        self.code: CodeSpans = analysis.trace.code
        self.spans = spans = self.code.modules.within(*analysis.window)
        self.keys = np.unique(spans.key)
        self._span_row = np.searchsorted(self.keys, spans.key)  # frame row per span

    def __bool__(self) -> bool:
        return len(self.keys) > 0

    @property
    def origin(self) -> str:
        return self.code.module_origin

    @cached_property
    def _links(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(parent span of each span, innermost span around each runtime call's start,
        forward-op rows with a sequence number, innermost span around each of those)."""
        trace = self.a.trace
        spans, rt, host = self.spans, trace.runtime, trace.host
        seq, fwd_thread = host.sequence()
        forward = np.flatnonzero((seq >= 0) & (fwd_thread <= 0))
        m, n_rt = len(spans), len(rt.ts)
        # runtime calls and forward ops as points: nothing nests in a point, so each finds
        # the innermost module span around it on its own thread
        par = tree.parents(
            np.concatenate([spans.ts, rt.ts, host.ts[forward]]),
            np.concatenate([spans.end, rt.ts, host.ts[forward]]),
            np.concatenate([spans.thread, rt.thread, host.thread[forward]]),
        )
        return par[:m], par[m : m + n_rt], forward, par[m + n_rt :]

    @cached_property
    def _backward(self) -> tuple[np.ndarray, np.ndarray]:
        """(outermost backward-node ops, the module span of the forward op each came from)."""
        host = self.a.trace.host
        seq, fwd_thread = host.sequence()
        _, _, forward, fwd_span = self._links
        host_par, _ = self.a.parents
        is_node = (seq >= 0) & (fwd_thread > 0) & self.a.host_in_window
        nodes = np.flatnonzero(is_node & ~tree.any_ancestor(host_par, is_node))
        if not len(nodes) or not len(forward):
            return nodes, np.full(len(nodes), -1, np.int64)
        # prefer forward ops inside a module span; among those with one sequence number
        # (aten::linear and its aten::t share theirs), the latest
        cand = forward[fwd_span >= 0]
        cand_span = fwd_span[fwd_span >= 0]
        order = np.lexsort((host.ts[cand], seq[cand]))
        c_seq, c_span = seq[cand][order], cand_span[order]
        k = np.searchsorted(c_seq, seq[nodes], side="right") - 1
        hit = (k >= 0) & (c_seq[np.maximum(k, 0)] == seq[nodes])
        span_of = np.full(len(nodes), -1, np.int64)
        span_of[hit] = c_span[k[hit]]
        return nodes, span_of

    def _inclusive(self, span: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Sum ``values`` into ``span`` and every span around it; per frame row, counting
        each row's outermost spans only (a module that calls itself is counted once)."""
        parent, _, _, _ = self._links
        ok = span >= 0
        per_span = tree.add_to_ancestors(parent, span[ok], values[ok], len(parent))
        outer = ~self._nested_in_itself
        return np.bincount(self._span_row[outer], weights=per_span[outer], minlength=len(self.keys))

    @cached_property
    def _nested_in_itself(self) -> np.ndarray:
        parent, _, _, _ = self._links
        key = self.spans.key
        same = np.zeros(len(parent), bool)
        anc = parent.copy()
        while (live := anc >= 0).any():
            idx = np.flatnonzero(live)
            same[idx] |= key[anc[idx]] == key[idx]
            anc[idx] = parent[anc[idx]]
        return same

    @cached_property
    def gpu_modules(self) -> np.ndarray:
        """Frame row of the innermost module each GPU event's work belongs to (-1: none):
        the span around its launch (forward), or the module of its backward node."""
        gpu_launch = self.a.launch_runtime
        _, rt_span, _, _ = self._links
        out = np.full(len(gpu_launch), -1, np.int64)
        ok = gpu_launch >= 0
        span = np.full(len(gpu_launch), -1, np.int64)
        span[ok] = rt_span[gpu_launch[ok]]
        # backward: the runtime call's op descends from a backward node
        nodes, node_span = self._backward
        if len(nodes):
            host_par, _ = self.a.parents
            node_of = np.full(len(host_par), -1, np.int64)
            node_of[nodes] = np.arange(len(nodes))
            op = self.a.launch_op
            has = (span < 0) & (op >= 0)
            near = tree.nearest_flagged(host_par, node_of >= 0, op[has])
            n = np.full(len(gpu_launch), -1, np.int64)
            n[has] = np.where(near >= 0, node_of[near], -1)
            back = n >= 0
            span[back] = node_span[n[back]]
        good = span >= 0
        out[good] = self._span_row[span[good]]
        return out

    def name(self, row: int) -> str:
        """The module name of frame ``row``."""
        return str(self._frame["module"].iloc[row])

    def frame(self) -> pd.DataFrame:
        """The table (computed once; callers get a copy to keep or change)."""
        return self._frame.copy()

    @cached_property
    def _frame(self) -> pd.DataFrame:
        n = len(self.keys)
        if n == 0:
            return empty_frame(MODULE_COLUMNS, ("module", "type", "parent"))
        trace, spans = self.a.trace, self.spans
        gpu = trace.gpu
        parent, rt_span, _, _ = self._links
        calls = np.bincount(self._span_row, minlength=n)
        outer = ~self._nested_in_itself
        fwd_host = np.bincount(
            self._span_row[outer], weights=(spans.end - spans.ts)[outer], minlength=n
        )
        # forward GPU work: launched by a runtime call inside a span
        g_dur = gpu.end - gpu.ts
        launch = self.a.launch_runtime
        ok = launch >= 0
        g_span = np.full(len(g_dur), -1, np.int64)
        g_span[ok] = rt_span[launch[ok]]
        fwd_dev = self._inclusive(g_span, g_dur)
        nodes, node_span = self._backward
        host = trace.host
        bwd_host = self._inclusive(node_span, (host.end - host.ts)[nodes])
        bwd_dev = self._inclusive(node_span, self.a.device_time[1][nodes])
        # structure from each module's first call: its caller and depth
        order = np.argsort(spans.ts, kind="stable")
        _, at = np.unique(self._span_row[order], return_index=True)
        first = order[at]
        depth = tree.depths(parent)
        parent_row = np.where(parent[first] >= 0, self._span_row[np.maximum(parent[first], 0)], -1)
        names, types = self._names(parent_row)
        return pd.DataFrame(
            {
                "module": names,
                "type": types,
                "calls": calls.astype(np.int64),
                "depth": depth[first].astype(np.int64),
                "forward_host_us": fwd_host,
                "forward_device_us": fwd_dev,
                "backward_host_us": bwd_host,
                "backward_device_us": bwd_dev,
                "parent": [names[p] if p >= 0 else "" for p in parent_row.tolist()],
            },
            columns=MODULE_COLUMNS,
        )

    def _names(self, parent_row: np.ndarray) -> tuple[list[str], list[str]]:
        keys = self.keys.tolist()
        if self.origin == "with_stack":
            # the profiler's instance labels, as a path through the callers of each first call
            labels = [self.code.module_names[k] for k in keys]
            names = [self._path(i, labels, parent_row) for i in range(len(labels))]
            return names, [torch_module_type(label) for label in labels]
        given = {m.number: m for m in (self.code.labels.modules if self.code.labels else [])}
        names = [given[k].name if k in given else f"gpumagic.module#{k}" for k in keys]
        types = [given[k].type if k in given else "" for k in keys]
        return names, types

    @staticmethod
    def _path(row: int, labels: list[str], parent_row: np.ndarray) -> str:
        parts, seen = [], set()
        while row >= 0 and row not in seen:
            seen.add(row)
            parts.append(labels[row])
            row = int(parent_row[row])
        return ".".join(reversed(parts))


def module_attribution(analysis: Analysis) -> ModuleAttribution:
    """The per-module attribution of ``analysis``, made once and kept on it."""
    return analysis.memo("ModuleAttribution", lambda: ModuleAttribution(analysis))
