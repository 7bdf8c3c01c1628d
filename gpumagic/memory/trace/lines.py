"""``MemTrace.lines``: the per-statement numbers a traced cell measured, as a DataFrame, one
row per statement that ran, in the cell's order.

A statement that ran more than once (a loop's body) has one row: ``hits`` is how often it
ran, ``delta_bytes`` its change summed over the hits (``delta_per_hit_bytes`` per hit),
``peak_bytes`` the highest any hit reached above its own start, and the after-columns
(``allocated_bytes``, the categories) are from its last hit. With the tensor census, one
column per category (:data:`CATEGORY_COLUMNS`) adds up to ``allocated_bytes``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpumagic.cell import Statement
from gpumagic.memory.census.categories import COLUMNS

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.memory.trace.tracer import Categories

__all__ = ["CATEGORY_COLUMNS", "LINE_COLUMNS", "MEASURED", "lines_frame"]

# What :func:`lines_frame` is given per statement, each a list indexed like the statements.
MEASURED = (
    "hits",
    "delta_bytes",
    "peak_bytes",
    "allocated_bytes",
    "reserved_bytes",
    "host_delta_bytes",
    "host_peak_bytes",
    "host_bytes",
)
LINE_COLUMNS = ["line", "source", *MEASURED, "time_us", "depth", "kind", "delta_per_hit_bytes"]
# With the census: every category (gpumagic.memory.census.categories), adding up to
# allocated_bytes.
CATEGORY_COLUMNS = list(COLUMNS)


def lines_frame(
    statements: Sequence[Statement],
    measured: Mapping[str, Sequence[int]],
    time_ns: Sequence[int],
    categories: Sequence[Categories | None],
    error_index: int,
) -> pd.DataFrame:
    """The rows of the statements that ran (``hits`` above 0). ``measured``: each of
    :data:`MEASURED` per statement; ``time_ns``: each statement's time, all its hits;
    ``categories``: bytes by category after each statement (None where the census did not
    settle it, all None without the census); ``error_index``: the statement that raised
    (-1: none), its row ``failed``."""
    import pandas as pd

    census = any(c is not None for c in categories)
    hits = measured["hits"]
    ran = [s for s in statements if hits[s.index] > 0]
    rows = []
    for s in ran:
        i = s.index
        row: dict[str, Any] = {"line": s.line, "source": s.source}
        row.update((name, values[i]) for name, values in measured.items())
        row["time_us"] = time_ns[i] / 1000.0
        row["depth"] = s.depth
        row["kind"] = s.kind
        row["delta_per_hit_bytes"] = round(measured["delta_bytes"][i] / hits[i])
        if census:
            cats = categories[i]
            row.update(zip(CATEGORY_COLUMNS, cats or (None,) * len(CATEGORY_COLUMNS)))
        row["failed"] = i == error_index
        rows.append(row)
    extra = CATEGORY_COLUMNS if census else []
    df = pd.DataFrame(rows, columns=LINE_COLUMNS + extra + ["failed"])
    for c in df.columns:
        if c.endswith("_bytes") and c not in extra:
            df[c] = df[c].astype("int64")
    if census and all(categories[s.index] is not None for s in ran):
        df[extra] = df[extra].astype("int64")
    return df
