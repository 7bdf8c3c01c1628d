"""The ``%%memfit --gpus N --shard MODES`` part of the report: one row per mode (the busiest
rank's peak and what it holds, the verdict, the smallest card at N GPUs and the smallest N of
the card asked for), then what the sharding model assumed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumagic.render.html import PALETTE
from gpumagic.render.sections import Heading, Paragraph, Section
from gpumagic.render.table import Bar, Column, Table
from gpumagic.units import fmt_bytes

if TYPE_CHECKING:
    from gpumagic.memory.fit.sharding.fit import ShardFit, ShardRow

__all__ = ["shard_headline", "shard_sections"]

_VERDICT = {True: "fits", False: "does not fit", None: "within the uncertainty"}


def shard_headline(shard: ShardFit, row: ShardRow) -> str:
    """"fits on 4x A100 40GB with fsdp", or why there is no such N."""
    if shard.target:
        if row.smallest_gpus is not None:
            return f"fits on {row.smallest_gpus}x {shard.target} with {row.mode}"
        return f"does not fit on any number of {shard.target} with {row.mode}: {row.smallest_note}"
    if row.smallest_card:
        return f"at {shard.gpus} GPUs with {row.mode}: fits on {shard.gpus}x {row.smallest_card} (the smallest card that does)"
    return f"at {shard.gpus} GPUs with {row.mode}: fits on no card of the table"


def shard_sections(shard: ShardFit | None) -> list[Section]:
    if shard is None:
        return []
    head = Heading(f"Across {shard.gpus} GPUs", "one rank's peak per sharding mode (a replay of the dry run)")
    if shard.problem:
        return [head, Paragraph(f"no sharded prediction: {shard.problem}", "plain")]
    scale = max([r.rank.peak for r in shard.rows] + [1])
    columns = [
        Column("mode", "mode", align="left"),
        Column("peak per rank", lambda r: r.rank.peak, fmt_bytes, bar=Bar(scale, PALETTE["accent"])),
        Column("parameters", lambda r: r.rank.parts.get("parameters", 0), fmt_bytes),
        Column("gradients", lambda r: r.rank.parts.get("gradients", 0), fmt_bytes),
        Column("optimizer state", lambda r: r.rank.parts.get("optimizer_state", 0), fmt_bytes),
        Column("buffers at the peak", lambda r: r.rank.categories.get("buffers", 0), fmt_bytes),
        Column("needs", lambda r: r.need[0], fmt_bytes),
    ]
    if shard.target:
        columns.append(Column(f"on {shard.target}", lambda r: _VERDICT[r.fits], align="left"))
        columns.append(Column(f"smallest N of {shard.target}", lambda r: r.smallest_gpus or "none", align="left"))
    columns.append(Column(f"smallest card at {shard.gpus}", lambda r: r.smallest_card or "none", align="left"))
    table = Table(columns, shard.rows, highlight=lambda r: "hot" if r.fits is True else "")
    sections: list[Section] = [head, table]
    sections += [Paragraph(shard_headline(shard, row), "plain") for row in shard.rows]
    sections += [Paragraph(a, prefix="assumed: ") for a in shard.assumptions]
    return sections
