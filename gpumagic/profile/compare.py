"""Before/after: two runs side by side, each change with its 95% interval and a verdict.

The step time's change is judged on the runs' own steps (:mod:`gpumagic.profile.analysis.noise`:
a hierarchical bootstrap of the median over runs, then steps): "faster", "slower", or "no
difference" beyond the noise. Every metric with a value per step (step time, GPU
utilisation and idle time, each breakdown category) gets its interval and verdict the same
way; a finding that appeared or went away is called fixed (or new) only when the time it
was estimated to cost lies beyond the noise of the step time.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gpumagic.profile.analysis import noise
from gpumagic.profile.analysis.breakdown import CATEGORIES
from gpumagic.profile.analysis.noise import Difference
from gpumagic.profile.load import load_trace
from gpumagic.profile.result import ProfileResult
from gpumagic.render.html import Rendered
from gpumagic.units import fmt_us

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
# The headline metrics, in the order the table shows them; those with a value per step get
# an interval and a verdict (the statistic, and whether a lower value is the better one).
_METRICS = (
    "step_time_median_us",
    "step_time_us",
    "gpu_utilization_percent",
    "gpu_idle_us_per_step",
    "sm_efficiency_percent",
    "achieved_occupancy_percent",
    "steps",
    "communication_percent",
    "communication_overlap_percent",
)
_PER_STEP = {
    "step_time_median_us": ("step_time_us", "shift", True),
    "step_time_us": ("step_time_us", "mean", True),
    "gpu_utilization_percent": ("gpu_utilization_percent", "mean", False),
    "gpu_idle_us_per_step": ("gpu_idle_us_per_step", "mean", True),
}
TABLE_COLUMNS = ["a", "b", "delta", "delta_percent", "delta_low", "delta_high", "verdict"]
# A verdict in the words of its metric: utilisation is higher or lower, idle time more or less.
_WORDS = {
    "gpu_utilization_percent": {"faster": "higher", "slower": "lower"},
    "gpu_idle_us_per_step": {"faster": "less", "slower": "more"},
}


@dataclass(eq=False, repr=False)
class Comparison(Rendered):
    """Run ``a`` (before) against run ``b`` (after).

    :attr:`verdict` ("faster", "slower" or "no difference") and :attr:`interval` (the 95%
    interval of the median step time's change, percent) say whether ``b`` differs from
    ``a`` beyond the noise; :attr:`step_time` holds the whole :class:`Difference`.
    ``margin_percent``: the practical-equivalence margin a change must clear.
    """

    a: ProfileResult
    b: ProfileResult
    names: tuple[str, str] = ("before", "after")
    margin_percent: float = noise.MARGIN_PERCENT

    @cached_property
    def step_time(self) -> Difference:
        """The step time's change (the Hodges-Lehmann shift, relative to ``a``'s median),
        from every analysed step of every run of both."""
        return noise.difference(
            self.a.step_samples, self.b.step_samples, "shift", margin_percent=self.margin_percent
        )

    @property
    def verdict(self) -> str:
        """``"faster"``, ``"slower"`` or ``"no difference"`` (beyond the noise)."""
        return self.step_time.verdict

    @property
    def verdict_text(self) -> str:
        """The verdict with the change and its interval, in words: ``"faster: median step
        time 10.3 ms -> 8.2 ms, -20% (95% CI -25% to -15%)"``."""
        return verdict_text(self.step_time, "median step time")

    @property
    def interval(self) -> tuple[float, float] | None:
        """The 95% interval of the median step time's change, in percent of ``a``'s (None
        when a run has fewer than 3 steps)."""
        return self.step_time.interval_percent

    @cached_property
    def differences(self) -> dict[str, Difference]:
        """Each headline metric with a value per step: its change, interval and verdict."""
        sa, sb = self.a.metric_samples(), self.b.metric_samples()
        out: dict[str, Difference] = {}
        for metric, (key, statistic, lower_better) in _PER_STEP.items():
            if key not in sa or key not in sb:
                continue
            out[metric] = noise.difference(
                sa[key],
                sb[key],
                statistic,
                lower_is_better=lower_better,
                margin_percent=self.margin_percent,
                # a utilisation changes by percentage points; idle time counts against the step
                scale=100.0
                if metric == "gpu_utilization_percent"
                else (self.step_time.a if metric == "gpu_idle_us_per_step" else None),
            )
        out["step_time_median_us"] = self.step_time
        return out

    @cached_property
    def table(self) -> pd.DataFrame:
        """Headline metrics, one row each: ``a``, ``b``, ``delta``, ``delta_percent``, and for
        those with a value per step the 95% interval of the delta (``delta_low``,
        ``delta_high``) and the ``verdict``; the others get NaN and an empty verdict."""
        import pandas as pd

        sa, sb = self.a.summary, self.b.summary
        rows = []
        for metric in _METRICS:
            d = self.differences.get(metric)
            a = getattr(sa, metric) if d is None else d.a
            b = getattr(sb, metric) if d is None else d.b
            low, high = d.interval if d is not None and d.interval else (np.nan, np.nan)
            verdict = "" if d is None else _WORDS.get(metric, {}).get(d.verdict, d.verdict)
            rows.append((metric, a, b, low, high, verdict))
        frame = pd.DataFrame(
            rows, columns=["metric", "a", "b", "delta_low", "delta_high", "verdict"]
        ).set_index("metric")
        for c in ("a", "b", "delta_low", "delta_high"):
            frame[c] = frame[c].astype(float)
        frame["delta"] = frame["b"] - frame["a"]
        frame["delta_percent"] = 100.0 * frame["delta"] / frame["a"].where(frame["a"] != 0)
        return frame[TABLE_COLUMNS]

    @cached_property
    def breakdown(self) -> pd.DataFrame:
        """Per category: µs per step and percent in each run, the change, its 95% interval
        (``delta_low_us``, ``delta_high_us``) and ``verdict``: "less", "more" or "no
        difference", a change counted when it is beyond the margin as a share of ``a``'s
        step."""
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
        low, high, verdicts = [], [], []
        for d in self.category_differences.values():
            lo, hi = d.interval if d.interval else (np.nan, np.nan)
            low.append(lo)
            high.append(hi)
            verdicts.append(_MORE_LESS.get(d.verdict, d.verdict))
        frame["delta_low_us"] = low
        frame["delta_high_us"] = high
        frame["verdict"] = verdicts
        return frame

    @cached_property
    def category_differences(self) -> dict[str, Difference]:
        """Per breakdown category, the change of its mean µs per step (runs, then steps)."""
        ca, cb = self.a.category_samples(), self.b.category_samples()
        return {
            cat: noise.difference(
                [x[:, i] for x in ca],
                [x[:, i] for x in cb],
                "mean",
                margin_percent=self.margin_percent,
                scale=self.step_time.a,
            )
            for i, cat in enumerate(CATEGORIES)
        }

    @property
    def noise_us(self) -> float:
        """Half the width of the step time's interval: a change per step smaller than this
        is not told apart from the noise (NaN without an interval)."""
        d = self.step_time
        return (d.interval[1] - d.interval[0]) / 2 if d.interval else float("nan")

    def _beyond_noise(self, rule: str, saving_us: float, went: str) -> bool:
        """Whether a finding that ``went`` ("down": gone, "up": new) did so beyond the noise:
        its breakdown category moved that way beyond the noise (a rule that has one), else
        the time it was estimated to cost is more than the step time's noise."""
        from gpumagic.profile.rules.registry import RULES

        rule_of = RULES.get(rule)
        category = rule_of.category if rule_of is not None else None
        if category is not None:
            want = noise.FASTER if went == "down" else noise.SLOWER
            return self.category_differences[category].verdict == want
        noise_us = self.noise_us
        return noise_us == noise_us and saving_us > noise_us

    @cached_property
    def findings(self) -> pd.DataFrame:
        """Each rule found in either run: its saving per step in both, and its status:
        "fixed" / "new" when it went away / appeared beyond the noise (its breakdown
        category moved beyond the noise, or for a rule without one, the time it was
        estimated to cost exceeds the step time's noise); "gone (within the noise)" / "new
        (within the noise)" otherwise; "still present" when both runs have it."""
        import pandas as pd

        fa = {f.rule: f for f in self.a.findings}
        fb = {f.rule: f for f in self.b.findings}
        rows = []
        for rule in list(fa) + [r for r in fb if r not in fa]:
            in_a, in_b = rule in fa, rule in fb
            if in_a and in_b:
                status = "still present"
            else:
                saving = (fa[rule] if in_a else fb[rule]).saving_us
                if self._beyond_noise(rule, saving, "down" if in_a else "up"):
                    status = "fixed" if in_a else "new"
                else:
                    status = ("gone" if in_a else "new") + " (within the noise)"
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

        Lines pair by their code, without a trailing comment (the n-th of several identical
        lines with the n-th), so two runs of one cell line up, and so do the lines a fix left
        as they were when it added or changed others around them, or only marked them with a
        comment (``a_line``, ``b_line``: where each run had it; ``source``: the later run's).
        A line only one run has gets NaN for the other. Empty unless both runs have lines."""
        import pandas as pd

        a, b = self.a.lines, self.b.lines
        if a.empty or b.empty:
            return pd.DataFrame(columns=_LINE_DELTA_COLUMNS)
        keep = ["line", "source", "hits", "host_us", "device_us"]
        a, b = (
            x[keep].assign(code=x["source"].map(_code_of)).pipe(
                lambda f: f.assign(nth=f.groupby("code").cumcount())
            )
            for x in (a, b)
        )
        merged = a.merge(b, on=["code", "nth"], how="outer", suffixes=("_a", "_b"), sort=False)
        frame = pd.DataFrame(
            {
                "line": merged["line_b"].fillna(merged["line_a"]),
                "source": merged["source_b"].fillna(merged["source_a"]),
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
        """The mean step time's change, percent (a point estimate; :attr:`step_time` is the
        median's, with its interval and verdict)."""
        a, b = self.a.summary.step_time_us, self.b.summary.step_time_us
        return 100.0 * (b - a) / a if a else None

    @property
    def headline(self) -> str:
        """The verdict on the step time with its interval, then the categories that moved
        beyond the noise: ``"faster: median step time 155 ms -> 143 ms, -7.8% (95% CI -9.0%
        to -6.1%); DataLoader 35.5 ms -> 0.3 ms per step"``."""
        parts = [self.verdict_text]
        moved = [
            (cat, d)
            for cat, d in self.category_differences.items()
            if d.beyond_noise and (cat != "Other" or len(self.category_differences) == 1)
        ]
        moved.sort(key=lambda cd: -abs(cd[1].estimate))
        named = [f"{cat} {fmt_us(d.a)} -> {fmt_us(d.b)} per step" for cat, d in moved[:2]]
        return "; ".join(parts + named)

    def _report(self) -> Report:
        from gpumagic.render.compare import comparison_report

        return comparison_report(self)


_MORE_LESS = {noise.FASTER: "less", noise.SLOWER: "more"}


def change_text(d: Difference) -> str:
    """``"-7.8% (95% CI -9.0% to -6.1%)"``; without an interval, the reason."""
    return d.change_text()


def verdict_text(d: Difference, what: str) -> str:
    """The verdict, then what changed and by how much: ``"no difference beyond the noise:
    median step time 8.6 ms -> 8.8 ms, +2.3% (95% CI -4.1% to +6.0%)"``."""
    return d.text(what)


def compare(
    a: ProfileResult | str | Path,
    b: ProfileResult | str | Path,
    names: tuple[str, str] | None = None,
    margin_percent: float = noise.MARGIN_PERCENT,
) -> Comparison:
    """Compare two runs (results, or paths to traces): ``a`` is before, ``b`` after.

    The result's ``verdict`` says whether ``b``'s median step time differs from ``a``'s
    beyond the noise of their steps, ``interval`` the 95% interval of the change (percent):
    see :mod:`gpumagic.profile.analysis.noise`. ``margin_percent``: the smallest change
    worth calling a difference (the whole interval must lie beyond it)."""
    ra = a if isinstance(a, ProfileResult) else load_trace(a)
    rb = b if isinstance(b, ProfileResult) else load_trace(b)
    return Comparison(ra, rb, names or (_label(ra.name), _label(rb.name)), margin_percent)


def _code_of(source: str) -> str:
    """A statement's code without comments: what pairs the lines of two runs."""
    import io
    import tokenize

    try:
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        comments = [t for t in tokens if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return source.strip()
    lines = source.splitlines()
    for t in reversed(comments):  # cut each from its line, last first
        row, col = t.start
        lines[row - 1] = lines[row - 1][:col]
    return "\n".join(line.rstrip() for line in lines).strip()


def _label(name: str) -> str:
    # "worker0.1700000000.pt.trace.json.gz" -> "worker0.1700000000": the suffix says nothing
    for suffix in (".json.gz", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name.removesuffix(".pt.trace")
