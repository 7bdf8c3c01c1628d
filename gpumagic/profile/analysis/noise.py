"""How sure a difference between two runs is: intervals from the runs' own steps.

Every step of a run is a sample of its step time; a run repeated (``%%gpuprofile --repeat
N``) gives one set of samples per run. A difference between two runs is only worth
reporting when it is larger than what the samples vary by, so each comparison carries a
95% interval and a verdict.

The change in step time is the **Hodges-Lehmann shift**: the median of the differences
between every step of ``b`` and every step of ``a``, given relative to ``a``'s median step.
It is the median's robustness (a few slow steps do not move it) without its jumps: on a
busy machine step times are often bimodal (the process woke on a free core, or waited a
time slice for one), and a median flips between the modes where the shift does not. A
breakdown category's change is the difference of its mean µs per step (the categories'
means add up to the mean step).

The 95% interval is a **hierarchical percentile bootstrap**: each of ``RESAMPLES``
resamples draws the runs of each side with replacement, then, within each drawn run, as
many steps as it has, with replacement, and computes the statistic on the pooled draws; the
2.5th and 97.5th percentiles of the resampled changes are the interval. Drawing runs first
lets run-to-run noise (another process started, the clocks changed) widen the interval as
much as it really varies; with one run per side it reduces to the ordinary bootstrap over
steps, which cannot see noise that moves a whole run.

A resample costs as many draws as its side has steps, so a side of more than
:data:`MAX_WIDTH` values (runs times the longest run) is thinned first, at random, each run in
proportion to its steps, and the interval is the thinned samples' own: an interval from
fewer samples is wider, so the verdict errs toward "no difference". The estimate still uses
every step, and the result's ``notes`` say what was thinned. Before, 10^6 steps a side asked
for one batch of 400 x 10^6 draws (a MemoryError), and 10^5 took 22 s and 1.6 GB (issue 25);
thinned, 10^6 a side takes 2-5 s and under 100 MiB here.

The verdict is "faster" or "slower" only when the whole interval of the relative change
lies beyond a practical-equivalence margin of ``MARGIN_PERCENT`` on that side; otherwise
"no difference" (beyond the noise). The margin absorbs what the bootstrap cannot see from
the steps of a single run: a shared machine moves consecutive runs of the same code by a
few percent. The random draws come from a fixed seed, so the same samples give the same
interval every time.

Pure numpy: no scipy (not a dependency of the package).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpumagic.units import fmt_interval, fmt_percent, fmt_us

CONFIDENCE = 0.95
RESAMPLES = 2000
# A change must lie wholly beyond this many percent of the "before" value to be called.
MARGIN_PERCENT = 3.0
# Fewer samples than this on a side: no interval (a median of two values says nothing).
MIN_SAMPLES = 3
# A resample's Hodges-Lehmann shift looks at most this many pairs of steps (drawn at random
# beyond it: thousands of steps a side would make millions of pairs for no better estimate).
MAX_PAIRS = 10_000
# Values a side of one resample holds at most (its runs times its longest run): beyond it the
# side is thinned for the interval. At MAX_PAIRS it costs about 2 s, and the thinning adds
# about as much to the interval's width as the pairs drawn at random already do.
MAX_WIDTH = MAX_PAIRS
# Resamples are drawn in batches of at most this many values (draws and pairs), to bound the
# memory: each value takes a few arrays of 8 bytes while it is drawn.
_BATCH_VALUES = 4_000_000

FASTER, SLOWER, SAME = "faster", "slower", "no difference"
VERDICTS = (FASTER, SLOWER, SAME)

METHOD = (
    "step time: Hodges-Lehmann shift (median of the pairwise step differences) relative to "
    "the first run's median; 95% interval: hierarchical percentile bootstrap (runs, then steps "
    f"within runs), {RESAMPLES} resamples; a change counts when the whole interval lies "
    f"beyond ±{MARGIN_PERCENT:g}%"
)


@dataclass(frozen=True)
class Difference:
    """``b`` against ``a``: the change in a statistic, its interval and the verdict.

    ``estimate`` and ``interval`` in the samples' unit (µs); ``percent`` and
    ``interval_percent`` relative to ``a``'s value. The interval is None when a side has
    fewer than :data:`MIN_SAMPLES` samples; the verdict is then "no difference" (nothing
    shows that the change is larger than the noise) and ``reason`` says why.
    """

    statistic: str  # "shift" (Hodges-Lehmann, with a and b the medians) or "mean"
    a: float
    b: float
    estimate: float  # the change: the shift, or b - a
    interval: tuple[float, float] | None
    percent: float | None  # 100 * (b / a - 1); None when a is 0
    interval_percent: tuple[float, float] | None
    verdict: str  # "faster", "slower" or "no difference"
    samples: tuple[tuple[int, int], tuple[int, int]]  # (runs, steps) of a and of b
    margin_percent: float = MARGIN_PERCENT
    reason: str = ""  # why there is no interval (too few samples)
    notes: tuple[str, ...] = ()  # what was done to bound the work (a side thinned)

    @property
    def beyond_noise(self) -> bool:
        return self.verdict != SAME

    def change_text(self) -> str:
        """``"-7.8% (95% CI -9.0% to -6.1%)"``; without an interval, the reason."""
        if self.percent is None:
            signed = lambda v: fmt_us(v, signed=True)  # noqa: E731
            return f"{signed(self.estimate)} ({fmt_interval(self.interval, signed)})"
        if self.interval_percent is None:
            return f"{fmt_percent(self.percent, signed=True)} ({self.reason})"
        return f"{fmt_percent(self.percent, signed=True)} ({fmt_interval(self.interval_percent)})"

    def text(self, what: str = "median step time") -> str:
        """The verdict, then what changed and by how much: ``"no difference beyond the
        noise: median step time 8.6 ms -> 8.8 ms, +2.3% (95% CI -4.1% to +6.0%)"``."""
        verdict = "no difference beyond the noise" if self.verdict == SAME else self.verdict
        return f"{verdict}: {what} {fmt_us(self.a)} -> {fmt_us(self.b)}, {self.change_text()}"


def as_runs(samples: np.ndarray | Sequence[np.ndarray] | Sequence[float]) -> list[np.ndarray]:
    """Samples as one array per run: a flat array (or list of numbers) is one run."""
    if isinstance(samples, np.ndarray):
        runs = [samples] if samples.ndim <= 1 else list(samples)
    elif len(samples) and all(np.ndim(s) == 0 for s in samples):
        runs = [np.asarray(samples, float)]
    else:
        runs = [np.asarray(s, float) for s in samples]
    out = [np.asarray(r, float).ravel() for r in runs]
    return [r[np.isfinite(r)] for r in out if np.isfinite(r).any()]


def _statistic(values: np.ndarray, statistic: str, axis: int | None = None) -> np.ndarray:
    if statistic == "median":
        return np.asarray(np.nanmedian(values, axis=axis))
    if statistic == "mean":
        return np.asarray(np.nanmean(values, axis=axis))
    raise ValueError(f"statistic must be 'median' or 'mean', not {statistic!r}")


def point(runs: Sequence[np.ndarray], statistic: str = "median") -> float:
    """The statistic of all the runs' samples pooled."""
    pooled = np.concatenate(list(runs)) if runs else np.zeros(0)
    return float(_statistic(pooled, statistic)) if len(pooled) else float("nan")


def hodges_lehmann(a: np.ndarray, b: np.ndarray, rng: np.random.Generator | None = None) -> float:
    """The Hodges-Lehmann shift from ``a`` to ``b``: the median of every difference
    ``b[j] - a[i]`` (of :data:`MAX_PAIRS` pairs drawn at random when there are more)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(_shifts(a[None, :], b[None, :], rng or np.random.default_rng(0))[0])


def _shifts(a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per row of ``a`` and ``b`` (NaN-padded samples), the Hodges-Lehmann shift."""
    n, na = a.shape
    nb = b.shape[1]
    if na * nb <= MAX_PAIRS:
        diffs = (b[:, None, :] - a[:, :, None]).reshape(n, na * nb)
    else:  # an incomplete U-statistic: the same estimate, from a random subset of the pairs
        i = rng.integers(0, na, size=(n, MAX_PAIRS))
        j = rng.integers(0, nb, size=(n, MAX_PAIRS))
        rows = np.arange(n)[:, None]
        diffs = b[rows, j] - a[rows, i]
    return np.asarray(np.nanmedian(diffs, axis=1))


def _draws(runs: Sequence[np.ndarray], n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` hierarchical resamples of ``runs`` (rows), NaN where a drawn run is shorter
    than the longest: runs drawn with replacement, then each one's steps."""
    r = len(runs)
    sizes = np.array([len(x) for x in runs])
    width = int(sizes.max())
    padded = np.full((r, width), np.nan)
    for i, x in enumerate(runs):
        padded[i, : len(x)] = x
    chosen = rng.integers(0, r, size=(n, r))  # which runs, with replacement
    size = sizes[chosen][..., None]  # each drawn run keeps its own number of steps
    steps = (rng.random((n, r, width)) * size).astype(np.int64)
    values = padded[chosen[..., None], steps]
    values[np.broadcast_to(np.arange(width), values.shape) >= size] = np.nan
    return values.reshape(n, r * width)


def _width(runs: Sequence[np.ndarray]) -> int:
    """Values one resample of ``runs`` holds: the runs, each padded to the longest."""
    return len(runs) * max(len(x) for x in runs)


def _batch(*widths: int) -> int:
    """Resamples per batch, so that no batch holds more than about :data:`_BATCH_VALUES`
    values: the larger of the sides' draws and, for two sides, the pairs of the shift (the
    draws of both sides counted, not only the pairs: issue 25)."""
    pairs = min(widths[0] * widths[1], MAX_PAIRS) if len(widths) == 2 else 0
    return max(1, _BATCH_VALUES // max(sum(widths), pairs, 1))


def thinned(
    runs: Sequence[np.ndarray], rng: np.random.Generator
) -> tuple[list[np.ndarray], str]:
    """``runs`` with at most :data:`MAX_WIDTH` values a resample (see the module docstring):
    each run keeps a random share of its steps, the same share for all (at least one step),
    and what was kept, in words ("10,000 of the 1,000,000"); unchanged, with "", when they
    fit."""
    runs = list(runs)
    total = sum(len(x) for x in runs)
    if _width(runs) <= MAX_WIDTH:
        return runs, ""
    if len(runs) > MAX_WIDTH:  # more runs than values allowed: a random set of them
        keep = np.sort(rng.choice(len(runs), MAX_WIDTH, replace=False))
        runs = [runs[i] for i in keep]
    share = MAX_WIDTH / _width(runs)
    sizes = [max(1, round(len(x) * share)) for x in runs]
    runs = [x if len(x) <= k else rng.choice(x, k, replace=False) for x, k in zip(runs, sizes)]
    return runs, f"{sum(len(x) for x in runs):,} of the {total:,}"


def _thinning_note(a: str, b: str) -> tuple[str, ...]:
    if not (a or b):
        return ()
    sides = " and ".join(f"{what} samples of {side}" for side, what in (("a", a), ("b", b)) if what)
    return (
        f"the interval comes from {sides}, drawn at random (each run in proportion) to bound "
        f"the work at {MAX_WIDTH:,} values a side; an interval from fewer samples is wider, so "
        "the verdict errs toward no difference. The estimate uses every sample.",
    )


def resample(
    runs: Sequence[np.ndarray],
    statistic: str = "median",
    resamples: int = RESAMPLES,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """``resamples`` values of the statistic, each over runs drawn with replacement and,
    within each drawn run, its steps drawn with replacement (see the module docstring)."""
    rng = rng if rng is not None else np.random.default_rng(0)
    runs, _ = thinned(runs, rng)
    per = _batch(_width(runs))
    out = np.empty(resamples)
    for done in range(0, resamples, per):
        n = min(per, resamples - done)
        out[done : done + n] = _statistic(_draws(runs, n, rng), statistic, axis=1)
    return out


def _resample_shift(
    runs_a: Sequence[np.ndarray], runs_b: Sequence[np.ndarray], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Per resample of both sides, the Hodges-Lehmann shift and ``a``'s median (the sides
    :func:`thinned` already)."""
    per = _batch(_width(runs_a), _width(runs_b))
    shift, base = np.empty(RESAMPLES), np.empty(RESAMPLES)
    for done in range(0, RESAMPLES, per):
        n = min(per, RESAMPLES - done)
        da, db = _draws(runs_a, n, rng), _draws(runs_b, n, rng)
        shift[done : done + n] = _shifts(da, db, rng)
        base[done : done + n] = np.nanmedian(da, axis=1)
    return shift, base


def interval(
    samples: np.ndarray | Sequence[np.ndarray],
    statistic: str = "median",
    confidence: float = CONFIDENCE,
) -> tuple[float, float] | None:
    """The interval of one side's statistic (None with too few samples; from a side thinned
    as :func:`thinned` says beyond :data:`MAX_WIDTH` values)."""
    runs = as_runs(samples)
    if sum(len(x) for x in runs) < MIN_SAMPLES:
        return None
    draws = resample(runs, statistic)
    tail = 100 * (1 - confidence) / 2
    lo, hi = np.percentile(draws, [tail, 100 - tail])
    return float(lo), float(hi)


def difference(
    a: np.ndarray | Sequence[np.ndarray],
    b: np.ndarray | Sequence[np.ndarray],
    statistic: str = "shift",
    *,
    lower_is_better: bool = True,
    margin_percent: float = MARGIN_PERCENT,
    scale: float | None = None,
    confidence: float = CONFIDENCE,
) -> Difference:
    """The change from ``a`` to ``b`` (each a run's samples, or one array per run).

    ``statistic``: ``"shift"``, the Hodges-Lehmann shift (the median of the pairwise
    differences), relative to ``a``'s median; or ``"mean"``, the difference of the means.
    ``lower_is_better``: a lower value is "faster" (step time); ``scale``: what the margin
    and the relative change are taken of (``a``'s median, or mean, unless given: a
    breakdown category's change is judged against the step it is part of). ``notes`` says
    when a side was thinned for the interval (more than :data:`MAX_WIDTH` values).
    """
    runs_a, runs_b = as_runs(a), as_runs(b)
    rng = np.random.default_rng(0)
    counts = (
        (len(runs_a), sum(len(x) for x in runs_a)),
        (len(runs_b), sum(len(x) for x in runs_b)),
    )
    if statistic == "shift":
        va = point(runs_a, "median")
        pooled = [np.concatenate(r) if r else np.zeros(0) for r in (runs_a, runs_b)]
        estimate = (
            hodges_lehmann(pooled[0], pooled[1], rng) if all(len(p) for p in pooled) else np.nan
        )
        vb = point(runs_b, "median")
    else:
        va, vb = point(runs_a, statistic), point(runs_b, statistic)
        estimate = vb - va
    base = va if scale is None else scale
    usable = bool(base) and bool(np.isfinite(base))
    percent = 100.0 * estimate / base if usable else None
    few = [name for name, (_, n) in zip("ab", counts) if n < MIN_SAMPLES]
    if few:
        return Difference(
            statistic, va, vb, estimate, None, percent, None, SAME, counts, margin_percent,
            reason=f"fewer than {MIN_SAMPLES} steps in {' and '.join(few)}: no interval",
        )
    (runs_a, thin_a), (runs_b, thin_b) = thinned(runs_a, rng), thinned(runs_b, rng)
    notes = _thinning_note(thin_a, thin_b)
    if statistic == "shift":
        diff, base_draws = _resample_shift(runs_a, runs_b, rng)
    else:
        diff = resample(runs_b, statistic, rng=rng) - resample(runs_a, statistic, rng=rng)
        base_draws = None
    tail = 100 * (1 - confidence) / 2
    lo, hi = (float(v) for v in np.percentile(diff, [tail, 100 - tail]))
    rel: tuple[float, float] | None = None
    if usable:
        if scale is None and base_draws is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = 100.0 * diff / base_draws
            ratio = ratio[np.isfinite(ratio)]
            if len(ratio):
                rlo, rhi = np.percentile(ratio, [tail, 100 - tail])
                rel = (float(rlo), float(rhi))
        else:
            rel = (100.0 * lo / base, 100.0 * hi / base)
    return Difference(
        statistic,
        va,
        vb,
        estimate,
        (lo, hi),
        percent,
        rel,
        _verdict(rel, margin_percent, lower_is_better),
        counts,
        margin_percent,
        notes=notes,
    )


def _verdict(rel: tuple[float, float] | None, margin: float, lower_is_better: bool) -> str:
    if rel is None:
        return SAME
    lo, hi = rel
    if hi < -margin:
        return FASTER if lower_is_better else SLOWER
    if lo > margin:
        return SLOWER if lower_is_better else FASTER
    return SAME
