"""The largest batch that fits: dry runs at the sizes given, a line through their needs,
then dry runs around the line's answer until it is confirmed exactly.

The need of a run is its predicted peak plus the headroom at the top of its range (what
:func:`~.headroom.verdict` calls sure to fit), the allocator's fragmentation taken as the
same fraction of the peak as in the cell's own run (the modelled fragmentation of each
size jumps with segment boundaries, and a need that shrinks as the batch grows would make
"the largest batch" depend on the search's path). Peak memory is close to a straight line
in the batch size (activations grow with it, parameters and optimizer state do not), so
the line's answer is usually right or close; the search then steps by the line through
the runs nearest the limit, by dry runs, so the batch reported is one a dry run said fits
and the next one a dry run said does not. Fitting assumes more batch never needs less
memory, which holds for the tensors' peak.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

MAX_RUNS = 16  # dry runs the confirmation may take


@dataclass
class BatchPoint:
    value: int
    peak: int
    need: int  # peak plus the headroom's top
    fits: bool  # sure to fit
    error: str = ""


@dataclass
class BatchFit:
    variable: str
    points: list[BatchPoint] = field(default_factory=list)
    slope: float = 0.0  # bytes per unit of batch, from the line
    intercept: float = 0.0
    guess: int | None = None  # the line's answer
    largest: int | None = None  # confirmed by dry runs; 0 when even 1 does not fit
    note: str = ""


def line_through(points: list[BatchPoint]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of need against batch."""
    xs = [float(p.value) for p in points]
    ys = [float(p.need) for p in points]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return my, 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def largest_batch(
    variable: str,
    values: list[int],
    capacity: int,
    run_at: Callable[[int], BatchPoint],
) -> BatchFit:
    """Dry runs at ``values``, the line, and the confirmed largest batch whose need fits in
    ``capacity`` (``run_at(v)`` is one dry run at batch ``v``)."""
    fit = BatchFit(variable)
    seen: dict[int, BatchPoint] = {}
    for v in sorted(set(values)):
        seen[v] = run_at(v)
    good = [p for p in seen.values() if not p.error]
    if len(good) >= 2:
        fit.intercept, fit.slope = line_through(good)
    if fit.slope > 0:
        fit.guess = max(1, int((capacity - fit.intercept) // fit.slope))
    fit.largest = _confirm(run_at, capacity, seen, fit.guess)
    fit.points = sorted(seen.values(), key=lambda p: p.value)
    if fit.largest is None:
        fit.note = f"not confirmed within {MAX_RUNS} more dry runs"
    return fit


def _fits(p: BatchPoint) -> bool:
    return p.fits and not p.error


def _confirm(
    run_at: Callable[[int], BatchPoint], capacity: int, seen: dict[int, BatchPoint], guess: int | None
) -> int | None:
    """The largest v that fits: each next dry run at the batch where the line through the two
    runs nearest the limit (one that fits, one that does not, when there are both) reaches
    ``capacity``, kept strictly between them (halving the gap when the line says nothing
    new), until a batch that fits sits next to one that does not."""
    for runs in range(MAX_RUNS + 1):
        fitting = [v for v, p in seen.items() if _fits(p)]
        lo = max(fitting, default=0)
        above = [v for v, p in seen.items() if not _fits(p) and v > lo]
        hi = min(above, default=None)
        if hi is not None and hi - lo <= 1:
            return lo
        if runs == MAX_RUNS:
            break
        nxt = _next_try(seen, lo, hi, capacity, guess)
        guess = None
        seen[nxt] = run_at(nxt)
    return None


def _next_try(seen: dict[int, BatchPoint], lo: int, hi: int | None, capacity: int, guess: int | None) -> int:
    if hi is None:  # nothing fails yet: the line's answer, or at least double
        target = guess if guess is not None and guess > lo else _secant(seen, lo, None, capacity)
        return max(lo + 1, target if target is not None else 2 * max(lo, 1))
    if lo == 0:
        low_guess = guess if guess is not None and 0 < guess < hi else None
        return low_guess or max(1, min(hi - 1, _secant(seen, None, hi, capacity) or hi // 2))
    target = guess if guess is not None and lo < guess < hi else _secant(seen, lo, hi, capacity)
    if target is None:
        return (lo + hi) // 2
    # The line's answer, kept strictly inside the bracket: at its edge, the neighbour of the
    # bracket's end decides (the line says the limit is right there).
    return min(hi - 1, max(lo + 1, target))


def _secant(seen: dict[int, BatchPoint], lo: int | None, hi: int | None, capacity: int) -> int | None:
    """Where the line through the two runs around the limit reaches ``capacity``."""
    usable = sorted((v, p.need) for v, p in seen.items() if not p.error and p.need > 0)
    if len(usable) < 2:
        return None
    if lo is not None and hi is not None and lo in seen and hi in seen and not seen[hi].error:
        (x0, y0), (x1, y1) = (lo, seen[lo].need), (hi, seen[hi].need)
    else:
        (x0, y0), (x1, y1) = usable[-2], usable[-1]
    if y1 == y0 or x1 == x0:
        return None
    slope = (y1 - y0) / (x1 - x0)
    if slope <= 0:
        return None
    return int(x0 + (capacity - y0) // slope)
