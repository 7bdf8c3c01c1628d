"""A model of CUDA's caching allocator, replayed over a dry run's allocations: how much it
would reserve, and so how much of the reserve is fragments no request could use.

The rules are c10/cuda/CUDACachingAllocator.cpp's defaults (torch 2.13,
https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp): every
block a multiple of 512 bytes; requests up to 1 MiB served from 2 MiB segments (the small
pool), requests under 10 MiB from 20 MiB segments, larger ones from a segment of their own
rounded up to 2 MiB (the large pool); a free block is taken best-fit within its pool and
split when what is left is at least 512 bytes (small) or more than 1 MiB (large); freed
blocks merge with free neighbours of the same segment; segments are never given back
(``empty_cache`` is not called).

What it leaves out: streams (blocks are per stream), ``expandable_segments`` (which avoids
this fragmentation), ``max_split_size_mb``, and the release of unused cached segments the
allocator tries before raising an out-of-memory error: it states how large the reserve
grows when nothing is given back, the upper end of the fragmentation a run can meet.

What depends on the card: nothing in the rules above. Block sizes, pools, segment sizes and
the splitting thresholds are constants of the allocator, not fractions of the card (the
fraction-of-the-card settings, ``garbage_collection_threshold`` and
``set_per_process_memory_fraction``, are off by default). The card enters at one moment
only: when a new segment does not fit in what the card has left, ``cudaMalloc`` fails and
the allocator frees its cached free segments and tries again (then raises). The model
leaves that moment out, so it reads no property of the card, and one replay of a run's
allocations is the replay for every card: ``%%memfit`` makes one per dry run, whatever the
number of cards it judges (it made one per card before, each the same). Where the card's
size could matter, it does not change a verdict: a card judged to fit holds the peak plus
this fragmentation plus every other line at its top, so the reserve, which only grows, never
reached the card's limit before the peak; a card judged not to fit is judged at the bottom
of the ranges, where this line is 0; only a verdict within the uncertainty could meet the
release, and its range already spans 0 to this figure.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

KB512 = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


@dataclass(eq=False)
class _Block:
    segment: int
    offset: int
    size: int
    free: bool
    # the segment's blocks in address order, linked as the allocator links them: a freed
    # block finds its neighbours without a search
    prev: _Block | None = field(default=None, repr=False)
    next: _Block | None = field(default=None, repr=False)


class _Pool:
    def __init__(self, small: bool) -> None:
        self.small = small
        self.free: list[tuple[int, int, int]] = []  # (size, segment, offset), sorted

    def take(self, size: int) -> tuple[int, int, int] | None:
        i = bisect.bisect_left(self.free, (size, -1, -1))
        if i == len(self.free):
            return None
        return self.free.pop(i)

    def put(self, block: _Block) -> None:
        bisect.insort(self.free, (block.size, block.segment, block.offset))

    def drop(self, block: _Block) -> None:
        i = bisect.bisect_left(self.free, (block.size, block.segment, block.offset))
        if i < len(self.free) and self.free[i] == (block.size, block.segment, block.offset):
            self.free.pop(i)


@dataclass
class AllocatorModel:
    """Replays allocations (key, +bytes) and frees (key, -bytes) in order. ``requested``:
    the bytes asked for (512-byte rounded: the tensors' peak a dry run counts);
    ``allocated``: the blocks handed out, which can be larger (a block whose remainder is
    too small to split is given whole, and counts as allocated, as in torch's statistics)."""

    reserved: int = 0
    allocated: int = 0
    requested: int = 0
    peak_reserved: int = 0
    peak_requested: int = 0
    reserved_at_peak: int = 0

    def __post_init__(self) -> None:
        self._pools = {True: _Pool(True), False: _Pool(False)}
        self._segments: list[dict[int, _Block]] = []  # offset -> block, per segment
        self._segment_small: list[bool] = []
        self._live: dict[int, _Block] = {}
        self._asked: dict[int, int] = {}

    def replay(self, trace: list[tuple[int, int]]) -> AllocatorModel:
        sizes: dict[int, int] = {}
        for key, delta in trace:
            # A storage resized in place (an out= variant) is a new block of its new size.
            size = sizes.get(key, 0) + delta
            if key in self._live:
                self.release(key)
            if size > 0:
                sizes[key] = size
                self.malloc(key, size)
            else:
                sizes.pop(key, None)
        return self

    def malloc(self, key: int, size: int) -> None:
        if size <= 0:
            return  # a zero-byte tensor takes no block
        size = -(-size // KB512) * KB512
        small = size <= SMALL_SIZE
        pool = self._pools[small]
        found = pool.take(size)
        if found is None:
            seg_size = SMALL_BUFFER if small else (LARGE_BUFFER if size < MIN_LARGE_ALLOC else -(-size // ROUND_LARGE) * ROUND_LARGE)
            seg = len(self._segments)
            self._segments.append({0: _Block(seg, 0, seg_size, True)})
            self._segment_small.append(small)
            self.reserved += seg_size
            self.peak_reserved = max(self.peak_reserved, self.reserved)
            found = (seg_size, seg, 0)
        block_size, seg, offset = found
        block = self._segments[seg][offset]
        rest = block_size - size
        if rest >= KB512 if small else rest > SMALL_SIZE:
            block.size = size
            tail = _Block(seg, offset + size, rest, True, block, block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            self._segments[seg][tail.offset] = tail
            pool.put(tail)
        block.free = False
        self._live[key] = block
        self._asked[key] = size
        self.allocated += block.size
        self.requested += size
        if self.requested > self.peak_requested:
            self.peak_requested = self.requested
            self.reserved_at_peak = self.reserved

    def release(self, key: int) -> None:
        block = self._live.pop(key, None)
        if block is None:
            return
        self.allocated -= block.size
        self.requested -= self._asked.pop(key)
        blocks = self._segments[block.segment]
        pool = self._pools[self._segment_small[block.segment]]
        block.free = True
        after = block.next
        if after is not None and after.free:
            pool.drop(after)
            del blocks[after.offset]
            block.size += after.size
            block.next = after.next
            if after.next is not None:
                after.next.prev = block
        before = block.prev
        if before is not None and before.free:
            pool.drop(before)
            del blocks[block.offset]
            before.size += block.size
            before.next = block.next
            if block.next is not None:
                block.next.prev = before
            block = before
        pool.put(block)

    @property
    def fragmentation(self) -> int:
        """Reserved beyond what was asked for, when the most was asked for: the tails of
        blocks given whole, and free blocks no request could use."""
        return max(0, self.reserved_at_peak - self.peak_requested)
