"""``MemTrace.plot()``: allocated memory over the statements as they ran, as a matplotlib
chart (stacked by category when the tensor census ran), for users who want a figure of
their own; the report draws its own chart (:mod:`gpumagic.render.memchart`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpumagic.cell import Statement
from gpumagic.memory.census.categories import NAMES

if TYPE_CHECKING:
    from gpumagic.memory.trace.tracer import Point

__all__ = ["plot_memory"]


def plot_memory(
    points: Sequence[Point],
    statements: Sequence[Statement],
    title: str,
    by_category: bool,
    ax: Any = None,
) -> Any:
    """Draw the tracer's ``points`` on ``ax`` (a new figure's when None); the three highest
    peaks are marked with their statements' lines. Returns the Axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3))
    xs = list(range(len(points)))
    cur = [p[1] / 2**20 for p in points]
    peaks = [p[3] / 2**20 for p in points]
    ax.step(xs, cur, where="post", label="allocated after statement", color="#3b7dd8")
    ax.plot(xs, peaks, ".", markersize=3, label="peak within statement", color="#f0ad4e")
    if by_category:
        from gpumagic.render.memchart import CATEGORY_COLORS

        stacks = [
            [(p[4][c] if p[4] is not None else 0) / 2**20 for p in points]
            for c in range(len(NAMES))
        ]
        ax.stackplot(xs, *stacks, labels=NAMES, colors=CATEGORY_COLORS, alpha=0.5, step="post")
    ax.set_xlabel("statement executions, in order")
    ax.set_ylabel("MiB")
    ax.set_title(title)
    lines_by_index = {s.index: s.line for s in statements}
    top = sorted(range(1, len(points)), key=lambda k: -points[k][3])[:3]
    for k in top:
        idx = points[k][2]
        if idx in lines_by_index:
            ax.annotate(
                f"line {lines_by_index[idx]}",
                (k, peaks[k]),
                fontsize=8,
                textcoords="offset points",
                xytext=(2, 4),
            )
    ax.legend(loc="best", fontsize=7)
    return ax
