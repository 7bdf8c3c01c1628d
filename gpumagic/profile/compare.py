"""Before/after: two runs side by side, with deltas and a one-line headline."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gpumagic.profile.analysis.breakdown import CATEGORIES
from gpumagic.profile.load import load_trace
from gpumagic.profile.result import ProfileResult
from gpumagic.render.html import Rendered
from gpumagic.units import fmt_percent

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.render.sections import Report

_LINE_DELTA_COLUMNS = [
    "line",
    "source",
    "a_line",
    "b_line",
    "a_hits",
    "b_hits",
    "a_host_us",
    "b_host_us",
    "delta_host_us",
    "a_device_us",
    "b_device_us",
    "delta_device_us",
]
# A category must move by this many percentage points to be named in the headline.
_HEADLINE_PP = 2.0


@dataclass(eq=False, repr=False)
class Comparison(Rendered):
    """Run ``a`` (before) against run ``b`` (after)."""

    a: ProfileResult
    b: ProfileResult
    names: tuple[str, str] = ("before", "after")

    @cached_property
    def table(self) -> pd.DataFrame:
        """Headline metrics: one row each, columns ``a``, ``b``, ``delta``, ``delta_percent``."""
        import pandas as pd

        sa, sb = self.a.summary, self.b.summary
        rows: list[tuple[str, float | None, float | None]] = [
            ("step_time_us", sa["step_time_us"], sb["step_time_us"]),
            (
                "gpu_utilization_percent",
                sa["gpu_utilization_percent"],
                sb["gpu_utilization_percent"],
            ),
            ("gpu_idle_us_per_step", sa["gpu_idle_us_per_step"], sb["gpu_idle_us_per_step"]),
            ("sm_efficiency_percent", sa["sm_efficiency_percent"], sb["sm_efficiency_percent"]),
            (
                "achieved_occupancy_percent",
                sa["achieved_occupancy_percent"],
                sb["achieved_occupancy_percent"],
            ),
            ("steps", sa["steps"], sb["steps"]),
            ("communication_percent", sa["communication_percent"], sb["communication_percent"]),
            (
                "communication_overlap_percent",
                sa["communication_overlap_percent"],
                sb["communication_overlap_percent"],
            ),
        ]
        frame = pd.DataFrame(rows, columns=["metric", "a", "b"]).set_index("metric")
        frame = frame.astype(float)
        frame["delta"] = frame["b"] - frame["a"]
        frame["delta_percent"] = 100.0 * frame["delta"] / frame["a"].where(frame["a"] != 0)
        return frame

    @cached_property
    def breakdown(self) -> pd.DataFrame:
        """Per category: µs per step and percent in each run, and the change."""
        ba, bb = self.a.breakdown, self.b.breakdown
        import pandas as pd

        frame = pd.DataFrame(
            {
                "a_us": ba["us"],
                "b_us": bb["us"],
                "a_percent": ba["percent"],
                "b_percent": bb["percent"],
            },
            index=pd.Index(CATEGORIES, name="category"),
        )
        frame["delta_us"] = frame["b_us"] - frame["a_us"]
        frame["delta_pp"] = frame["b_percent"] - frame["a_percent"]
        return frame

    @cached_property
    def findings(self) -> pd.DataFrame:
        """Each rule found in either run: its saving per step in both, and its status."""
        import pandas as pd

        fa = {f.rule: f for f in self.a.findings}
        fb = {f.rule: f for f in self.b.findings}
        rows = []
        for rule in list(fa) + [r for r in fb if r not in fa]:
            in_a, in_b = rule in fa, rule in fb
            status = "still present" if in_a and in_b else ("fixed" if in_a else "new")
            rows.append(
                {
                    "rule": rule,
                    "a_saving_us": fa[rule].saving_us if in_a else None,
                    "b_saving_us": fb[rule].saving_us if in_b else None,
                    "status": status,
                }
            )
        return pd.DataFrame(rows, columns=["rule", "a_saving_us", "b_saving_us", "status"])

    @cached_property
    def lines(self) -> pd.DataFrame:
        """Per line of the cell, both runs' hits, host and device µs, and the change.

        Lines pair by their source text (the n-th of several identical lines with the n-th),
        so two runs of one cell line up, and so do the lines a fix left as they were when it
        added or changed others around them (``a_line``, ``b_line``: where each run had it).
        A line only one run has gets NaN for the other. Empty unless both runs have lines."""
        import pandas as pd

        a, b = self.a.lines, self.b.lines
        if a.empty or b.empty:
            return pd.DataFrame(columns=_LINE_DELTA_COLUMNS)
        keep = ["line", "source", "hits", "host_us", "device_us"]
        a = a[keep].assign(nth=a.groupby("source").cumcount())
        b = b[keep].assign(nth=b.groupby("source").cumcount())
        merged = a.merge(b, on=["source", "nth"], how="outer", suffixes=("_a", "_b"), sort=False)
        frame = pd.DataFrame(
            {
                "line": merged["line_b"].fillna(merged["line_a"]),
                "source": merged["source"],
                "a_line": merged["line_a"],
                "b_line": merged["line_b"],
                "a_hits": merged["hits_a"],
                "b_hits": merged["hits_b"],
                "a_host_us": merged["host_us_a"],
                "b_host_us": merged["host_us_b"],
                "delta_host_us": merged["host_us_b"] - merged["host_us_a"],
                "a_device_us": merged["device_us_a"],
                "b_device_us": merged["device_us_b"],
                "delta_device_us": merged["device_us_b"] - merged["device_us_a"],
            },
            columns=_LINE_DELTA_COLUMNS,
        )
        # in the later run's order; lines it no longer has after the line they followed
        order = frame["b_line"].fillna(frame["a_line"] + 0.5)
        return frame.iloc[np.argsort(order.to_numpy(), kind="stable")].reset_index(drop=True)

    @property
    def step_time_change_percent(self) -> float | None:
        a, b = self.a.summary["step_time_us"], self.b.summary["step_time_us"]
        return 100.0 * (b - a) / a if a else None

    @property
    def headline(self) -> str:
        """E.g. ``"DataLoader 23% -> 0.2%, step time -8%"``: the biggest share moves, then step time."""
        bd = self.breakdown
        moved = bd[bd["delta_pp"].abs() >= _HEADLINE_PP].copy()
        # name the categories that moved most, skipping "Other" unless it is all there is
        moved["order"] = -moved["delta_pp"].abs()
        moved = moved.sort_values("order")
        parts = []
        for cat, row in moved.iterrows():
            if cat == "Other" and len(moved) > 1:
                continue
            parts.append(
                f"{cat} {fmt_percent(row['a_percent'])} -> {fmt_percent(row['b_percent'])}"
            )
            if len(parts) == 2:
                break
        change = self.step_time_change_percent
        if change is not None:
            parts.append(f"step time {fmt_percent(change, signed=True)}")
        return ", ".join(parts) if parts else "no change"

    def _report(self) -> Report:
        from gpumagic.render.compare import comparison_report

        return comparison_report(self)


def compare(
    a: ProfileResult | str | Path,
    b: ProfileResult | str | Path,
    names: tuple[str, str] | None = None,
) -> Comparison:
    """Compare two runs (results, or paths to traces): ``a`` is before, ``b`` after."""
    ra = a if isinstance(a, ProfileResult) else load_trace(a)
    rb = b if isinstance(b, ProfileResult) else load_trace(b)
    return Comparison(ra, rb, names or (_label(ra.name), _label(rb.name)))


def _label(name: str) -> str:
    # "worker0.1700000000.pt.trace.json.gz" -> "worker0.1700000000": the suffix says nothing
    for suffix in (".json.gz", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name.removesuffix(".pt.trace")
