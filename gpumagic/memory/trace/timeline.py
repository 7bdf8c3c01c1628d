"""The cell's memory over time and at its peak, as data: ``MemTrace.timeline`` and
``MemTrace.at_peak``.

The tracer keeps one point per statement execution (thinned to at most 4096 for long loops,
peaks folded in, see :mod:`gpumagic.memory.trace.tracer`): the bytes after the statement by
category, and the highest moment since the previous point with its categories. The
timeline lists both, in long form (one row per point and category), the shape a stacked
chart or a ``pivot`` wants.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpumagic.cell import Statement
from gpumagic.memory.census.categories import ACTIVATIONS, NAMES
from gpumagic.units import fmt_bytes

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.memory.trace.tracer import PeakMoment, Point

__all__ = ["TIMELINE_COLUMNS", "AtPeak", "at_peak_of", "timeline_frame"]

TIMELINE_COLUMNS = ["time_s", "step", "line", "source", "point", "category", "bytes"]


def timeline_frame(points: Sequence[Point], statements: Sequence[Statement]) -> pd.DataFrame:
    """One row per point and category: ``time_s`` (seconds since the cell started), ``step``
    (the point's position: statement executions in order), ``line`` and ``source`` of the
    statement, ``point`` ("after": when the statement ended; "peak": the highest moment
    since the previous point, where that was above both ends), ``category``, ``bytes``.
    Empty without a tensor census."""
    import pandas as pd

    rows: list[tuple[Any, ...]] = []
    before = points[0][1] if points else 0
    for step, (t, allocated, index, highest, after, at_peak) in enumerate(points):
        if index < 0:
            continue
        s = statements[index]
        # a peak only where the statement rose above where it began and where it ended
        peak = at_peak if highest > max(allocated, before) else None
        before = allocated
        for point, cats in (("peak", peak), ("after", after)):
            if cats is None:
                continue
            rows.extend((t, step, s.line, s.source, point, c, b) for c, b in zip(NAMES, cats))
    return pd.DataFrame(rows, columns=TIMELINE_COLUMNS)


@dataclass
class AtPeak:
    """What was alive at the cell's highest moment: ``total`` bytes, ``categories``
    (category -> bytes, adding up to the total), the ``line`` and ``source`` of the statement
    running then (and its ``hit``), and the activations by module (``modules``: name -> bytes,
    largest first, named as the namespace names them)."""

    total: int
    line: int
    source: str
    hit: int
    categories: dict[str, int]
    modules: dict[str, int] = field(default_factory=dict)

    def blocks(self, depth: int | None = None) -> dict[str, int]:
        """Activations by module, added up to ``depth`` dotted parts (``model.layer3`` for
        ``model.layer3.0.conv1`` at depth 2), largest first. By default the shallowest depth
        from 2 that splits them into at least four blocks (a ResNet's stages, a transformer's
        layers), or the modules themselves."""
        if depth is not None:
            return _added_up(self.modules, depth)
        deepest = max((name.count(".") + 1 for name in self.modules), default=2)
        out: dict[str, int] = {}
        for d in range(2, max(deepest, 2) + 1):
            out = _added_up(self.modules, d)
            if len(out) >= 4:
                break
        return out

    @property
    def activations(self) -> int:
        return self.categories.get(NAMES[ACTIVATIONS], 0)

    def __repr__(self) -> str:
        cats = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in self.categories.items() if v)
        mods = ", ".join(f"{k}: {fmt_bytes(v)}" for k, v in list(self.blocks().items())[:5])
        head = f"at the peak, {fmt_bytes(self.total)} during line {self.line} ({self.source!r}): {cats}"
        return head + (f"; activations by module: {mods}" if mods else "")


def _added_up(modules: Mapping[str, int], depth: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, n in modules.items():
        head = name if " " in name else ".".join(name.split(".")[:depth])
        out[head] = out.get(head, 0) + n
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def at_peak_of(
    moment: PeakMoment | None, statements: Sequence[Statement], names: Mapping[int, str]
) -> AtPeak | None:
    """The :class:`AtPeak` of a tracer's :class:`~gpumagic.memory.trace.tracer.PeakMoment`, module
    tokens named (``names``: the census's)."""
    if moment is None:
        return None
    s = statements[moment.statement]
    modules: dict[str, int] = {}
    for token, n in moment.modules.items():
        name = names.get(token, "outside any module") if token else "outside any module"
        modules[name] = modules.get(name, 0) + n
    return AtPeak(
        total=moment.total,
        line=s.line,
        source=s.source,
        hit=moment.hit,
        categories=dict(zip(NAMES, moment.categories)),
        modules=dict(sorted(modules.items(), key=lambda kv: -kv[1])),
    )
