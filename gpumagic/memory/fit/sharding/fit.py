"""``%%memfit --gpus N --shard MODE``: each mode's peak on one rank at N GPUs, the cards it
fits then, and the smallest N at which it fits the card asked for. Everything comes from one recorded dry run
(:mod:`.record`) replayed per mode and N (:mod:`.replay`): a search over N costs replays,
not dry runs.

The need on a card is the rank's peak plus the headroom of a single-GPU run
(:mod:`gpumagic.memory.fit.headroom`: context, cuBLAS, the allocator's fragmentation taken as
the same share of the peak as in the cell's own run); the communication library's own
buffers (NCCL allocates outside PyTorch's allocator) are not in it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpumagic.memory.fit.headroom import FRAGMENTATION, HeadroomLine, needed, verdict
from gpumagic.memory.fit.sharding.modes import MODES, ZERO_REDUCE_BUCKET
from gpumagic.memory.fit.sharding.record import StepRecorder, StepTrace
from gpumagic.memory.fit.sharding.replay import RankPeak, Replayer

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "MAX_GPUS", "ShardFit", "ShardRow", "parse_modes", "shard_fit", "shard_table",
    "sharded",
]

MAX_GPUS = 16384  # the search for the smallest N stops here
SHARD_ALL = tuple(MODES)

Card = tuple[str, int, int]  # name, capacity, uncertainty
LinesFor = Callable[[Card], list[HeadroomLine]]  # the headroom of a single-GPU run on a card


@dataclass
class ShardRow:
    """One mode at N GPUs: the busiest rank's peak, its need with the headroom (figure,
    low, high), the verdict on the target card, the smallest card of the table that fits,
    and the smallest N that fits the target (None: none up to :data:`MAX_GPUS`, or the mode
    does not divide memory by N)."""

    mode: str
    what: str
    rank: RankPeak
    need: tuple[int, int, int]
    fits: bool | None = None
    smallest_card: str = ""
    smallest_gpus: int | None = None
    smallest_note: str = ""


@dataclass
class ShardFit:
    gpus: int
    rows: list[ShardRow] = field(default_factory=list)
    target: str = ""
    units: list[str] = field(default_factory=list)
    problem: str = ""  # why there is no answer
    assumptions: list[str] = field(default_factory=list)


def parse_modes(text: str) -> list[str]:
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if "all" in names:
        return list(SHARD_ALL)
    unknown = [n for n in names if n not in MODES]
    if unknown or not names:
        raise ValueError(f"unknown sharding mode {', '.join(unknown) or '(none)'}: choose from {', '.join(MODES)} or all")
    return list(dict.fromkeys(names))


def _need(rank: RankPeak, lines: list[HeadroomLine], base_peak: int) -> list[HeadroomLine]:
    """The single-GPU headroom with the fragmentation scaled to this rank's peak."""
    ratio = rank.peak / base_peak if base_peak > 0 else 1.0
    return [
        HeadroomLine(line.what, int(line.bytes * ratio), int(line.low * ratio), int(line.high * ratio), line.source, line.why)
        if line.what == FRAGMENTATION else line
        for line in lines
    ]


def _fits(rp: Replayer, mode: str, n: int, card: Card, lines_for: LinesFor, base_peak: int) -> bool | None:
    rank = rp.rank(mode, n)
    return verdict(rank.peak, _need(rank, lines_for(card), base_peak), card[1], card[2])


def useful_gpus(rp: Replayer, mode: str) -> int:
    """The most GPUs that still divide the largest parameter (FSDP: its rows; ZeRO: its
    elements), at most :data:`MAX_GPUS`. Beyond it a rank's share stops shrinking, and
    FSDP's padding (to N times the rounded-up rows) makes the gathered units grow with N."""
    specs = rp.trace.plan.params
    if not specs:
        return 1
    most = max((s.shape[0] if mode == "fsdp" else s.numel) for s in specs)
    return max(1, min(MAX_GPUS, most))


def smallest_gpus(rp: Replayer, mode: str, card: Card, lines_for: LinesFor, base_peak: int) -> tuple[int | None, str]:
    """The smallest N at which ``mode`` surely fits ``card`` (a binary search up to
    :func:`useful_gpus`, below which a rank's memory does not grow with N), and a note when
    there is none."""
    if _fits(rp, mode, 1, card, lines_for, base_peak) is True:
        return 1, ""
    if mode == "ddp":
        return None, "DDP holds everything on every rank: more GPUs do not make room"
    limit = useful_gpus(rp, mode)
    if limit <= 1 or _fits(rp, mode, limit, card, lines_for, base_peak) is not True:
        return None, f"not even at {limit:,} GPUs: what is not divided (activations, buffers) does not fit"
    lo, hi = 1, limit  # lo does not fit, hi fits
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits(rp, mode, mid, card, lines_for, base_peak) is True:
            hi = mid
        else:
            lo = mid
    return hi, ""


def shard_fit(
    trace: StepTrace | None,
    problem: str,
    gpus: int,
    modes: Sequence[str],
    target: Card | None,
    cards: Sequence[Card],
    lines_for: LinesFor,
    base_peak: int,
) -> ShardFit:
    """Each of ``modes`` at ``gpus`` (see the module docstring); ``cards``: the table, smallest
    first, for "the smallest card that fits"."""
    out = ShardFit(gpus, target=target[0] if target else "")
    if trace is None:
        out.problem = problem or "no recorded step to replay"
        return out
    rp = Replayer(trace)
    out.units = [u.name for u in trace.plan.units]
    out.assumptions = assumptions(trace)
    for mode in modes:
        rank = rp.rank(mode, gpus)
        lines = _need(rank, lines_for(target), base_peak) if target else []
        row = ShardRow(mode, MODES[mode].what, rank, needed(rank.peak, lines))
        if target is not None:
            row.fits = verdict(rank.peak, lines, target[1], target[2])
            row.smallest_gpus, row.smallest_note = smallest_gpus(rp, mode, target, lines_for, base_peak)
        row.smallest_card = next(
            (c[0] for c in cards if verdict(rank.peak, _need(rank, lines_for(c), base_peak), c[1], c[2]) is True), ""
        )
        out.rows.append(row)
    return out


def assumptions(trace: StepTrace) -> list[str]:
    """What the replay assumed, in words for the report."""
    units = trace.plan.units
    blocks = [u.name for u in units if not u.root]
    shown = ", ".join(blocks[:3]) + (f" and {len(blocks) - 3} more" if len(blocks) > 3 else "")
    return [
        "Each rank runs the cell's step as written (its batch is one rank's batch), and the busiest rank "
        "(rank 0, with the rounded-up share of each parameter) is the one shown.",
        (f"FSDP and ZeRO-3 units: {shown} (each repeated block), then the rest as the root {units[-1].name}; "
         "FSDP2's defaults (reshard after forward except the root, backward prefetch of one unit, one "
         "reduce-scatter input kept)." if blocks else
         f"FSDP and ZeRO-3: no repeated block found, the whole model {units[-1].name} is one unit."),
        "DDP: buckets of 25 MiB (the first 1 MiB), gradient_as_bucket_view=False. ZeRO: DeepSpeed's defaults "
        f"(reduce_bucket_size={ZERO_REDUCE_BUCKET:.0e} elements, contiguous_gradients, no overlap_comm); ZeRO-3 "
        "releases each unit after use (DeepSpeed's stage3_max_reuse_distance and stage3_max_live_parameters, "
        "1e9 elements by default, may keep more gathered).",
        "Not counted: the communication library's own buffers (NCCL allocates outside PyTorch's allocator), "
        "and mixed-precision policies the cell does not use (FSDP's MixedPrecisionPolicy).",
        *trace.problems,
    ]


def sharded(
    recorder: StepRecorder,
    shard: tuple[int, list[str]],
    target: Card | None,
    card_lines: LinesFor,
    base_peak: int,
) -> ShardFit:
    """``%%memfit --gpus N --shard MODES``'s answer from the recording run just made:
    ``target``: the card asked for (name, capacity, uncertainty); ``card_lines``: the
    single-GPU headroom on a card; ``base_peak``: the recording run's peak."""
    from gpumagic.cards import GPUS

    cached: dict[Card, list[HeadroomLine]] = {}

    def lines(card: Card) -> list[HeadroomLine]:
        if card not in cached:  # the search asks for the same cards many times
            cached[card] = card_lines(card)
        return cached[card]

    cards = [(g.name, g.cuda_bytes, g.uncertainty_bytes) for g in sorted(GPUS, key=lambda g: g.cuda_bytes)]
    gpus, modes = shard
    return shard_fit(recorder.finish(), recorder.problem, gpus, modes, target, cards, lines, base_peak)


def shard_table(shard: ShardFit | None) -> pd.DataFrame:
    """One row per mode (see :attr:`gpumagic.memory.fit.result.MemFit.shards`)."""
    import pandas as pd

    columns = ["mode", "gpus", "peak_bytes", "need_bytes", "parameters", "gradients", "optimizer_state",
               "buffers", "fits", "smallest_card", "smallest_gpus"]
    rows: list[dict[str, Any]] = []
    for row in shard.rows if shard is not None else []:
        rank = row.rank
        rows.append({
            "mode": row.mode, "gpus": rank.gpus, "peak_bytes": rank.peak, "need_bytes": row.need[0],
            **{k: rank.parts.get(k, 0) for k in ("parameters", "gradients", "optimizer_state")},
            "buffers": rank.categories.get("buffers", 0), "fits": row.fits,
            "smallest_card": row.smallest_card or None, "smallest_gpus": row.smallest_gpus,
        })
    return pd.DataFrame(rows, columns=columns)
